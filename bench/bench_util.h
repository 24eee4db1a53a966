// Helpers shared by the benchmarks.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/net.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/options.h"

namespace pskv::bench {

/// `o` made into a job on 127.0.0.1 with one server, `num_workers` workers and a
/// fresh scheduler port (the caller sets each node's role).
inline Options LoopbackJob(Options o, int num_workers) {
  o.root_uri = "127.0.0.1";
  o.root_port = FreePort();
  o.num_servers = 1;
  o.num_workers = num_workers;
  o.role_set = true;
  return o;
}

/// Median seconds of `reps` calls of fn, after one warm-up call.
inline double Median(int reps, const std::function<void()>& fn) {
  using Clock = std::chrono::steady_clock;
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto s = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - s).count());
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[static_cast<size_t>(reps / 2)];
}

/// Seconds taken by `steps` calls of step(1) .. step(steps) on every worker of `kv`'s
/// job, timed after one warm-up step(0) (buffers, connections), WaitAll and a Barrier
/// (every worker starts the timed steps together), through a WaitAll at the end.
inline double TimedSteps(KVStore& kv, int steps, const std::function<void(int)>& step) {
  using Clock = std::chrono::steady_clock;
  step(0);
  kv.WaitAll();
  kv.Barrier();
  const auto t0 = Clock::now();
  for (int s = 1; s <= steps; ++s) step(s);
  kv.WaitAll();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// TimedSteps of one PushPull of `keys` (values `vals`, results into `outs`) per step.
inline double TimedPushPull(KVStore& kv, const std::vector<int>& keys,
                            const std::vector<NDArray>& vals, const std::vector<NDArray>& outs,
                            int steps) {
  return TimedSteps(kv, steps, [&](int) { kv.PushPull(keys, vals, keys, outs); });
}

/// The value after `name` on the command line, or `def`.
inline int64_t ArgInt(int argc, char** argv, const char* name, int64_t def) {
  for (int i = 0; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::stoll(argv[i + 1]);
  return def;
}

/// The string after `name` on the command line, or `def`.
inline std::string ArgStr(int argc, char** argv, const char* name, const std::string& def) {
  for (int i = 0; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}

inline bool HasFlag(int argc, char** argv, const char* name) {
  for (int i = 0; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

/// A --topologies list "WxS,WxS,...": (workers, servers) pairs, each with at least
/// one worker and `min_servers` servers; InvalidArgument naming a bad entry.
inline std::vector<std::pair<int, int>> ParseTopologies(const std::string& list, int min_servers) {
  std::vector<std::pair<int, int>> out;
  std::stringstream ss(list);
  std::string t;
  while (std::getline(ss, t, ',')) {
    int w = 0, s = 0;
    if (std::sscanf(t.c_str(), "%dx%d", &w, &s) != 2 || w < 1 || s < min_servers)
      throw InvalidArgument("--topologies: '" + t + "' is not WxS with S >= " +
                            std::to_string(min_servers) + " (e.g. 2x2)");
    out.emplace_back(w, s);
  }
  return out;
}

/// This program's path (/proc/self/exe).
inline std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw IOError("pskv-bench: cannot find its own executable");
  return std::string(buf, static_cast<size_t>(n));
}

/// Runs a job of real processes: `pskv-launch <launch_args> -- <this program>
/// <worker_args>` (the pskv-launch next to this program), passing each line of its
/// output to `on_line`. Throws Error with the job's output if it fails (`what` names
/// the benchmark).
inline void RunLaunchedJob(const std::string& what, const std::string& launch_args,
                           const std::string& worker_args,
                           const std::function<void(const char*)>& on_line) {
  const std::string exe = SelfExe();
  const std::string launch = exe.substr(0, exe.rfind('/') + 1) + "pskv-launch";
  const std::string cmd = launch + " " + launch_args + " -- " + exe + " " + worker_args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw IOError("pskv-bench: cannot run " + launch);
  std::string log;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    log += line;
    on_line(line);
  }
  if (::pclose(p) != 0) throw Error("pskv-bench " + what + ": the job failed; its output:\n" + log);
}

}  // namespace pskv::bench
