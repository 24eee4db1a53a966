// What the dynamic embedding tables' real-process jobs (embedding_worker.cc,
// embedding_failover_worker.cc) share: Zipf-distributed u64 ids, deterministic
// gradients, and the arrays they travel in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "pskv/ndarray.h"

namespace embedding_job {

// Zipf(1.1) over 600 ranks, each rank scrambled into a u64 id (some with the high bit).
struct Zipf {
  std::vector<double> cdf;
  Zipf() {
    double s = 0;
    for (int k = 1; k <= 600; ++k) cdf.push_back(s += 1.0 / std::pow(k, 1.1));
    for (double& c : cdf) c /= s;
  }
  uint64_t Id(uint64_t rank) const {
    uint64_t x = rank * 0x9e3779b97f4a7c15ULL + 12345;
    x ^= x >> 29;
    return x * 0xbf58476d1ce4e5b9ULL;
  }
  std::vector<uint64_t> Batch(int rank, int round, int n) const {
    std::mt19937_64 rng(static_cast<uint64_t>(rank) * 1000003 + static_cast<uint64_t>(round));
    std::vector<uint64_t> ids;
    for (int i = 0; i < n; ++i) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      ids.push_back(
          Id(static_cast<uint64_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin())));
    }
    return ids;
  }
};

inline std::vector<float> Grads(const std::vector<uint64_t>& ids, int64_t width, int rank,
                                int round) {
  std::vector<float> g(ids.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < width; ++c)
      g[i * static_cast<size_t>(width) + static_cast<size_t>(c)] =
          static_cast<float>(static_cast<int>((ids[i] >> 7) % 17 + c * 3 + rank * 5 + round) % 11 -
                             5) /
          8.0f;
  return g;
}

inline pskv::NDArray IdsArray(const std::vector<uint64_t>& ids) {
  pskv::NDArray a(pskv::Shape{static_cast<int64_t>(ids.size())}, pskv::DType::kInt64);
  std::memcpy(a.raw(), ids.data(), ids.size() * 8);
  return a;
}
inline pskv::NDArray Floats(const std::vector<float>& v, int64_t width) {
  pskv::NDArray a(pskv::Shape{static_cast<int64_t>(v.size()) / width, width},
                  pskv::DType::kFloat32);
  std::memcpy(a.raw(), v.data(), v.size() * 4);
  return a;
}

}  // namespace embedding_job
