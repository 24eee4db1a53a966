// pskv-bench replicas: what replicated servers cost in steady state
// (docs/fault-tolerance.md, "Replicated servers"; docs/performance.md). A dist_sync
// job of W workers x S servers as real processes started by pskv-launch (TCP on
// 127.0.0.1 by default), float32 keys, SGD on the servers (update_on_kvstore). Dense:
// every worker push-pulls `keys` keys of B bytes per step. --sparse: `keys` row_sparse
// tables of B bytes (rows of 64 floats; sliced over the servers by rows when at least
// MXNET_KVSTORE_BIGARRAY_BOUND elements); every worker pushes --rows-frac of each
// table's rows per step (its own random rows, a new set each step) and pulls the same
// rows. The same job runs with PSKV_REPLICAS=0 and =1, alternating, --repeats jobs
// each; per job the step time is the slowest worker's mean over --steps timed steps
// (after a warm-up step). Reported per topology: the median step time of each
// setting and the overhead, R1 / R0 - 1, of the same run, beside its floor on one
// host (LoopbackFloor; bench/cluster/replicas.py reports the floors of host links).
//
//   pskv-bench replicas [--json] [--topologies 2x2,4x4] [--bytes N] [--keys N]
//                       [--steps N] [--repeats N] [--sparse [--rows-frac F]]
//                       [--launch-args "ARGS"] [--label TEXT]
// --launch-args: more pskv-launch arguments for every job (a host file and ssh
// options: bench/cluster/replicas.py runs it across namespace hosts); --label names
// the setting in the output.
// The worker side (run by pskv-launch): pskv-bench replicas-worker <same options>.
#include "bench/replicas_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/optimizer.h"
#include "pskv/row_sparse.h"

namespace pskv::bench {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kRowFloats = 64;  // --sparse: floats per row

struct JobArgs {
  int64_t bytes = 1 << 20;
  int keys = 4;
  int steps = 40;
  bool sparse = false;
  double rows_frac = 0.125;
  std::string launch_args;  // more pskv-launch arguments

  static JobArgs Parse(int argc, char** argv) {
    JobArgs a;
    a.sparse = HasFlag(argc, argv, "--sparse");
    a.bytes = ArgInt(argc, argv, "--bytes", a.sparse ? 4 << 20 : 1 << 20);
    a.keys = static_cast<int>(ArgInt(argc, argv, "--keys", 4));
    a.steps = static_cast<int>(ArgInt(argc, argv, "--steps", 40));
    a.rows_frac = std::atof(ArgStr(argc, argv, "--rows-frac", "0.125").c_str());
    a.launch_args = ArgStr(argc, argv, "--launch-args", "");
    if (a.keys < 1 || a.steps < 1 || a.bytes < kRowFloats * 4 || a.rows_frac <= 0 ||
        a.rows_frac > 1)
      throw InvalidArgument(
          "pskv-bench replicas: --keys, --steps >= 1, --bytes >= 256, 0 < --rows-frac <= 1");
    return a;
  }
  std::string WorkerArgs() const {
    char frac[32];
    std::snprintf(frac, sizeof frac, "%g", rows_frac);
    return "replicas-worker --bytes " + std::to_string(bytes) + " --keys " + std::to_string(keys) +
           " --steps " + std::to_string(steps) +
           (sparse ? std::string(" --sparse --rows-frac ") + frac : "");
  }
};

// One job; the slowest worker's mean step time in ms.
double RunJob(int workers, int servers, int replicas, const JobArgs& a) {
  double slowest = 0;
  RunLaunchedJob("replicas",
                 a.launch_args + " -n " + std::to_string(workers) + " -s " +
                     std::to_string(servers) +
                     " --timeout 600 --env PSKV_REPLICAS=" + std::to_string(replicas),
                 a.WorkerArgs(), [&](const char* line) {
                   const char* at = std::strstr(line, "REPLICAS ");
                   double ms = 0;
                   if (at && std::sscanf(at, "REPLICAS step_ms=%lf", &ms) == 1)
                     slowest = std::max(slowest, ms);
                 });
  if (slowest <= 0) throw Error("pskv-bench replicas: no worker reported its step time");
  return slowest;
}

// The least overhead of R=1 where every byte costs the same (one host: the bytes
// the processes move through the shared cores; docs/performance.md, "Replicated
// servers"): per step each worker pushes and pulls its data, 2 W D in all, and R=1
// adds one copy of each range's round to its replica. Dense: D = M (the model) and the
// round's sum is M, so 1 / (2 W). Row_sparse: D = f T (each worker's rows of a table of
// T bytes) and the sum holds the union of the W workers' random rows, u T with
// u = 1 - (1 - f)^W, so u / (2 W f). Not counted: the replica's optimizer update.
double LoopbackFloor(int workers, const JobArgs& a) {
  if (!a.sparse) return 1.0 / (2.0 * workers);
  const double u = 1 - std::pow(1 - a.rows_frac, workers);
  return u / (2.0 * workers * a.rows_frac);
}

// "[1.234,5.678]": every job's step time (the spread behind a median).
std::string JsonList(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%.3f", i ? "," : "", v[i]);
    out += b;
  }
  return out + "]";
}

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// --sparse: `keys` tables; per step every worker pushes its own random rows of each
// table and pulls them back. Returns the mean step time in ms.
double SparseSteps(KVStore& kv, const JobArgs& a) {
  const int64_t rows = a.bytes / (kRowFloats * 4);
  const int64_t touched = std::max<int64_t>(1, static_cast<int64_t>(a.rows_frac * rows));
  std::vector<int> ks;
  for (int k = 0; k < a.keys; ++k) {
    ks.push_back(k);
    NDArray init({rows, kRowFloats});
    init.Fill(0.5f);
    kv.Init(k, RowSparseNDArray::FromDense(init));
  }
  kv.SetOptimizer(OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.01"}}));
  // A few row sets per worker (made before the timed steps), used in turn.
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(kv.Rank()));
  std::vector<int64_t> all(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) all[static_cast<size_t>(i)] = i;
  NDArray grad({touched, kRowFloats});
  grad.Fill(0.25f);
  std::vector<NDArray> ids;
  std::vector<RowSparseNDArray> pushes;
  for (int s = 0; s < 4; ++s) {
    std::shuffle(all.begin(), all.end(), rng);
    NDArray id({touched}, DType::kInt64);
    std::copy(all.begin(), all.begin() + touched, id.data<int64_t>());
    std::sort(id.data<int64_t>(), id.data<int64_t>() + touched);
    pushes.push_back(RowSparseNDArray::FromRows(Shape{rows, kRowFloats}, id, grad));
    ids.push_back(id);
  }
  std::vector<RowSparseNDArray> outs;
  for (int k = 0; k < a.keys; ++k) outs.emplace_back(Shape{rows, kRowFloats});
  auto step = [&](int s) {  // s = 0 is the warm-up
    const size_t set = static_cast<size_t>(s) % pushes.size();
    for (int k : ks) {
      kv.Push(k, {pushes[set]});
      kv.RowSparsePull(k, {outs[static_cast<size_t>(k)]}, {ids[set]});
    }
  };
  return TimedSteps(kv, a.steps, step) * 1e3 / a.steps;
}

}  // namespace

