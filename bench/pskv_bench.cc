// pskv-bench: performance figures, each reported against a ceiling measured in the
// same run on the same machine.
//
//   pskv-bench reduce   [--json] [--min-elements N] [--max-elements N]
//   pskv-bench pushpull [--json] [--min-bytes N] [--max-bytes N]
//   pskv-bench <bench> ... --plot DIR   (records and PNG plots, through bench/plot.py)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "bench/device_bench.h"
#include "bench/embedding_bench.h"
#include "bench/fusion_bench.h"
#include "bench/latency_bench.h"
#include "bench/metrics_bench.h"
#include "bench/priority_bench.h"
#include "bench/pushpull_bench.h"
#include "bench/replicas_bench.h"
#include "bench/scaling_bench.h"
#include "bench/syncround_bench.h"
#include "kvstore/reduce.h"
#include "pskv/options.h"
#include "pskv/process.h"
#include "pskv/tuning.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds per call of fn over enough repetitions to last ~`budget` s.
double TimeIt(const std::function<void()>& fn, double budget = 0.4) {
  auto t0 = Clock::now();
  fn();  // also the warm-up: faults pages in, starts threads
  double one = std::chrono::duration<double>(Clock::now() - t0).count();
  return pskv::bench::Median(std::clamp(static_cast<int>(budget / std::max(one, 1e-6)), 3, 200),
                             fn);
}

using pskv::bench::ArgInt;
using pskv::bench::HasFlag;

int BenchReduce(int argc, char** argv) {
  using namespace pskv;
  const bool json = HasFlag(argc, argv, "--json");
  const int64_t lo = ArgInt(argc, argv, "--min-elements", 64 << 10);
  const int64_t hi = ArgInt(argc, argv, "--max-elements", 64 << 20);
  Options opts = Options::FromEnv();
  Reducer reducer(opts.bigarray_bound, opts.reduction_threads);
  if (!json)
    std::printf(
        "reduce: sum of 4 float32 arrays; threads=%d for arrays >= %lld elements\n"
        "ceiling: streaming copy of the same number of bytes, same threads\n"
        "%12s %12s %14s %10s\n",
        opts.reduction_threads, static_cast<long long>(opts.bigarray_bound), "elements", "GB/s",
        "ceiling GB/s", "ratio");
  for (int64_t n = lo; n <= hi; n *= 4) {
    std::vector<NDArray> srcs;
    for (int s = 0; s < 4; ++s) {
      NDArray a({n});
      a.Fill(s + 1);
      srcs.push_back(a);
    }
    NDArray dst({n});
    const double bytes = 5.0 * static_cast<double>(n) * 4;  // 4 reads + 1 write
    double t_red = TimeIt([&] { reducer.Sum(srcs, &dst); });
    if (dst.At(n - 1) != 10.0) {
      std::fprintf(stderr, "reduce produced a wrong sum\n");
      return 1;
    }
    // Ceiling: copy 2.5n floats: 2.5n read + 2.5n written = the same 5n*4 bytes.
    const int64_t m = n * 5 / 2;
    NDArray csrc({m}), cdst({m});
    csrc.Fill(1);
    double t_copy = TimeIt([&] { reducer.Copy(csrc, &cdst); });
    const double gbps = bytes / t_red / 1e9, ceil = bytes / t_copy / 1e9;
    if (json)
      std::printf(
          "{\"bench\":\"reduce\",\"elements\":%lld,\"gbps\":%.3f,\"ceiling_gbps\":%.3f,"
          "\"ratio\":%.3f,\"threads\":%d}\n",
          static_cast<long long>(n), gbps, ceil, gbps / ceil,
          n >= opts.bigarray_bound ? opts.reduction_threads : 1);
    else
      std::printf("%12lld %12.2f %14.2f %10.3f\n", static_cast<long long>(n), gbps, ceil,
                  gbps / ceil);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

// --plot DIR: runs this benchmark again as a child with --json, keeps its records in
// DIR/<bench>.json (and prints them), then draws DIR/<bench>.png with bench/plot.py
// (Debian's python3-matplotlib). Plotting is optional: without python3, matplotlib
// or a plot for this benchmark it says so and the run still succeeds.
static int RunAndPlot(int argc, char** argv, const std::string& dir) {
  std::string cmd = "'/proc/self/exe'";
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) cmd = "'" + std::string(self, static_cast<size_t>(n)) + "'";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--plot") {
      ++i;
      continue;
    }
    if (a == "--json" || a.find('\'') != std::string::npos) continue;
    cmd += " '" + a + "'";
  }
  cmd += " --json";
  std::filesystem::create_directories(dir);
  const std::string records = dir + "/" + argv[1] + ".json";
  FILE* in = ::popen(cmd.c_str(), "r");
  if (!in) {
    std::fprintf(stderr, "pskv-bench: cannot run %s\n", cmd.c_str());
    return 1;
  }
  FILE* out = std::fopen(records.c_str(), "w");
  char line[4096];
  while (std::fgets(line, sizeof line, in)) {
    std::fputs(line, stdout);
    if (out) std::fputs(line, out);
  }
  if (out) std::fclose(out);
  const int st = ::pclose(in);
  if (st != 0) return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  if (!std::filesystem::exists(PSKV_PLOT_SCRIPT) ||
      ::system("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null") != 0) {
    std::fprintf(stderr,
                 "pskv-bench: no plot (needs /usr/bin/python3 with matplotlib: apt-get install "
                 "python3-matplotlib); the records are in %s\n",
                 records.c_str());
    return 0;
  }
  const std::string plot = std::string("/usr/bin/python3 '") + PSKV_PLOT_SCRIPT + "' --out '" +
                           dir + "' '" + records + "'";
  if (::system(plot.c_str()) != 0)
    std::fprintf(stderr, "pskv-bench: bench/plot.py drew nothing for '%s' (records in %s)\n",
                 argv[1], records.c_str());
  return 0;
}

