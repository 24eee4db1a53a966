// pskv-bench latency: the time of one small push+pull through the whole public API
// (KVStore::PushPull + WaitAll, dist_sync, 1 worker + 1 server as processes started
// by pskv-launch), against the raw TCP round trip of the same bytes measured in the
// same run (a blocking single-threaded echo on 127.0.0.1: what the kernel alone
// costs). Three jobs: TCP through pskv's direct connections (PSKV_TCP_DIRECT=1,
// the default), TCP through ZeroMQ (PSKV_TCP_DIRECT=0) and shared memory (the
// default on one host). In each job two stores run interleaved: "inline" (the
// defaults: a small operation starts on the calling thread) and "engine"
// (PSKV_INLINE_START_BYTES=0: every operation is started by the engine's thread, as before). Goal
// (issue 13 item 7): <= 3x the raw TCP round trip over TCP, <= 2x over shm.
//
//   pskv-bench latency [--json] [--bytes N] [--reps N]
// The worker side (run by pskv-launch): pskv-bench latency-worker [same options].
#include "bench/latency_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/tcp_loopback.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/options.h"

namespace pskv::bench {

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i];
}

// Raw TCP round trips of `bytes`, microseconds each.
std::vector<double> RawRoundTrips(int64_t bytes, int reps) {
  TcpPair echo(static_cast<size_t>(bytes));
  std::vector<double> t;
  for (int i = 0; i < reps + 10; ++i) {
    const auto s = Clock::now();
    echo.RoundTrip(static_cast<size_t>(bytes));
    if (i >= 10) t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count());
  }
  return t;
}

struct Job {
  std::map<std::string, double> p50, p90;
};

Job RunJob(const std::string& env, int64_t bytes, int reps) {
  Job out;
  RunLaunchedJob(
      "latency", "-n 1 -s 1 --timeout 600 " + env,
      "latency-worker --bytes " + std::to_string(bytes) + " --reps " + std::to_string(reps),
      [&](const char* line) {
        const char* at = std::strstr(line, "LATENCY ");
        char name[64];
        double p50 = 0, p90 = 0;
        if (at && std::sscanf(at, "LATENCY store=%63s p50=%lf p90=%lf", name, &p50, &p90) == 3) {
          out.p50[name] = p50;
          out.p90[name] = p90;
        }
      });
  if (out.p50.size() != 2) throw Error("pskv-bench latency: the job reported no result");
  return out;
}

}  // namespace

int BenchLatencyWorker(int argc, char** argv) {
  const int64_t bytes = ArgInt(argc, argv, "--bytes", 4096);
  const int reps = static_cast<int>(ArgInt(argc, argv, "--reps", 2000));
  Options inline_o = Options::FromEnv(), engine_o = inline_o;
  engine_o.inline_start_bytes = 0;
  std::vector<std::pair<std::string, std::unique_ptr<KVStore>>> stores;
  stores.emplace_back("inline", KVStore::Create("dist_sync", inline_o));
  stores.emplace_back("engine", KVStore::Create("dist_sync", engine_o));
  const int64_t n = std::max<int64_t>(1, bytes / 4);
  NDArray val({n}), out({n});
  val.Fill(1);
  for (auto& [name, kv] : stores) kv->Init(0, val);
  stores[0].second->Barrier();
  std::map<std::string, std::vector<double>> t;
  for (int r = 0; r < reps + 50; ++r)  // the first 50: warm-up
    for (auto& [name, kv] : stores) {
      const auto s = Clock::now();
      kv->PushPull(0, {val}, {out});
      kv->WaitAll();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - s).count();
      if (out.At(n - 1) != 1.0f) throw Error("pskv-bench latency: wrong sum");
      if (r >= 50) t[name].push_back(us);
    }
  for (auto& [name, v] : t)
    std::printf("LATENCY store=%s p50=%.2f p90=%.2f\n", name.c_str(), Percentile(v, 0.5),
                Percentile(v, 0.9));
  std::fflush(stdout);
  stores[0].second->Barrier();
  return 0;
}

int BenchLatency(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const int64_t bytes = ArgInt(argc, argv, "--bytes", 4096);
  const int reps = static_cast<int>(ArgInt(argc, argv, "--reps", 2000));
  // The ceiling before and after each job, all samples together.
  std::vector<double> raw = RawRoundTrips(bytes, reps);
  const Job tcp = RunJob("--env PSKV_SHM=0 --env PSKV_TCP_DIRECT=1", bytes, reps);
  for (double x : RawRoundTrips(bytes, reps)) raw.push_back(x);
  const Job zmq = RunJob("--env PSKV_SHM=0 --env PSKV_TCP_DIRECT=0", bytes, reps);
  for (double x : RawRoundTrips(bytes, reps)) raw.push_back(x);
  const Job shm = RunJob("", bytes, reps);
  for (double x : RawRoundTrips(bytes, reps)) raw.push_back(x);
  const double ceil50 = Percentile(raw, 0.5), ceil90 = Percentile(raw, 0.9);
  auto name = [&](const Job* j) { return j == &tcp ? "tcp" : j == &zmq ? "tcp-zmq" : "shm"; };
  if (json) {
    for (auto* j : {&tcp, &zmq, &shm})
      for (auto& [store, p50] : j->p50)
        std::printf(
            "{\"bench\":\"latency\",\"transport\":\"%s\",\"store\":\"%s\",\"bytes\":%lld,"
            "\"p50_us\":%.2f,\"p90_us\":%.2f,\"raw_tcp_rtt_p50_us\":%.2f,\"ratio\":%.3f}\n",
            name(j), store.c_str(), static_cast<long long>(bytes), p50, j->p90.at(store), ceil50,
            p50 / ceil50);
    return 0;
  }
  std::printf(
      "latency: push+pull of %lld bytes through KVStore (dist_sync, 1 worker + 1 server as "
      "processes),\nmedian (p90) of %d, against the raw TCP round trip of the same bytes in "
      "this run: %.1f us (p90 %.1f)\n\n",
      static_cast<long long>(bytes), reps, ceil50, ceil90);
  std::printf("%-10s %-8s %12s %12s %10s %8s\n", "transport", "start", "p50 us", "p90 us", "ratio",
              "goal");
  for (auto* j : {&tcp, &zmq, &shm})
    for (const char* store : {"engine", "inline"})
      std::printf("%-10s %-8s %12.1f %12.1f %10.2f %8s\n", name(j), store, j->p50.at(store),
                  j->p90.at(store), j->p50.at(store) / ceil50, j == &shm ? "<= 2" : "<= 3");
  return 0;
}

}  // namespace pskv::bench
