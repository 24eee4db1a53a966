// pskv-bench embedding: how many rows per second one core updates in a dynamic
// embedding table (src/embedding/table.h), the server-side half of issue 41's bench (a).
//
// A shard of `--width` float32 rows (AdaGrad unless --optimizer), pushed batches of
// ids drawn from a Zipf(--zipf) law over --ids ids spread over the u64 space, each
// batch de-duplicated as a worker's push is (the forward pass pulls unique ids).
// Warm-up: every batch once (the rows exist); timed: --pushes pushes, median of 3.
// Reported against OSDI 2014's 1.1 G key updates/s on 960 cores (1.15 M per core),
// the goal (2 M per core), and two ceilings of the same run: memcpy of the
// same gradient bytes into the rows' places of a dense array (scatter, as the update's
// writes; as many rows as the table holds) and one contiguous memcpy of them.
#include "bench/embedding_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/bench_util.h"
#include "embedding/table.h"

namespace pskv::bench {

namespace {
using Clock = std::chrono::steady_clock;

double Seconds(const std::function<void()>& fn) {
  return Median(3, fn);  // one warm-up call, then the median of 3
}
}  // namespace

int BenchEmbedding(int argc, char** argv) {
  const int64_t universe = ArgInt(argc, argv, "--ids", 1 << 20);
  const int64_t width = ArgInt(argc, argv, "--width", 64);
  const int64_t draws = ArgInt(argc, argv, "--batch", 8192);
  const int64_t pushes = ArgInt(argc, argv, "--pushes", 200);
  const double s = std::stod(ArgStr(argc, argv, "--zipf", "1.05"));
  const std::string opts = ArgStr(argc, argv, "--optimizer", "adagrad,sgd,adam");
  const bool json = HasFlag(argc, argv, "--json");

  // Zipf batches: ranks by inverse CDF, ids = a bijective mix of the rank.
  std::vector<double> cdf(static_cast<size_t>(universe));
  double sum = 0;
  for (int64_t k = 0; k < universe; ++k)
    cdf[static_cast<size_t>(k)] = sum += 1.0 / std::pow(double(k + 1), s);
  std::mt19937_64 rng(1);
  const int kBatches = 32;
  std::vector<std::vector<uint64_t>> ids(kBatches), ranks(kBatches);
  int64_t rows_per_cycle = 0;
  std::unordered_map<uint64_t, uint64_t> place;  // rank -> row of the dense array
  for (int b = 0; b < kBatches; ++b) {
    std::vector<uint64_t> r;
    for (int64_t i = 0; i < draws; ++i) {
      const double u = std::uniform_real_distribution<double>(0, sum)(rng);
      r.push_back(static_cast<uint64_t>(std::min<int64_t>(
          std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), universe - 1)));
    }
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
    std::shuffle(r.begin(), r.end(), rng);
    for (uint64_t k : r) ids[b].push_back(embedding::Mix64(k * 0x9e3779b97f4a7c15ULL + 1));
    // The ceiling's row of a rank: its place among the distinct ranks in order of
    // first appearance (the order the table creates rows in), so both hold as many rows.
    for (uint64_t& k : r) {
      k = place.emplace(k, place.size()).first->second;
    }
    ranks[b] = std::move(r);
    rows_per_cycle += static_cast<int64_t>(ids[b].size());
  }
  const size_t max_rows = std::max_element(ids.begin(), ids.end(), [](auto& a, auto& b) {
                            return a.size() < b.size();
                          })->size();
  std::vector<float> grads(max_rows * static_cast<size_t>(width));
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 101) * 1e-3f - 0.05f;
  const double rows_timed =
      static_cast<double>(rows_per_cycle) * static_cast<double>(pushes) / kBatches;

  // Ceilings: the same gradient bytes, memcpy'd to each row's place in a dense array
  // of the distinct ids' rows (no hashing), and contiguously.
  std::vector<float> dense(place.size() * static_cast<size_t>(width));
  std::vector<float> flat(max_rows * static_cast<size_t>(width));
  const size_t rb = static_cast<size_t>(width) * sizeof(float);
  const double scatter_s = Seconds([&] {
    for (int64_t p = 0; p < pushes; ++p) {
      const auto& r = ranks[static_cast<size_t>(p % kBatches)];
      for (size_t i = 0; i < r.size(); ++i)
        std::memcpy(dense.data() + r[i] * static_cast<uint64_t>(width),
                    grads.data() + i * static_cast<size_t>(width), rb);
    }
  });
  const double flat_s = Seconds([&] {
    for (int64_t p = 0; p < pushes; ++p)
      std::memcpy(flat.data(), grads.data(), ranks[static_cast<size_t>(p % kBatches)].size() * rb);
  });
  const double scatter_rate = rows_timed / scatter_s, flat_rate = rows_timed / flat_s;

  if (!json)
    std::printf(
        "embedding: one table shard, one thread; rows of %lld float32; Zipf(%.2f) over %lld ids, "
        "batches of %lld draws de-duplicated (%.0f rows per push on average)\n"
        "anchor: OSDI 2014, 1.1e9 key updates/s on 960 cores = 1.15 M/s per core; goal >= 2 M/s\n"
        "ceilings, same run: memcpy of the gradient rows to their places in a dense array "
        "(scatter) %.2f M rows/s, contiguous %.2f M rows/s\n",
        static_cast<long long>(width), s, static_cast<long long>(universe),
        static_cast<long long>(draws), static_cast<double>(rows_per_cycle) / kBatches,
        scatter_rate / 1e6, flat_rate / 1e6);
  std::vector<std::string> list;
  for (size_t at = 0; at <= opts.size();) {
    const size_t comma = std::min(opts.find(',', at), opts.size());
    list.push_back(opts.substr(at, comma - at));
    at = comma + 1;
  }
  if (json) std::printf("[");
  for (size_t o = 0; o < list.size(); ++o) {
    embedding::TableConfig cfg;
    cfg.width = width;
    cfg.optimizer = OptimizerConfig::For(list[o]);
    embedding::Table table(cfg);
    int64_t step = 0;
    for (int b = 0; b < kBatches; ++b)  // warm-up: every row exists
      table.Push(++step, ids[b].data(), static_cast<int64_t>(ids[b].size()), grads.data());
    const double t = Seconds([&] {
      for (int64_t p = 0; p < pushes; ++p) {
        const auto& b = ids[static_cast<size_t>(p % kBatches)];
        table.Push(++step, b.data(), static_cast<int64_t>(b.size()), grads.data());
      }
    });
    const double rate = rows_timed / t;
    const embedding::TableStats st = table.Stats();
    const double per_row = static_cast<double>(st.memory_bytes) / static_cast<double>(st.live);
    if (json) {
      std::printf(
          "%s{\"optimizer\":\"%s\",\"rows_per_s\":%.0f,\"scatter_memcpy_rows_per_s\":%.0f,"
          "\"anchor_rows_per_s\":1150000,\"live\":%lld,\"bytes_per_row\":%.1f}",
          o ? "," : "", list[o].c_str(), rate, scatter_rate, static_cast<long long>(st.live),
          per_row);
    } else {
      std::printf(
          "  %-8s %6.2f M rows/s per core = %.2fx OSDI 2014's 1.15 M, %.2fx the 2 M goal, "
          "%.2f of the scatter memcpy; %lld live rows, %.0f bytes each (values %lld + state "
          "%lld + header/index %.0f)\n",
          list[o].c_str(), rate / 1e6, rate / 1.15e6, rate / 2e6, rate / scatter_rate,
          static_cast<long long>(st.live), per_row, static_cast<long long>(rb),
          static_cast<long long>(rb) * table.slots(),
          per_row - static_cast<double>(rb) * (1 + table.slots()));
    }
  }
  if (json) std::printf("]\n");
  return 0;
}

}  // namespace pskv::bench
