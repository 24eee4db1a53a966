// pskv-bench priority: "priorities on the wire" (issue 13, item 4). One worker and
// one server started by pskv-launch (real processes, dist_sync, no optimizer: the
// server sums). The worker measures
//   idle:   the latency of a push+pull of a small key (4 KiB, priority +10), median;
//   loaded: the same small push+pull issued again and again while a big push+pull
//           (64 MiB, priority -10) is in flight (issued by another thread; every
//           small operation started before the big one completed is a sample), median;
//   big:    the big push+pull alone (median seconds -> GB/s moved both ways).
// Each is measured in a job with the defaults ("on": wire chunks + send window) and
// in a job with PSKV_WIRE_CHUNK_BYTES=0 PSKV_WIRE_WINDOW_BYTES=0 ("off": one
// message per server, FIFO sends — the behaviour before), over TCP (PSKV_SHM=0) and
// over shared memory. Ceilings, from the same run: the idle latency (goal: loaded /
// idle <= 3) and the big transfer with scheduling off (on / off: no big regression).
//
//   pskv-bench priority [--json] [--small-bytes N] [--big-bytes N] [--rounds N]
//                       [--chunk N] [--window N]   (the "on" settings; default: the
//                                                   defaults of options.h)
// The worker side (run by pskv-launch): pskv-bench priority-worker [same sizes].
#include "bench/priority_bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/options.h"

namespace pskv::bench {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw IOError("pskv-bench: cannot find its own executable");
  return std::string(buf, static_cast<size_t>(n));
}

struct Figures {
  double idle_us = 0, loaded_us = 0, loaded_p90_us = 0, big_s = 0;
  int samples = 0;
};

Figures RunJob(const std::string& env, int64_t small, int64_t big, int rounds) {
  const std::string exe = SelfExe();
  const std::string launch = exe.substr(0, exe.rfind('/') + 1) + "pskv-launch";
  std::ostringstream cmd;
  cmd << "env " << env << " " << launch << " -n 1 -s 1 --timeout 600 -- " << exe
      << " priority-worker --small-bytes " << small << " --big-bytes " << big << " --rounds "
      << rounds << " 2>&1";
  FILE* p = ::popen(cmd.str().c_str(), "r");
  if (!p) throw IOError("pskv-bench: cannot run " + launch);
  Figures f;
  bool got = false;
  std::string log;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    log += line;
    if (const char* at = std::strstr(line, "PRIORITY "))
      got = std::sscanf(at, "PRIORITY idle_us=%lf loaded_us=%lf loaded_p90_us=%lf big_s=%lf n=%d",
                        &f.idle_us, &f.loaded_us, &f.loaded_p90_us, &f.big_s, &f.samples) == 5;
  }
  if (::pclose(p) != 0 || !got)
    throw Error("pskv-bench priority: the job (" + env + ") failed; its output:\n" + log);
  return f;
}

}  // namespace

int BenchPriorityWorker(int argc, char** argv) {
  const int64_t small_bytes = ArgInt(argc, argv, "--small-bytes", 4096);
  const int64_t big_bytes = ArgInt(argc, argv, "--big-bytes", int64_t{64} << 20);
  const int rounds = static_cast<int>(ArgInt(argc, argv, "--rounds", 8));
  constexpr int kSmall = 0, kBig = 1, kHigh = 10, kLow = -10;
  auto kv = KVStore::Create("dist_sync", Options::FromEnv());
  NDArray small_v({small_bytes / 4}), small_o({small_bytes / 4});
  NDArray big_v({big_bytes / 4}), big_o({big_bytes / 4});
  small_v.Fill(1);
  big_v.Fill(1);
  kv->Init({kSmall, kBig}, {small_v, big_v});
  auto small_op = [&] {
    const auto t0 = Clock::now();
    kv->PushPull(kSmall, {small_v}, {small_o}, kHigh);
    kv->Wait(std::vector<int>{kSmall});
    return Seconds(t0);
  };
  auto big_op = [&] {
    const auto t0 = Clock::now();
    kv->PushPull(kBig, {big_v}, {big_o}, kLow);
    kv->Wait(std::vector<int>{kBig});
    return Seconds(t0);
  };
  for (int i = 0; i < 20; ++i) small_op();  // warm-up
  big_op();
  std::vector<double> idle, loaded, big;
  for (int i = 0; i < 200; ++i) idle.push_back(small_op());
  for (int r = 0; r < rounds; ++r) big.push_back(big_op());
  for (int r = 0; r < rounds; ++r) {
    std::atomic<bool> issued{false}, done{false};
    std::thread t([&] {
      kv->PushPull(kBig, {big_v}, {big_o}, kLow);
      issued = true;
      kv->Wait(std::vector<int>{kBig});
      done = true;
    });
    for (int i = 0; i < 100000 && !issued; ++i) std::this_thread::yield();  // bounded
    // Samples: every small operation started while the big one was in flight (also
    // one that ends after it). Bounded: at most 100000 per round.
    for (int i = 0; i < 100000 && !done; ++i) loaded.push_back(small_op());
    t.join();
  }
  if (small_o.At(0) != 1.0f || big_o.At(big_o.size() - 1) != 1.0f)
    throw Error("pskv-bench priority: wrong sum");
  std::vector<double> sorted = loaded;
  std::sort(sorted.begin(), sorted.end());
  const double p90 = sorted.empty() ? 0 : sorted[sorted.size() * 9 / 10];
  std::printf("PRIORITY idle_us=%.1f loaded_us=%.1f loaded_p90_us=%.1f big_s=%.6f n=%d\n",
              MedianOf(idle) * 1e6, MedianOf(loaded) * 1e6, p90 * 1e6, MedianOf(big),
              static_cast<int>(loaded.size()));
  std::fflush(stdout);
  kv->Barrier();
  return 0;
}

