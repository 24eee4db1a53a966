// A dist_sync job that loads and saves optimizer states, for the failover tests
// (tests/distributed/test_failover_states.cc): Adam with weight decay and a step schedule on
// a small key and a key sliced over every server (cut into wire chunks); gradients
// are a function of (rank, round, key), so an undisturbed job gives the same bits.
//
//   states_failover_worker ROUNDS FIRST_ROUND [FROM_DIR] OUT_DIR
//
// With FROM_DIR the keys start from FROM_DIR/w0.weights and rank 0 loads
// FROM_DIR/states before the first round. After each round rank 0 saves the states
// to OUT_DIR/states (again, up to 50 times, if a save fails); every worker creates
// OUT_DIR/w<rank>.s<r> before the save and OUT_DIR/w<rank>.r<r> after it. At the end:
// OUT_DIR/w<rank>.weights (final values) and OUT_DIR/w<rank>.times (each round's ms, the save
// included).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "failover_job_io.h"
#include "pskv/kvstore.h"

using namespace pskv;
using namespace failover_job;

namespace {

const std::vector<int> kKeys = {3, 5};
const std::vector<int64_t> kSizes = {100, 300000};  // key 5: sliced and chunked

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: states_failover_worker ROUNDS FIRST_ROUND [FROM_DIR] OUT_DIR\n");
    return 2;
  }
  const int rounds = std::atoi(argv[1]);
  const int first = std::atoi(argv[2]);
  const std::string from = argc > 4 ? argv[3] : "";
  const std::string out = argv[argc - 1];
  try {
    auto kv = KVStore::Create("dist_sync");
    const int rank = kv->Rank();
    Steps steps(out + "/w" + std::to_string(rank));
    std::vector<NDArray> w;
    for (auto n : kSizes) {
      NDArray a({n});
      a.Fill(0.5f);
      w.push_back(a);
    }
    if (!from.empty()) {
      std::ifstream f(from + "/w0.weights", std::ios::binary);
      for (auto& a : w) f.read(static_cast<char*>(a.raw()), static_cast<long>(a.nbytes()));
      if (!f) throw IOError("cannot read " + from + "/w0.weights");
    }
    for (size_t k = 0; k < kKeys.size(); ++k) kv->Init(kKeys[k], w[k]);
    kv->SetOptimizer(TrainingOptimizer());
    if (!from.empty()) kv->LoadOptimizerStates(from + "/states");  // rank 0 loads
    kv->Barrier();
    for (int r = first; r < first + rounds; ++r) {
      steps.Begin();
      std::vector<NDArray> g;
      for (size_t k = 0; k < kKeys.size(); ++k)
        g.push_back(DenseGrad(kSizes[k], rank, r, kKeys[k]));
      kv->PushPull(kKeys, g, kKeys, w);
      kv->WaitAll();
      Touch(steps.me() + ".s" + std::to_string(r));  // saving round r's states
      for (int attempt = 1;; ++attempt) {
        try {
          kv->SaveOptimizerStates(out + "/states");  // rank 0 writes
          break;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "states_failover_worker: save %d failed: %s\n", attempt, e.what());
          if (attempt == 50) throw;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
      steps.End("r", r);
    }
    steps.Write(w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "states_failover_worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
