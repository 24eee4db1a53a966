// Helpers shared by the benchmarks.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/net.h"
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

/// The value after `name` on the command line, or `def`.
inline int64_t ArgInt(int argc, char** argv, const char* name, int64_t def) {
  for (int i = 0; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::stoll(argv[i + 1]);
  return def;
}

inline bool HasFlag(int argc, char** argv, const char* name) {
  for (int i = 0; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

}  // namespace pskv::bench
