// A dist_sync training loop for the failover tests (tests/test_failover.cc): Adam with
// weight decay and a step schedule on a small key, a big key sliced over every server
// (and cut into wire chunks) and a fused pair of small keys; gradients are a function of
// (rank, round, key), so an undisturbed job gives the same bits every time.
//
//   failover_worker [--barriers] [--late-barrier R] [--pace MS] ROUNDS OUT_DIR
//
// --barriers: every round starts with a Barrier() (two command fan-outs to every
// server around the scheduler's barrier), so that kills land amid commands too.
// --late-barrier R (with --barriers): in round R, rank 0 creates OUT_DIR/w0.b<R> as it
// enters the Barrier and rank 1 enters it 1.5 s later, so that a kill lands inside it.
// --pace MS: every round starts with a sleep of MS ms (a job long enough for a test's
// disturbance to play out while it runs).
//
// After the Init of its k-th key it creates OUT_DIR/w<rank>.i<k>, after round r
// OUT_DIR/w<rank>.r<r> (the test kills a server at a chosen point); odd rounds
// push-pull, even rounds push then pull, so kills land in both. At the end it writes
// every key's final value to OUT_DIR/w<rank>.weights and each round's time in ms, one
// per line, to OUT_DIR/w<rank>.times.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "failover_job_io.h"
#include "pskv/kvstore.h"

using namespace pskv;
using namespace failover_job;

namespace {

NDArray Fill(int64_t n, float v) {
  NDArray a({n});
  for (int64_t i = 0; i < n; ++i) a.data<float>()[i] = v + 0.01f * static_cast<float>(i % 5);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const bool barriers = argc > 1 && std::string(argv[1]) == "--barriers";
  if (barriers) {
    --argc;
    ++argv;
  }
  int late_round = 0;
  if (argc > 2 && std::string(argv[1]) == "--late-barrier") {
    late_round = std::atoi(argv[2]);
    argc -= 2;
    argv += 2;
  }
  int pace_ms = 0;
  if (argc > 2 && std::string(argv[1]) == "--pace") {
    pace_ms = std::atoi(argv[2]);
    argc -= 2;
    argv += 2;
  }
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: failover_worker [--barriers] [--late-barrier R] [--pace MS] ROUNDS "
                 "OUT_DIR\n");
    return 2;
  }
  const int rounds = std::atoi(argv[1]);
  const std::string out = argv[2];
  try {
    auto kv = KVStore::Create("dist_sync");
    const int rank = kv->Rank();
    Steps steps(out + "/w" + std::to_string(rank));
    const std::vector<int> keys = {3, 5, 7, 9};
    const std::vector<int64_t> sizes = {100, 300000, 8, 8};  // key 5: sliced and chunked
    for (size_t k = 0; k < keys.size(); ++k) {
      kv->Init(keys[k], Fill(sizes[k], 0.5f));
      Touch(steps.me() + ".i" + std::to_string(k));
    }
    kv->SetOptimizer(TrainingOptimizer());
    std::vector<NDArray> w;
    for (auto n : sizes) w.emplace_back(std::vector<int64_t>{n});
    for (int r = 1; r <= rounds; ++r) {
      if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
      steps.Begin();
      if (barriers && r == late_round && rank == 0) Touch(steps.me() + ".b" + std::to_string(r));
      if (barriers && r == late_round && rank == 1)
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      if (barriers) kv->Barrier();
      std::vector<NDArray> g;
      for (size_t k = 0; k < keys.size(); ++k) g.push_back(DenseGrad(sizes[k], rank, r, keys[k]));
      if (r % 2) {
        kv->PushPull(keys, g, keys, w);
      } else {
        kv->Push(keys, g);
        kv->Pull(keys, w);
      }
      kv->WaitAll();
      steps.End("r", r);
    }
    steps.Write(w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failover_worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
