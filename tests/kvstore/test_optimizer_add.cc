// The "add an optimizer" recipe (docs/design.md), followed once: Signum (MXNet's
// signed momentum SGD, with its own hyper-parameter wd_lh) registered outside the
// library with RegisterUpdateRule, then run by a local store and by a dist_sync job
// (scheduler, 2 servers, 2 workers as threads of this process over 127.0.0.1: the
// configuration crosses the payload codec, the servers run the rule on their slices)
// against a reference written here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>
#include <vector>

#include "common/net.h"
#include "pskv/kvstore.h"
#include "pskv/update_rule.h"
#include "support/store_job.h"

using namespace pskv;

// ---------------------------------------------------------------- the rule (one file)

namespace {

// Signum (Bernstein et al.; MXNet's Signum): with g' = g + wd*w,
//   momentum > 0: m = momentum*m - (1-momentum)*g';  w = (1 - lr*wd_lh)*w + lr*sign(m)
//   momentum = 0:                                   w = (1 - lr*wd_lh)*w - lr*sign(g')
float Sign(float x) {
  return static_cast<float>((x > 0) - (x < 0));
}

void SignumUpdate(const OptimizerConfig& c, const UpdateStep& s, const float* grad, float* w,
                  float* const* slots, int64_t n) {
  const ScaledGrad G(c);
  const float lr = static_cast<float>(s.lr), wd = static_cast<float>(s.wd);
  const float decay = static_cast<float>(1 - s.lr * c.Param("wd_lh"));
  if (c.momentum > 0) {
    float* m = slots[0];
    const float mom = static_cast<float>(c.momentum);
    for (int64_t i = 0; i < n; ++i) {
      m[i] = mom * m[i] - (1 - mom) * (G(grad[i]) + wd * w[i]);
      w[i] = decay * w[i] + lr * Sign(m[i]);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) w[i] = decay * w[i] - lr * Sign(G(grad[i]) + wd * w[i]);
  }
}

void RegisterSignum() {
  static const bool registered = [] {
    RegisterUpdateRule("signum", {[](const OptimizerConfig& c) { return c.momentum > 0 ? 1 : 0; },
                                  SignumUpdate,
                                  nullptr,
                                  {{"wd_lh", 0.0, 0.0, std::numeric_limits<double>::infinity(),
                                    "decoupled weight decay (Loshchilov and Hutter)"}}});
    return true;
  }();
  (void)registered;
}

// ---------------------------------------------------------------- the test

constexpr int kWorkers = 2, kRounds = 4;
const std::vector<int64_t> kSizes = {40, 4};  // key 0 sliced over both servers

OptimizerConfig SignumConfig() {
  return OptimizerConfig::FromParams(
      "signum",
      {{"learning_rate", "0.25"}, {"momentum", "0.5"}, {"wd_lh", "0.5"}, {"wd", "0.125"}});
}

float Initial(int k, int64_t i) {
  return static_cast<float>(k + 1) - static_cast<float>(i % 3);
}
// The gradient one worker pushes in a round (small whole numbers: sums are exact).
float Grad(int rank, int round, int k, int64_t i) {
  return static_cast<float>((rank + 1) * ((i + round + k) % 5) - 2 * rank - 1);
}

// The weights after every round, key after key, by the formula above.
std::vector<float> Reference() {
  std::vector<std::vector<float>> w(kSizes.size()), m(kSizes.size());
  for (size_t k = 0; k < kSizes.size(); ++k)
    for (int64_t i = 0; i < kSizes[k]; ++i) {
      w[k].push_back(Initial(static_cast<int>(k), i));
      m[k].push_back(0);
    }
  const float lr = 0.25f, mom = 0.5f, wd = 0.125f, decay = 1 - 0.25f * 0.5f;
  std::vector<float> out;
  for (int round = 0; round < kRounds; ++round)
    for (size_t k = 0; k < kSizes.size(); ++k)
      for (int64_t i = 0; i < kSizes[k]; ++i) {
        float g = 0;
        for (int r = 0; r < kWorkers; ++r) g += Grad(r, round, static_cast<int>(k), i);
        float& mi = m[k][static_cast<size_t>(i)];
        float& wi = w[k][static_cast<size_t>(i)];
        mi = mom * mi - (1 - mom) * (g + wd * wi);
        wi = decay * wi + lr * Sign(mi);
        out.push_back(wi);
      }
  return out;
}

NDArray Initial(int k) {
  NDArray a({kSizes[static_cast<size_t>(k)]});
  for (int64_t i = 0; i < a.size(); ++i) a.data<float>()[i] = Initial(k, i);
  return a;
}

}  // namespace

