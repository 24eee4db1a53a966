// The "add a store type" recipe (docs/design.md), followed once: a dist store variant
// built from the reusable worker core (dist::DistWorkerStore) with its own local
// reducer, run against real nodes (scheduler, 2 servers, 2 workers as threads of this
// process over 127.0.0.1), gives the same results as the normal dist_sync store.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/net.h"
#include "kvstore/distributed/worker/store.h"
#include "pskv/kvstore.h"
#include "support/store_job.h"

using namespace pskv;

namespace {

// Sums element by element from the last value to the first: another order and loop
// than CpuLocalReducer's grouped passes, the same sums for the small integers below.
class CountingReducer : public dist::LocalReducer {
 public:
  explicit CountingReducer(std::atomic<int>* calls) : calls_(calls) {}
  NDArray Reduce(const std::vector<NDArray>& vals, NDArray* merge) override {
    ++*calls_;
    if (merge->empty()) *merge = NDArray(vals[0].shape(), vals[0].dtype());
    float* out = merge->data<float>();
    for (int64_t i = 0; i < merge->size(); ++i) {
      float s = 0;
      for (size_t j = vals.size(); j-- > 0;) s += vals[j].data<float>()[i];
      out[i] = s;
    }
    return *merge;
  }

 private:
  std::atomic<int>* calls_;
};

using Factory = std::function<std::unique_ptr<KVStore>(const Options&)>;

constexpr int kWorkers = 2, kRounds = 3;
const std::vector<int64_t> kSizes = {40, 4, 4};  // key 0 sliced over both servers; 1, 2 fused

NDArray Filled(int64_t n, float v) {
  NDArray a({n});
  a.Fill(v);
  for (int64_t i = 0; i < n; ++i) a.data<float>()[i] += static_cast<float>(i % 5);
  return a;
}

// Runs a job whose workers use stores made by `make`; returns each worker's pulled
// values, round after round, key after key.
std::vector<std::vector<float>> RunJob(const Factory& make) {
  Options o = StoreJobOptions(2, kWorkers);
  o.bigarray_bound = 16;
  std::vector<std::vector<float>> pulled(kWorkers);
  RunStoreJob(o, [&](int w, const Options& x) {
    std::unique_ptr<KVStore> kv = make(x);
    const int r = kv->Rank();
    for (int k = 0; k < 3; ++k) kv->Init(k, Filled(kSizes[static_cast<size_t>(k)], 0));
    for (int round = 0; round < kRounds; ++round) {
      // Three values per key: the local reduce runs for every key.
      std::vector<int> keys;
      std::vector<NDArray> vals, outs;
      for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 3; ++j) {
          keys.push_back(k);
          vals.push_back(Filled(kSizes[static_cast<size_t>(k)],
                                static_cast<float>((r + 1) * (j + 1) + round + k)));
        }
      std::vector<int> out_keys = {0, 1, 2};
      for (int k = 0; k < 3; ++k) outs.push_back(NDArray({kSizes[static_cast<size_t>(k)]}));
      if (round == 1) {
        kv->PushPull(keys, vals, out_keys, outs);
      } else {
        kv->Push(keys, vals);
        kv->Pull(out_keys, outs);
      }
      kv->WaitAll();
      for (auto& a : outs)
        for (int64_t i = 0; i < a.size(); ++i)
          pulled[static_cast<size_t>(w)].push_back(a.data<float>()[i]);
    }
    kv->Barrier();
  });
  return pulled;
}

}  // namespace

TEST(StoreType, VariantWithItsOwnLocalReducerMatchesTheDistStore) {
  const auto normal = RunJob([](const Options& x) { return KVStore::Create("dist_sync", x); });
  std::atomic<int> calls{0};
  const auto variant = RunJob([&calls](const Options& x) {
    return std::make_unique<dist::DistWorkerStore>("dist_sync", x,
                                                   std::make_unique<CountingReducer>(&calls));
  });
  // Every push reduced 3 values per key: 3 keys, 3 rounds, 2 workers.
  EXPECT_EQ(calls.load(), 3 * kRounds * kWorkers);
  ASSERT_EQ(normal.size(), static_cast<size_t>(kWorkers));
  EXPECT_EQ(variant, normal);
  // And the values are the sums over workers and values (no optimizer: the stored
  // value becomes each round's sum).
  size_t at = 0;
  for (int round = 0; round < kRounds; ++round)
    for (int k = 0; k < 3; ++k)
      for (int64_t i = 0; i < kSizes[static_cast<size_t>(k)]; ++i, ++at) {
        float want = 0;
        for (int r = 0; r < kWorkers; ++r)
          for (int j = 0; j < 3; ++j)
            want += static_cast<float>((r + 1) * (j + 1) + round + k + i % 5);
        ASSERT_EQ(normal[0][at], want) << "round " << round << " key " << k << " element " << i;
        ASSERT_EQ(normal[1][at], want);
      }
}
