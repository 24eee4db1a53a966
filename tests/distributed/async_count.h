// The keys and gradients of the dist_async counting job (async_count_worker.cc), shared
// with the test that checks its sums (test_failover_async.cc).
#pragma once

#include <cstdint>
#include <vector>

namespace async_count {

// Key 5 is sliced over both servers and cut into wire chunks; 7 and 9 travel fused.
inline const std::vector<int> kKeys = {3, 5, 7, 9};
inline const std::vector<int64_t> kSizes = {100, 300000, 8, 8};

/// Worker `rank`'s gradient of element `i` of `key` at push `p` (from 1): an integer
/// in [1, 7], so every partial sum of a job's pushes is exact in float32.
inline float Grad(int rank, int p, int key, int64_t i) {
  return static_cast<float>(((i * 3 + key * 5 + p * 7 + rank * 11) % 7) + 1);
}

/// The final value of element `i` of `key` after every worker of `workers` pushed
/// `pushes` times, each push applied once (SGD at learning rate 1, from 0).
inline float Expected(int workers, int pushes, int key, int64_t i) {
  double sum = 0;
  for (int r = 0; r < workers; ++r)
    for (int p = 1; p <= pushes; ++p) sum += Grad(r, p, key, i);
  return static_cast<float>(-sum);
}

}  // namespace async_count
