// A dist_async counting job for the failover tests (tests/distributed/test_failover_async.cc):
// every worker pushes known integer-valued gradients (exact in float32) to a small
// key, a big key sliced over every server (and cut into wire chunks) and a fused pair
// of small keys, under SGD at learning rate 1 (w -= g), so the final weights are
// exactly minus the sum of every push: a push applied twice or lost changes them.
//
//   async_count_worker PUSHES OUT_DIR
//
// After push p it creates OUT_DIR/w<rank>.p<p> (the test kills a server at a chosen
// push); odd pushes are push-pulls, even ones plain pushes. After its last push it
// waits for every worker (Barrier), pulls every key and writes their values to
// OUT_DIR/w<rank>.weights, and each push's time in ms, one per line, to
// OUT_DIR/w<rank>.times. AsyncCountGrad is the gradient the test sums.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "async_count.h"
#include "failover_job_io.h"
#include "pskv/kvstore.h"

using namespace pskv;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: async_count_worker PUSHES OUT_DIR\n");
    return 2;
  }
  const int pushes = std::atoi(argv[1]);
  const std::string out = argv[2];
  try {
    auto kv = KVStore::Create("dist_async");
    const int rank = kv->Rank();
    failover_job::Steps steps(out + "/w" + std::to_string(rank));
    const auto& keys = async_count::kKeys;
    const auto& sizes = async_count::kSizes;
    for (size_t k = 0; k < keys.size(); ++k) {
      NDArray zero({sizes[k]});
      zero.Fill(0.0f);
      kv->Init(keys[k], zero);
    }
    kv->SetOptimizer(OptimizerConfig::FromParams("sgd", {{"learning_rate", "1"}}));
    kv->Barrier();  // every worker's optimizer is set before anyone pushes
    std::vector<NDArray> w;
    for (auto n : sizes) w.emplace_back(std::vector<int64_t>{n});
    for (int p = 1; p <= pushes; ++p) {
      steps.Begin();
      std::vector<NDArray> g;
      for (size_t k = 0; k < keys.size(); ++k) {
        NDArray a({sizes[k]});
        for (int64_t i = 0; i < sizes[k]; ++i)
          a.data<float>()[i] = async_count::Grad(rank, p, keys[k], i);
        g.push_back(std::move(a));
      }
      if (p % 2)
        kv->PushPull(keys, g, keys, w);
      else
        kv->Push(keys, g);
      kv->WaitAll();
      steps.End("p", p);
    }
    kv->Barrier();  // every worker's pushes were answered
    kv->Pull(keys, w);
    kv->WaitAll();
    steps.Write(w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "async_count_worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