int main(int argc, char** argv) {
  pskv::TuneAllocatorForLargeMessages();
  try {
    pskv::ConfigureProcess();  // PSKV_LOG_LEVEL (the benchmarks' jobs live in this process)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pskv-bench: %s\n", e.what());
    return 2;
  }
  if (argc < 2 || HasFlag(argc, argv, "--help")) {
    std::printf(
        "usage: pskv-bench reduce [--json] [--min-elements N] [--max-elements N]\n"
        "       pskv-bench pushpull [--json] [--min-bytes N] [--max-bytes N]\n"
        "       pskv-bench security [--min-bytes N] [--max-bytes N]   (open vs secret vs "
        "encrypted)\n"
        "       pskv-bench syncround [--json] [--workers N] [--min-bytes N] [--max-bytes N]\n"
        "       pskv-bench strictrounds [--json] [--blocks N] [--rounds N]\n"
        "       pskv-bench scaling [--json] [--min-bytes N] [--max-bytes N] [--threads N] "
        "[--keys N] [--topologies 1x1,2x1,2x2,4x2] [--repeats N]\n"
        "       pskv-bench replicas [--json] [--topologies 2x2,4x4] [--bytes N] [--keys N] "
        "[--steps N] [--repeats N] [--sparse [--rows-frac F]] [--launch-args ARGS] [--label T]   "
        "(PSKV_REPLICAS=1 vs 0)\n"
        "       pskv-bench fusion [--json] [--workers N] [--keys N] [--key-bytes N] [--reps N]\n"
        "       pskv-bench latency [--json] [--bytes N] [--reps N]\n"
        "       pskv-bench metrics-flood [--keys N] [--scrapers N] [--seconds N]\n"
        "       pskv-bench device [--json] [--bytes N] [--ks 2,4,8] [--chunk N] [--reps N] "
        "[--quick]   (k-way sum vs d2d copy, staging vs pinned memcpy; PSKV_SIM_DEVICES=1 "
        "without a GPU)\n"
        "       pskv-bench priority [--json] [--small-bytes N] [--big-bytes N] [--rounds N] "
        "[--chunk N] [--window N]\n"
        "       pskv-bench embedding [--json] [--ids N] [--width N] [--batch N] [--zipf S] "
        "[--pushes N] [--optimizer adagrad,sgd,adam]   (row updates/s per core vs OSDI 2014)\n"
        "       pskv-bench embedding --checkpoint [--rows N] [--ids N] [--intervals 1,10,100] "
        "[--admission exact,cbf]   (full vs delta checkpoint bytes)\n"
        "       pskv-bench embedding --cache [--ids N] [--cache-rows N] [--staleness 0,1,4,16] "
        "[--steps N]   (row cache bytes per step and hit rate vs S)\n"
        "every benchmark: --plot DIR writes DIR/<bench>.json and, with python3-matplotlib,\n"
        "DIR/<bench>.png (reduce, pushpull: GB/s per size against the ceiling)\n");
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  for (int i = 2; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--plot") == 0) return RunAndPlot(argc, argv, argv[i + 1]);
  try {
    if (cmd == "reduce") return BenchReduce(argc, argv);
    if (cmd == "pushpull") return pskv::bench::BenchPushPull(argc, argv);
    if (cmd == "security") return pskv::bench::BenchSecurity(argc, argv);
    if (cmd == "syncround") return pskv::bench::BenchSyncRound(argc, argv);
    if (cmd == "strictrounds") return pskv::bench::BenchStrictRounds(argc, argv);
    if (cmd == "scaling") return pskv::bench::BenchScaling(argc, argv);
    if (cmd == "fusion") return pskv::bench::BenchFusion(argc, argv);
    if (cmd == "fusion-worker") return pskv::bench::BenchFusionWorker(argc, argv);
    if (cmd == "latency") return pskv::bench::BenchLatency(argc, argv);
    if (cmd == "metrics-flood") return pskv::bench::BenchMetricsFlood(argc, argv);
    if (cmd == "latency-worker") return pskv::bench::BenchLatencyWorker(argc, argv);
    if (cmd == "priority") return pskv::bench::BenchPriority(argc, argv);
    if (cmd == "priority-worker") return pskv::bench::BenchPriorityWorker(argc, argv);
    if (cmd == "scaling-worker") return pskv::bench::BenchScalingWorker(argc, argv);
    if (cmd == "device") return pskv::bench::BenchDevice(argc, argv);
    if (cmd == "replicas") return pskv::bench::BenchReplicas(argc, argv);
    if (cmd == "embedding") return pskv::bench::BenchEmbedding(argc, argv);
    if (cmd == "replicas-worker") return pskv::bench::BenchReplicasWorker(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pskv-bench: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "pskv-bench: unknown benchmark '%s'\n", cmd.c_str());
  return 2;
}