int BenchPriority(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const int64_t small = ArgInt(argc, argv, "--small-bytes", 4096);
  const int64_t big = ArgInt(argc, argv, "--big-bytes", int64_t{64} << 20);
  const int rounds = static_cast<int>(ArgInt(argc, argv, "--rounds", 8));
  const Options defaults;
  const int64_t chunk = ArgInt(argc, argv, "--chunk", defaults.wire_chunk_bytes);
  const int64_t window = ArgInt(argc, argv, "--window", defaults.wire_window_bytes);
  const std::string on = "PSKV_WIRE_CHUNK_BYTES=" + std::to_string(chunk) +
                         " PSKV_WIRE_WINDOW_BYTES=" + std::to_string(window);
  const std::string off = "PSKV_WIRE_CHUNK_BYTES=0 PSKV_WIRE_WINDOW_BYTES=0";
  if (!json)
    std::printf(
        "priority: 1 worker + 1 server (processes), dist_sync; a %lld-byte push+pull (priority "
        "+10)\nidle, and while a %lld-byte push+pull (priority -10) is in flight; %d big rounds\n"
        "on: chunk %lld B, window %lld B; off: one message per server, FIFO sends\n"
        "%-5s %-4s %10s %11s %11s %8s %9s %10s\n",
        static_cast<long long>(small), static_cast<long long>(big), rounds,
        static_cast<long long>(chunk), static_cast<long long>(window), "link", "mode", "idle us",
        "loaded us", "p90 us", "ratio", "big GB/s", "big on/off");
  for (const char* link : {"tcp", "shm"}) {
    const std::string shm = std::string("PSKV_SHM=") + (std::strcmp(link, "tcp") == 0 ? "0" : "1");
    std::map<std::string, Figures> r;
    r["off"] = RunJob(shm + " " + off, small, big, rounds);
    r["on"] = RunJob(shm + " " + on, small, big, rounds);
    for (const char* mode : {"off", "on"}) {
      const Figures& f = r[mode];
      const double gbps = 2.0 * static_cast<double>(big) / f.big_s / 1e9;
      const double vs_off = r["off"].big_s / f.big_s;
      if (json)
        std::printf(
            "{\"bench\":\"priority\",\"link\":\"%s\",\"mode\":\"%s\",\"chunk\":%lld,"
            "\"window\":%lld,\"small_bytes\":%lld,\"big_bytes\":%lld,\"idle_us\":%.1f,"
            "\"loaded_us\":%.1f,\"loaded_p90_us\":%.1f,\"ratio\":%.3f,\"samples\":%d,"
            "\"big_gbps\":%.3f,\"big_ratio_to_off\":%.3f}\n",
            link, mode, static_cast<long long>(std::strcmp(mode, "on") == 0 ? chunk : 0),
            static_cast<long long>(std::strcmp(mode, "on") == 0 ? window : 0),
            static_cast<long long>(small), static_cast<long long>(big), f.idle_us, f.loaded_us,
            f.loaded_p90_us, f.loaded_us / f.idle_us, f.samples, gbps, vs_off);
      else
        std::printf("%-5s %-4s %10.1f %11.1f %11.1f %8.2f %9.3f %10.3f\n", link, mode, f.idle_us,
                    f.loaded_us, f.loaded_p90_us, f.loaded_us / f.idle_us, gbps, vs_off);
      std::fflush(stdout);
    }
  }
  if (!json)
    std::printf(
        "ratio = loaded / idle median latency (goal <= 3 with scheduling on); big on/off = the "
        "big transfer's speed\nwith scheduling on relative to off (>= ~0.9: no big regression)\n");
  return 0;
}

}  // namespace pskv::bench
