// What the failover tests' worker programs (failover_worker.cc, sparse_failover_worker.cc,
// states_failover_worker.cc, async_count_worker.cc) have in common: the optimizer they
// train with, a deterministic dense gradient, the marker files the tests wait on to
// time their kills, each round's duration, and the output files the tests compare.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "pskv/ndarray.h"
#include "pskv/optimizer.h"

namespace failover_job {

/// Adam with weight decay and a step schedule: state (moments, update counts) and a
/// rate that changes every 3 updates, so a lost, repeated or reordered update shows.
inline pskv::OptimizerConfig TrainingOptimizer() {
  return pskv::OptimizerConfig::FromParams("adam", {{"learning_rate", "0.01"},
                                                    {"wd", "0.001"},
                                                    {"lr_scheduler", "factor"},
                                                    {"lr_factor", "0.5"},
                                                    {"lr_step", "3"}});
}

/// Worker `rank`'s dense gradient of `key` (n elements) in `round`: a function of its
/// arguments only, so an undisturbed job gives the same bits every time.
inline pskv::NDArray DenseGrad(int64_t n, int rank, int round, int key) {
  pskv::NDArray a({n});
  float* p = a.data<float>();
  for (int64_t i = 0; i < n; ++i)
    p[i] = static_cast<float>(((i * 7 + key * 13 + round * 5 + rank * 3) % 17) - 8) / 16.0f +
           0.001f * static_cast<float>(rank + 1);
  return a;
}

/// Creates an empty file: the tests poll for it to kill a server at a chosen point.
inline void Touch(const std::string& path) {
  if (FILE* f = std::fopen(path.c_str(), "w")) std::fclose(f);
}

/// Each step's wall time, and the files a worker leaves for the test: `<me>.weights`
/// (the arrays' raw bytes, in order) and `<me>.times` (one duration in ms per line).
class Steps {
 public:
  explicit Steps(std::string me) : me_(std::move(me)) {}

  void Begin() { t0_ = std::chrono::steady_clock::now(); }

  /// Records the step begun last and creates `<me>.<marker><step>`.
  void End(const std::string& marker, int step) {
    times_.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count());
    Touch(me_ + "." + marker + std::to_string(step));
  }

  void Write(const std::vector<pskv::NDArray>& weights) const {
    std::ofstream f(me_ + ".weights", std::ios::binary);
    for (const auto& a : weights)
      f.write(static_cast<const char*>(a.raw()), static_cast<std::streamsize>(a.nbytes()));
    std::ofstream t(me_ + ".times");
    for (double ms : times_) t << ms << "\n";
  }

  const std::string& me() const { return me_; }

 private:
  std::string me_;
  std::chrono::steady_clock::time_point t0_;
  std::vector<double> times_;
};

}  // namespace failover_job
