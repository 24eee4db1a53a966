// Checkpoints across job sizes (docs/fault-tolerance.md, "Checkpoints across sizes"):
// a dist_sync job with 2 servers trains k steps, saves its weights (pulled) and its
// optimizer states; jobs with 3, 1 and 2 servers and a local store load them and train
// m more steps. Each must end with weights bitwise-equal to the 2-server job trained
// k + m steps without a break.
//
// The model has every kind of state a server holds: a big key sliced over the servers
// and cut into wire chunks, small keys, a float16 key with a float32 master copy
// (multi_precision), a row_sparse table sliced by row ranges; Adam with weight decay
// and a learning-rate schedule (the update count matters). Gradients are multiples of
// 1/16 small enough that every sum is exact in float16 and float32, so the sum order
// of the local store and of the servers cannot differ. Nodes are threads of this
// process (scheduler, servers, 2 workers over 127.0.0.1).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>
#include <vector>

#include "common/net.h"
#include "kvstore/distributed/worker/states_transfer.h"
#include "kvstore/states_file.h"
#include "pskv/kvstore.h"
#include "pskv/row_sparse.h"
#include "support/store_job.h"

using namespace pskv;

namespace {

constexpr int kWorkers = 2, kSteps = 3, kMore = 3;
constexpr int kSparse = 4;
constexpr int64_t kBound = 64, kChunkBytes = 512;
struct KeySpec {
  Shape shape;
  DType dtype;
};
// Key 0 sliced and chunked, 1 and 2 small, 3 float16 sliced, 4 row_sparse sliced.
const std::vector<KeySpec> kKeys = {{{50, 20}, DType::kFloat32},
                                    {{7}, DType::kFloat32},
                                    {{5}, DType::kFloat32},
                                    {{300}, DType::kFloat16},
                                    {{40, 8}, DType::kFloat32}};

OptimizerConfig Adam() {
  return OptimizerConfig::FromParams("adam", {{"learning_rate", "0.01"},
                                              {"wd", "0.001"},
                                              {"multi_precision", "1"},
                                              {"lr_scheduler", "factor"},
                                              {"lr_step", "2"},
                                              {"lr_factor", "0.5"}});
}

float GradValue(int step, int rank, int key, int64_t i) {
  return static_cast<float>((i * 7 + step * 3 + rank * 5 + key) % 17 - 8) * 0.0625f;
}

NDArray DenseGrad(int step, int rank, int key) {
  const KeySpec& k = kKeys[static_cast<size_t>(key)];
  NDArray g(k.shape);
  for (int64_t i = 0; i < g.size(); ++i) g.data<float>()[i] = GradValue(step, rank, key, i);
  return k.dtype == DType::kFloat32 ? g : g.AsType(k.dtype);
}

// Rows (row + step + rank) % 3 == 0 of the row_sparse key.
RowSparseNDArray SparseGrad(int step, int rank) {
  const Shape& s = kKeys[kSparse].shape;
  std::vector<float> ids, vals;
  for (int64_t r = 0; r < s[0]; ++r) {
    if ((r + step + rank) % 3) continue;
    ids.push_back(static_cast<float>(r));
    for (int64_t j = 0; j < s[1]; ++j) vals.push_back(GradValue(step, rank, kSparse, r * s[1] + j));
  }
  NDArray id = NDArray::FromVector(ids).AsType(DType::kInt64);
  NDArray rows = NDArray::FromVector(vals).Reshape({static_cast<int64_t>(ids.size()), s[1]});
  return RowSparseNDArray::FromRows(s, id, rows);
}

NDArray InitialValue(int key) {
  const KeySpec& k = kKeys[static_cast<size_t>(key)];
  NDArray a(k.shape);
  for (int64_t i = 0; i < a.size(); ++i) a.data<float>()[i] = 0.5f + 0.001f * static_cast<float>(i);
  return k.dtype == DType::kFloat32 ? a : a.AsType(k.dtype);
}

using Weights = std::vector<NDArray>;

void InitAll(KVStore& kv, const Weights& w) {
  for (int k = 0; k < static_cast<int>(kKeys.size()); ++k)
    if (k == kSparse)
      kv.Init(k, RowSparseNDArray::FromDense(w[static_cast<size_t>(k)]));
    else
      kv.Init(k, w[static_cast<size_t>(k)]);
}

Weights PullAll(KVStore& kv) {
  Weights out;
  for (int k = 0; k < static_cast<int>(kKeys.size()); ++k) {
    const KeySpec& s = kKeys[static_cast<size_t>(k)];
    if (k == kSparse) {
      RowSparseNDArray r(s.shape, s.dtype);
      std::vector<float> all;
      for (int64_t i = 0; i < s.shape[0]; ++i) all.push_back(static_cast<float>(i));
      kv.RowSparsePull(k, {r}, {NDArray::FromVector(all).AsType(DType::kInt64)});
      kv.WaitAll();
      out.push_back(r.ToDense());
    } else {
      NDArray a(s.shape, s.dtype);
      kv.Pull(k, {a});
      kv.WaitAll();
      out.push_back(a);
    }
  }
  return out;
}

// Steps [from, to) of every worker (`ranks` of them pushed by this store: one for a
// worker of a dist job, all for a local store).
void Train(KVStore& kv, const std::vector<int>& ranks, int from, int to) {
  for (int step = from; step < to; ++step) {
    for (int k = 0; k < static_cast<int>(kKeys.size()); ++k) {
      if (k == kSparse) {
        std::vector<RowSparseNDArray> g;
        for (int r : ranks) g.push_back(SparseGrad(step, r));
        kv.Push(k, g);
      } else {
        std::vector<NDArray> g;
        for (int r : ranks) g.push_back(DenseGrad(step, r, k));
        kv.Push(k, g);
      }
    }
    kv.WaitAll();
  }
}

// Runs a dist_sync job of `servers` servers; `body` runs on each worker's store.
void RunDistJob(int servers, const std::function<void(KVStore&)>& body) {
  Options o = StoreJobOptions(servers, kWorkers);
  o.bigarray_bound = kBound;
  o.wire_chunk_bytes = kChunkBytes;  // key 0's slices travel in several chunks
  RunStoreJob(o, [&](int, const Options& x) {
    std::unique_ptr<KVStore> kv = KVStore::Create("dist_sync", x);
    body(*kv);
    kv->Barrier();
  });
}

Weights Initial() {
  Weights w;
  for (int k = 0; k < static_cast<int>(kKeys.size()); ++k) w.push_back(InitialValue(k));
  return w;
}

// The weights of rank 0 after `body` (it pulls them into `out`).
Weights RunAndPull(int servers, const std::function<void(KVStore&, Weights*)>& body) {
  Weights out;
  std::mutex mu;
  RunDistJob(servers, [&](KVStore& kv) {
    Weights w;
    body(kv, &w);
    if (kv.Rank() == 0) {
      std::lock_guard<std::mutex> lk(mu);
      out = std::move(w);
    }
  });
  return out;
}

void ExpectBitwiseEqual(const Weights& a, const Weights& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].nbytes(), b[k].nbytes()) << what << ", key " << k;
    EXPECT_EQ(std::memcmp(a[k].raw(), b[k].raw(), a[k].nbytes()), 0) << what << ", key " << k;
  }
}

