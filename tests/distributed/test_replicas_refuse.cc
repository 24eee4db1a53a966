// What replicated servers (PSKV_REPLICAS > 0) do not copy to their replicas yet is
// refused with a UsageError naming PSKV_REPLICAS, never run with replicas that would
// diverge (docs/fault-tolerance.md): row_sparse pushes in dist_async.
// Scheduler, 2 servers and 2 workers as threads of this process.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>

#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/row_sparse.h"
#include "support/store_job.h"

using namespace pskv;

namespace {

constexpr int kWorkers = 2;

Options Replicated() {
  Options o = StoreJobOptions(2, kWorkers);
  o.replicas = 1;
  return o;
}

template <class F>
std::string UsageMessage(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a UsageError: ") + e.what();
  }
  return "no error";
}

}  // namespace

// dist_async is replicated (every push copied before it is answered; kill tests in
// tests/distributed/test_failover_async.cc): it is not refused, and its pushes apply.
TEST(ReplicasRefuse, AsyncModeIsReplicatedNotRefused) {
  RunStoreJob(Replicated(), [](int, const Options& x) {
    auto kv = KVStore::Create("dist_async", x);
    OptimizerConfig sgd;
    sgd.type = "sgd";
    sgd.learning_rate = 1.0;
    kv->SetOptimizer(sgd);
    NDArray w({8});
    w.Fill(0.0f);
    kv->Init(0, w);
    kv->Barrier();
    NDArray g({8});
    g.Fill(1.0f);
    kv->Push(0, {g});
    kv->WaitAll();
    kv->Barrier();
    kv->Pull(0, {w});
    kv->WaitAll();
    EXPECT_EQ(w.data<float>()[7], -1.0f * kWorkers);
  });
}

namespace {

// Dense keys work; the refused call is each job's last (the refusal may break the store).
void DenseRoundThen(const Options& x, const std::function<void(KVStore&)>& last) {
  auto kv = KVStore::Create("dist_sync", x);
  OptimizerConfig sgd;
  sgd.type = "sgd";
  sgd.learning_rate = 0.1;
  kv->SetOptimizer(sgd);
  NDArray w({8});
  w.Fill(1.0f);
  kv->Init(0, w);
  NDArray g({8});
  g.Fill(1.0f);
  kv->PushPull(0, {g}, {w});
  kv->WaitAll();
  EXPECT_FLOAT_EQ(w.data<float>()[0], 1.0f - 0.1f * kWorkers);
  last(*kv);
}

}  // namespace

// row_sparse keys are replicated in dist_sync (kill tests in
// tests/distributed/test_failover_sparse.cc); their async pushes are not copied yet.
TEST(ReplicasRefuse, RowSparseAsyncPushesAreRefused) {
  RunStoreJob(Replicated(), [](int, const Options& x) {
    auto kv = KVStore::Create("dist_async", x);
    OptimizerConfig sgd;
    sgd.type = "sgd";
    sgd.learning_rate = 1.0;
    kv->SetOptimizer(sgd);
    NDArray rows({4, 2});
    rows.Fill(0.0f);
    kv->Init(1, RowSparseNDArray::FromDense(rows));  // forwarded to the replica: not refused
    kv->Barrier();
    rows.Fill(1.0f);
    const std::string what = UsageMessage([&] {
      kv->Push(1, {RowSparseNDArray::FromDense(rows)});
      kv->WaitAll();
    });
    EXPECT_NE(what.find("row_sparse pushes in dist_async with PSKV_REPLICAS"), std::string::npos)
        << what;
  });
}

// Loading optimizer states is replicated (every copy of a range loads them; kill
// tests in tests/distributed/test_failover_states.cc): not refused.
TEST(ReplicasRefuse, LoadingOptimizerStatesIsReplicatedNotRefused) {
  const std::string states = ::testing::TempDir() + "/replicas_refuse.states";
  RunStoreJob(Replicated(), [&](int, const Options& x) {
    DenseRoundThen(x, [&](KVStore& kv) {
      kv.SaveOptimizerStates(states);  // rank 0 writes
      kv.Barrier();
      kv.LoadOptimizerStates(states);  // rank 0 alone loads
      kv.WaitAll();
      kv.Barrier();
    });
  });
  std::remove(states.c_str());
}