int BenchReplicasWorker(int argc, char** argv) {
  const JobArgs a = JobArgs::Parse(argc, argv);
  auto kv = KVStore::Create("dist_sync");
  if (a.sparse) {
    const double ms = SparseSteps(*kv, a);
    std::printf("REPLICAS step_ms=%.4f\n", ms);
    std::fflush(stdout);
    kv->Barrier();
    return 0;
  }
  const int64_t bytes = a.bytes;
  const int keys = a.keys;
  const int steps = a.steps;
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
  const double ms = TimedPushPull(*kv, ks, vals, outs, steps) * 1e3 / steps;
  std::printf("REPLICAS step_ms=%.4f\n", ms);
  std::fflush(stdout);
  kv->Barrier();
  return 0;
}

int BenchReplicas(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const JobArgs a = JobArgs::Parse(argc, argv);
  const std::string label = ArgStr(argc, argv, "--label", "loopback");
  const int repeats = static_cast<int>(ArgInt(argc, argv, "--repeats", 5));
  const auto topo = ParseTopologies(ArgStr(argc, argv, "--topologies", "2x2,4x4"), 2);
  if (!json)
    std::printf(
        "replicas (%s): dist_sync %s of %d float32 %s of %lld bytes per step, SGD on the "
        "servers,\nW workers x S servers (processes, pskv-launch); step time = "
        "slowest worker's mean over %d steps;\nPSKV_REPLICAS=0 and =1 alternate, %d jobs each; "
        "medians; floor: the extra bytes of R=1 over those of R=0 (LoopbackFloor)\n%6s %12s "
        "%12s %10s %8s\n",
        label.c_str(), a.sparse ? "push + row_sparse pull" : "push-pull", a.keys,
        a.sparse ? "row_sparse tables" : "keys", static_cast<long long>(a.bytes), a.steps, repeats,
        "WxS", "R=0 ms", "R=1 ms", "overhead", "floor");
  for (auto [w, s] : topo) {
    std::vector<double> r0, r1;
    for (int rep = 0; rep < repeats; ++rep) {
      r0.push_back(RunJob(w, s, 0, a));
      r1.push_back(RunJob(w, s, 1, a));
    }
    const double m0 = MedianOf(r0), m1 = MedianOf(r1);
    const double least = LoopbackFloor(w, a);
    if (json)
      std::printf(
          "{\"bench\":\"replicas\",\"setting\":\"%s\",\"keys_kind\":\"%s\",\"workers\":%d,"
          "\"servers\":%d,\"bytes\":%lld,\"keys\":%d,\"steps\":%d,\"repeats\":%d,"
          "\"step_ms_r0\":%.3f,\"step_ms_r1\":%.3f,\"overhead\":%.4f,\"floor\":%.4f,"
          "\"r0_ms\":%s,\"r1_ms\":%s}\n",
          label.c_str(), a.sparse ? "row_sparse" : "dense", w, s, static_cast<long long>(a.bytes),
          a.keys, a.steps, repeats, m0, m1, m1 / m0 - 1, least, JsonList(r0).c_str(),
          JsonList(r1).c_str());
    else
      std::printf("%3dx%-2d %12.3f %12.3f %9.1f%% %7.1f%%\n", w, s, m0, m1, 100 * (m1 / m0 - 1),
                  100 * least);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace pskv::bench