std::string TempPath(const std::string& tag) {
  return (std::filesystem::temp_directory_path() /
          ("pskv_resize_" + tag + "_" + std::to_string(::getpid())))
      .string();
}

// The file the per-server format ("PSKVDST2") held for the same states saved by
// `servers` servers: each server's blob, as its optimizer wrote it.
std::string PerServerFile(const std::string& whole_file, int servers) {
  const std::string whole = states::ReadStatesFile(whole_file);
  std::vector<std::unique_ptr<dist::KeyMeta>> metas;
  std::vector<const dist::KeyMeta*> ptrs;
  for (int k = 0; k < static_cast<int>(kKeys.size()); ++k) {
    auto m = std::make_unique<dist::KeyMeta>();
    const KeySpec& s = kKeys[static_cast<size_t>(k)];
    m->key = k;
    m->dtype = s.dtype;
    m->size = NumElements(s.shape);
    if (k == kSparse) {
      m->sparse = true;
      m->rows = s.shape[0];
      m->row_size = s.shape[1];
      dist::PlaceRowSparse(m.get(), 0, servers, kBound);
    } else {
      dist::PlaceDense(m.get(), 0, servers, kBound, {}, kChunkBytes, {});
    }
    ptrs.push_back(m.get());
    metas.push_back(std::move(m));
  }
  std::string blobs;
  const auto sizes = states::SplitWholeKeys(states::IndexBlob(whole), dist::LayoutOf(ptrs, servers),
                                            servers, &blobs);
  return states::EncodeDistHeader(sizes) + blobs;
}

}  // namespace

TEST(StatesResize, TwoServersStatesContinueOnThreeOneTwoServersAndLocally) {
  const Weights reference = RunAndPull(2, [](KVStore& kv, Weights* w) {
    kv.SetOptimizer(Adam());
    InitAll(kv, Initial());
    Train(kv, {kv.Rank()}, 0, kSteps + kMore);
    *w = PullAll(kv);
  });
  const std::string file = TempPath("states");
  const Weights saved = RunAndPull(2, [&](KVStore& kv, Weights* w) {
    kv.SetOptimizer(Adam());
    InitAll(kv, Initial());
    Train(kv, {kv.Rank()}, 0, kSteps);
    *w = PullAll(kv);
    kv.SaveOptimizerStates(file);
  });
  ASSERT_EQ(saved.size(), kKeys.size());
  // The per-server format of older versions loads too: as it is with 2 servers,
  // re-sliced from the 2-server placement otherwise.
  const std::string old_file = TempPath("old");
  {
    std::ofstream out(old_file, std::ios::binary | std::ios::trunc);
    const std::string bytes = PerServerFile(file, 2);
    ASSERT_EQ(bytes.substr(0, 8), "PSKVDST2");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  for (const std::string& f : {file, old_file})
    for (int servers : {3, 1, 2}) {
      const Weights resumed = RunAndPull(servers, [&](KVStore& kv, Weights* w) {
        kv.SetOptimizer(Adam());
        InitAll(kv, saved);
        kv.LoadOptimizerStates(f);
        kv.Barrier();  // rank 0 loads; nobody pushes before it is done
        Train(kv, {kv.Rank()}, kSteps, kSteps + kMore);
        *w = PullAll(kv);
      });
      ExpectBitwiseEqual(
          resumed, reference,
          std::to_string(servers) + " servers, " + (f == file ? "PSKVDST3" : "PSKVDST2"));
    }
  std::filesystem::remove(old_file);
  auto local = KVStore::Create("local");
  local->SetOptimizer(Adam());
  InitAll(*local, saved);
  local->LoadOptimizerStates(file);
  std::vector<int> all;
  for (int r = 0; r < kWorkers; ++r) all.push_back(r);
  Train(*local, all, kSteps, kSteps + kMore);
  ExpectBitwiseEqual(PullAll(*local), reference, "a local store");
  std::filesystem::remove(file);
}
