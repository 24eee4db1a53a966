// pskv-bench replicas: what replicated servers cost in steady state
// (docs/fault-tolerance.md, "Replicated servers"; docs/performance.md). A dist_sync
// job of W workers x S servers as real processes started by pskv-launch (TCP on
// 127.0.0.1), dense float32 keys, SGD on the servers (update_on_kvstore): every worker
// push-pulls `keys` keys of B bytes per step. The same job runs with PSKV_REPLICAS=0
// and =1, alternating, --repeats jobs each; per job the step time is the slowest
// worker's mean over --steps timed steps (after a warm-up step). Reported per
// topology: the median step time of each setting and the overhead, R1 / R0 - 1.
//
//   pskv-bench replicas [--json] [--topologies 2x2,4x4] [--bytes N] [--keys N]
//                       [--steps N] [--repeats N]
// The worker side (run by pskv-launch): pskv-bench replicas-worker <same options>.
#include "bench/replicas_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/optimizer.h"

namespace pskv::bench {

namespace {

using Clock = std::chrono::steady_clock;

// One job; the slowest worker's mean step time in ms.
double RunJob(int workers, int servers, int replicas, int64_t bytes, int keys, int steps) {
  double slowest = 0;
  RunLaunchedJob("replicas",
                 "-n " + std::to_string(workers) + " -s " + std::to_string(servers) +
                     " --timeout 600 --env PSKV_REPLICAS=" + std::to_string(replicas),
                 "replicas-worker --bytes " + std::to_string(bytes) + " --keys " +
                     std::to_string(keys) + " --steps " + std::to_string(steps),
                 [&](const char* line) {
                   const char* at = std::strstr(line, "REPLICAS ");
                   double ms = 0;
                   if (at && std::sscanf(at, "REPLICAS step_ms=%lf", &ms) == 1)
                     slowest = std::max(slowest, ms);
                 });
  if (slowest <= 0) throw Error("pskv-bench replicas: no worker reported its step time");
  return slowest;
}

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int BenchReplicasWorker(int argc, char** argv) {
  const int64_t bytes = ArgInt(argc, argv, "--bytes", 1 << 20);
  const int keys = static_cast<int>(ArgInt(argc, argv, "--keys", 4));
  const int steps = static_cast<int>(ArgInt(argc, argv, "--steps", 40));
  auto kv = KVStore::Create("dist_sync");
  const int64_t n = bytes / 4;
  std::vector<int> ks;
  std::vector<NDArray> vals, outs;
  for (int k = 0; k < keys; ++k) {
    ks.push_back(k);
    NDArray v({n});
    v.Fill(0.5f);
    vals.push_back(v);
    outs.emplace_back(Shape{n});
  }
  kv->Init(ks, vals);
  kv->SetOptimizer(OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.01"}}));
  kv->PushPull(ks, vals, ks, outs);  // warm-up: buffers, connections
  kv->WaitAll();
  kv->Barrier();
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) kv->PushPull(ks, vals, ks, outs);
  kv->WaitAll();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
  std::printf("REPLICAS step_ms=%.4f\n", ms);
  std::fflush(stdout);
  kv->Barrier();
  return 0;
}

int BenchReplicas(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const int64_t bytes = ArgInt(argc, argv, "--bytes", 1 << 20);
  const int keys = static_cast<int>(ArgInt(argc, argv, "--keys", 4));
  const int steps = static_cast<int>(ArgInt(argc, argv, "--steps", 40));
  const int repeats = static_cast<int>(ArgInt(argc, argv, "--repeats", 5));
  std::vector<std::pair<int, int>> topo;
  {
    std::stringstream ss(ArgStr(argc, argv, "--topologies", "2x2,4x4"));
    std::string t;
    while (std::getline(ss, t, ',')) {
      int w = 0, s = 0;
      if (std::sscanf(t.c_str(), "%dx%d", &w, &s) != 2 || w < 1 || s < 2)
        throw InvalidArgument("--topologies: '" + t + "' is not WxS with S >= 2 (e.g. 2x2)");
      topo.emplace_back(w, s);
    }
  }
  if (!json)
    std::printf(
        "replicas: dist_sync push-pull of %d float32 keys of %lld bytes per step, SGD on the "
        "servers,\nW workers x S servers (processes, pskv-launch, TCP 127.0.0.1); step time = "
        "slowest worker's mean over %d steps;\nPSKV_REPLICAS=0 and =1 alternate, %d jobs each; "
        "medians\n%6s %12s %12s %10s\n",
        keys, static_cast<long long>(bytes), steps, repeats, "WxS", "R=0 ms", "R=1 ms", "overhead");
  for (auto [w, s] : topo) {
    std::vector<double> r0, r1;
    for (int rep = 0; rep < repeats; ++rep) {
      r0.push_back(RunJob(w, s, 0, bytes, keys, steps));
      r1.push_back(RunJob(w, s, 1, bytes, keys, steps));
    }
    const double m0 = MedianOf(r0), m1 = MedianOf(r1);
    if (json)
      std::printf(
          "{\"bench\":\"replicas\",\"workers\":%d,\"servers\":%d,\"bytes\":%lld,\"keys\":%d,"
          "\"steps\":%d,\"repeats\":%d,\"step_ms_r0\":%.3f,\"step_ms_r1\":%.3f,"
          "\"overhead\":%.4f}\n",
          w, s, static_cast<long long>(bytes), keys, steps, repeats, m0, m1, m1 / m0 - 1);
    else
      std::printf("%3dx%-2d %12.3f %12.3f %9.1f%%\n", w, s, m0, m1, 100 * (m1 / m0 - 1));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace pskv::bench