TEST(OptimizerAdd, RegisteredRuleRunsInALocalStore) {
  RegisterSignum();
  auto kv = KVStore::Create("local");
  kv->SetOptimizer(SignumConfig());
  for (int k = 0; k < 2; ++k) kv->Init(k, Initial(k));
  std::vector<float> pulled;
  for (int round = 0; round < kRounds; ++round)
    for (int k = 0; k < 2; ++k) {
      // One value per "worker": the local store sums them, then runs the rule.
      std::vector<NDArray> grads;
      for (int r = 0; r < kWorkers; ++r) {
        NDArray g({kSizes[static_cast<size_t>(k)]});
        for (int64_t i = 0; i < g.size(); ++i) g.data<float>()[i] = Grad(r, round, k, i);
        grads.push_back(g);
      }
      kv->Push(k, grads);
      NDArray out({kSizes[static_cast<size_t>(k)]});
      kv->Pull(k, {out});
      kv->WaitAll();
      for (int64_t i = 0; i < out.size(); ++i) pulled.push_back(out.data<float>()[i]);
    }
  EXPECT_EQ(pulled, Reference());
  // The rule's parameter is part of the configuration a states file keeps.
  const std::string file = testing::TempDir() + "/pskv_optimizer_add.states";
  kv->SaveOptimizerStates(file, /*dump_optimizer=*/true);
  auto saved = ReadDumpedOptimizerConfig(file);
  std::remove(file.c_str());
  ASSERT_TRUE(saved.has_value());
  EXPECT_EQ(saved->type, "signum");
  EXPECT_EQ(saved->Param("wd_lh"), 0.5);
}

TEST(OptimizerAdd, RegisteredRuleRunsInADistSyncJob) {
  RegisterSignum();
  Options o = StoreJobOptions(2, kWorkers);
  o.bigarray_bound = 16;
  std::vector<std::vector<float>> pulled(kWorkers);
  RunStoreJob(o, [&](int w, const Options& x) {
    auto kv = KVStore::Create("dist_sync", x);
    const int r = kv->Rank();
    kv->SetOptimizer(SignumConfig());  // rank 0 ships it to the servers
    for (int k = 0; k < 2; ++k) kv->Init(k, Initial(k));
    for (int round = 0; round < kRounds; ++round) {
      std::vector<int> keys = {0, 1};
      std::vector<NDArray> grads, outs;
      for (int k = 0; k < 2; ++k) {
        NDArray g({kSizes[static_cast<size_t>(k)]});
        for (int64_t i = 0; i < g.size(); ++i) g.data<float>()[i] = Grad(r, round, k, i);
        grads.push_back(g);
        outs.push_back(NDArray({kSizes[static_cast<size_t>(k)]}));
      }
      kv->Push(keys, grads);
      kv->Pull(keys, outs);
      kv->WaitAll();
      for (auto& a : outs)
        for (int64_t i = 0; i < a.size(); ++i)
          pulled[static_cast<size_t>(w)].push_back(a.data<float>()[i]);
    }
    kv->Barrier();
  });
  const std::vector<float> want = Reference();
  EXPECT_EQ(pulled[0], want);
  EXPECT_EQ(pulled[1], want);
}
