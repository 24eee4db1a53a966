// Helpers of the embedding table tests.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "embedding/table.h"

namespace pskv::embedding::test {

/// A row as the table holds it: values and state (bits), update count, last push.
struct RowCopy {
  std::vector<uint32_t> bits;
  int64_t t = 0, last_step = 0;
  bool operator==(const RowCopy&) const = default;
};

inline std::map<uint64_t, RowCopy> Snapshot(const Table& table) {
  std::map<uint64_t, RowCopy> out;
  const int64_t n = table.config().width * (1 + table.slots());
  table.ForEachRow([&](uint64_t id, const Table::RowView& r) {
    RowCopy c;
    c.bits.resize(static_cast<size_t>(n));
    std::memcpy(c.bits.data(), r.values, static_cast<size_t>(n) * 4);  // values, then state
    c.t = r.t;
    c.last_step = r.last_step;
    out[id] = std::move(c);
  });
  return out;
}

/// The admission state by content: the exact counter (id -> count, last step seen)
/// and the counting Bloom filter's counters.
struct AdmissionCopy {
  std::map<uint64_t, std::pair<uint32_t, uint32_t>> exact;
  std::vector<uint8_t> cbf;
  bool operator==(const AdmissionCopy&) const = default;
};

inline AdmissionCopy AdmissionState(const Table& table) {
  AdmissionCopy c;
  table.admission().exact().ForEach([&](const IdMap::Entry& e) { c.exact[e.id] = {e.a, e.b}; });
  c.cbf = table.admission().cbf();
  return c;
}

/// Ids drawn from a Zipf(s) law over [0, universe), scrambled over the u64 space so
/// that hot ids are not small numbers (inverse CDF over a precomputed table).
class Zipf {
 public:
  Zipf(uint64_t universe, double s, uint64_t seed) : rng_(seed) {
    cdf_.resize(universe);
    double sum = 0;
    for (uint64_t k = 0; k < universe; ++k) cdf_[k] = sum += 1.0 / std::pow(double(k + 1), s);
    for (double& c : cdf_) c /= sum;
  }
  uint64_t Rank() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    return static_cast<uint64_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }
  /// A u64 id for a rank: spread over the whole space (bijective).
  static uint64_t IdOf(uint64_t rank) { return Mix64(rank * 0x9e3779b97f4a7c15ULL + 1); }
  uint64_t Next() { return IdOf(std::min<uint64_t>(Rank(), cdf_.size() - 1)); }

 private:
  std::mt19937_64 rng_;
  std::vector<double> cdf_;
};

inline std::string TempPath(const std::string& name) {
  static const std::string dir = [] {
    auto d =
        std::filesystem::temp_directory_path() / ("pskv_embedding_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir + "/" + name;
}

}  // namespace pskv::embedding::test
