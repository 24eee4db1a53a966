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
//
// pskv-bench embedding --checkpoint: full save against delta bytes (issue 41 bench
// 8(d)) on a large, mostly idle table; --cache: the worker row cache's bytes fetched
// per step and hit rate against the staleness bound S (bench 8(c)), in-process.
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

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include "bench/bench_util.h"
#include "embedding/row_cache.h"
#include "embedding/table.h"

namespace pskv::bench {

namespace {
using Clock = std::chrono::steady_clock;

double Seconds(const std::function<void()>& fn) {
  return Median(3, fn);  // one warm-up call, then the median of 3
}

// Zipf(s) ranks over [0, universe) by inverse CDF; the id of a rank is a bijective mix.
class ZipfIds {
 public:
  ZipfIds(int64_t universe, double s, uint64_t seed) : rng_(seed) {
    cdf_.resize(static_cast<size_t>(universe));
    double sum = 0;
    for (int64_t k = 0; k < universe; ++k)
      cdf_[static_cast<size_t>(k)] = sum += 1.0 / std::pow(double(k + 1), s);
    for (double& c : cdf_) c /= sum;
  }
  static uint64_t IdOf(uint64_t rank) { return embedding::Mix64(rank * 0x9e3779b97f4a7c15ULL + 1); }
  /// `draws` ids, de-duplicated (a worker's unique ids), in order of first appearance.
  std::vector<uint64_t> Batch(int64_t draws) {
    std::vector<uint64_t> out;
    std::unordered_map<uint64_t, bool> seen;
    for (int64_t i = 0; i < draws; ++i) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
      const auto r = static_cast<uint64_t>(
          std::min<int64_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin(),
                            static_cast<int64_t>(cdf_.size()) - 1));
      if (seen.emplace(r, true).second) out.push_back(IdOf(r));
    }
    return out;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<double> cdf_;
};

std::vector<int64_t> IntList(const std::string& s) {
  std::vector<int64_t> out;
  for (size_t at = 0; at < s.size();) {
    const size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(std::stoll(s.substr(at, comma - at)));
    at = comma + 1;
  }
  return out;
}

uint64_t FileBytes(const std::string& path) {
  return std::filesystem::file_size(path);
}

// Bench 8(d): a table of --rows live rows (AdaGrad), admission on (exact counter or
// counting Bloom filter), then Zipf batches over --ids ids (more than the live rows:
// new ids keep arriving); after a full save, deltas every k steps for k in --intervals.
int BenchCheckpoint(int argc, char** argv) {
  const int64_t rows = ArgInt(argc, argv, "--rows", 1 << 20);
  const int64_t universe = ArgInt(argc, argv, "--ids", 4 * rows);
  const int64_t width = ArgInt(argc, argv, "--width", 64);
  const int64_t draws = ArgInt(argc, argv, "--batch", 8192);
  const double s = std::stod(ArgStr(argc, argv, "--zipf", "1.05"));
  const std::vector<int64_t> intervals = IntList(ArgStr(argc, argv, "--intervals", "1,10,100"));
  const std::string modes = ArgStr(argc, argv, "--admission", "exact,cbf");
  const bool json = HasFlag(argc, argv, "--json");
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("pskv_bench_ckpt_" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  if (!json)
    std::printf(
        "embedding checkpoints: %lld live rows of %lld float32 + AdaGrad state; Zipf(%.2f) "
        "batches of %lld draws over %lld ids (de-duplicated); admission after 2 sightings\n"
        "anchor: Check-N-Run (NSDI 2022) wrote 6-17x less with differential checkpoints\n",
        static_cast<long long>(rows), static_cast<long long>(width), s,
        static_cast<long long>(draws), static_cast<long long>(universe));
  if (json) std::printf("[");
  bool first = true;
  for (const char* m : {"exact", "cbf"}) {
    const std::string mode = m;
    if (modes.find(mode) == std::string::npos) continue;
    embedding::TableConfig cfg;
    cfg.width = width;
    cfg.optimizer = OptimizerConfig::For("adagrad");
    cfg.admission = mode == "exact" ? embedding::AdmissionConfig{}
                                    : embedding::AdmissionConfig::CountingBloom(
                                          2, static_cast<uint64_t>(2 * universe), 0.01);
    cfg.admission.admit_after = 2;
    embedding::Table table(cfg);
    // The live rows: ranks 0 .. rows-1, each pushed twice (admitted on the second).
    std::vector<float> grads(static_cast<size_t>(std::max<int64_t>(draws, 65536) * width));
    for (size_t i = 0; i < grads.size(); ++i)
      grads[i] = static_cast<float>(i % 101) * 1e-3f - 0.05f;
    int64_t step = 0;
    std::vector<uint64_t> ids;
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t r = 0; r < rows; r += 65536) {
        ids.clear();
        for (int64_t k = r; k < std::min(rows, r + 65536); ++k)
          ids.push_back(ZipfIds::IdOf(static_cast<uint64_t>(k)));
        table.Push(++step, ids.data(), static_cast<int64_t>(ids.size()), grads.data());
      }
    ZipfIds zipf(universe, s, 7);
    for (int k = 0; k < 20; ++k) {  // some pending ids before the full save
      ids = zipf.Batch(draws);
      table.Push(++step, ids.data(), static_cast<int64_t>(ids.size()), grads.data());
    }
    const std::string full = dir + "/full_" + mode;
    auto t0 = Clock::now();
    table.SaveFull(full);
    const double full_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const uint64_t full_bytes = FileBytes(full);
    const embedding::TableStats st0 = table.Stats();
    if (!json)
      std::printf(
          "  %s admission: full save %.1f MB in %.2f s (%lld live rows, %lld pending ids%s)\n",
          mode.c_str(), static_cast<double>(full_bytes) / 1e6, full_s,
          static_cast<long long>(st0.live), static_cast<long long>(st0.pending_ids),
          mode == "cbf" ? (", filter of " + std::to_string(cfg.admission.cbf_counters / 1000000) +
                           " M counters")
                              .c_str()
                        : "");
    int64_t seq = 0;
    for (int64_t k : intervals) {
      std::unordered_map<uint64_t, bool> touched;
      for (int64_t i = 0; i < k; ++i) {
        ids = zipf.Batch(draws);
        table.Push(++step, ids.data(), static_cast<int64_t>(ids.size()), grads.data());
        for (uint64_t id : ids)
          if (table.Contains(id)) touched.emplace(id, true);
      }
      const std::string delta = dir + "/delta_" + mode + "_" + std::to_string(++seq);
      t0 = Clock::now();
      table.SaveDelta(delta);
      const double delta_s = std::chrono::duration<double>(Clock::now() - t0).count();
      const uint64_t delta_bytes = FileBytes(delta);
      const double frac =
          static_cast<double>(touched.size()) / static_cast<double>(table.Stats().live);
      if (json)
        std::printf(
            "%s{\"admission\":\"%s\",\"steps\":%lld,\"rows_touched\":%zu,\"full_bytes\":%llu,"
            "\"delta_bytes\":%llu,\"ratio\":%.2f}",
            first ? "" : ",", mode.c_str(), static_cast<long long>(k), touched.size(),
            static_cast<unsigned long long>(full_bytes),
            static_cast<unsigned long long>(delta_bytes),
            static_cast<double>(full_bytes) / static_cast<double>(delta_bytes));
      else
        std::printf(
            "    delta after %4lld steps: %7zu rows touched (%5.2f %% of live), %8.2f MB "
            "in %.2f s: %6.1fx smaller than the full save\n",
            static_cast<long long>(k), touched.size(), 100 * frac,
            static_cast<double>(delta_bytes) / 1e6, delta_s,
            static_cast<double>(full_bytes) / static_cast<double>(delta_bytes));
      first = false;
    }
    // Checked: the full save and its deltas restore the live table (rows and state of
    // every 64th live row compared bit for bit, counts of live and pending ids).
    embedding::SavedShard files{full, {}};
    for (int64_t k = 1; k <= seq; ++k)
      files.deltas.push_back(dir + "/delta_" + mode + "_" + std::to_string(k));
    t0 = Clock::now();
    embedding::Table back(cfg);
    back.Restore({files});
    const double restore_s = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t checked = 0, differ = 0, n = 0;
    const size_t fl = static_cast<size_t>(width) * (1 + table.slots());
    table.ForEachRow([&](uint64_t id, const embedding::Table::RowView& r) {
      if (n++ % 64) return;
      embedding::Table::RowView q;
      ++checked;
      if (!back.Row(id, &q) || q.t != r.t || q.last_step != r.last_step ||
          std::memcmp(q.values, r.values, fl * sizeof(float)) != 0)
        ++differ;
    });
    const bool same = differ == 0 && back.Stats().live == table.Stats().live &&
                      back.Stats().pending_ids == table.Stats().pending_ids &&
                      back.admission().cbf() == table.admission().cbf();
    if (!json)
      std::printf("    restore of the full save + %lld deltas: %.2f s, %s (%lld rows compared)\n",
                  static_cast<long long>(seq), restore_s,
                  same ? "the live table's rows, counts and admission state" : "DIFFERENT",
                  static_cast<long long>(checked));
    if (!same) return 1;
  }
  if (json) std::printf("]\n");
  std::filesystem::remove_all(dir);
  return 0;
}

// Bench 8(c), in-process: one worker's cache of --cache-rows rows in front of a table;
// each step reads a Zipf batch through the cache (plan, pull the listed ids with their
// versions, fill, read) and pushes the batch's gradients to the table.
int BenchCache(int argc, char** argv) {
  const int64_t universe = ArgInt(argc, argv, "--ids", 1 << 20);
  const int64_t width = ArgInt(argc, argv, "--width", 64);
  const int64_t draws = ArgInt(argc, argv, "--batch", 8192);
  const int64_t capacity = ArgInt(argc, argv, "--cache-rows", 65536);
  const int64_t steps = ArgInt(argc, argv, "--steps", 200);
  const double s = std::stod(ArgStr(argc, argv, "--zipf", "1.05"));
  const std::vector<int64_t> bounds = IntList(ArgStr(argc, argv, "--staleness", "0,1,4,16"));
  const bool json = HasFlag(argc, argv, "--json");
  const double row_bytes = 4.0 * static_cast<double>(width);
  if (!json)
    std::printf(
        "embedding row cache: one worker, %lld cached rows of %lld float32 (LFU with aging); "
        "Zipf(%.2f) batches of %lld draws over %lld ids, de-duplicated; %lld steps after 20 "
        "warm-up steps; bytes = ids sent (8 each) + rows and versions received\n"
        "anchor: HET (VLDB 2022) cut embedding traffic by up to 88 %% with bounded staleness\n",
        static_cast<long long>(capacity), static_cast<long long>(width), s,
        static_cast<long long>(draws), static_cast<long long>(universe),
        static_cast<long long>(steps));
  if (json) std::printf("[");
  for (size_t b = 0; b < bounds.size(); ++b) {
    embedding::TableConfig tc;
    tc.width = width;
    tc.optimizer = OptimizerConfig::For("adagrad");
    embedding::Table table(tc);
    embedding::RowCache cache({width, capacity, bounds[b], 256});
    ZipfIds zipf(universe, s, 3);  // the same stream for every S
    std::vector<float> rows, out, grads;
    std::vector<int64_t> versions;
    double fetched = 0, uncached = 0;
    int64_t hits0 = 0, planned0 = 0;
    for (int64_t step = 0; step < 20 + steps; ++step) {
      if (step == 20) {
        hits0 = cache.Stats().hits;
        planned0 = cache.Stats().planned;
      }
      const std::vector<uint64_t> ids = zipf.Batch(draws);
      const std::vector<uint64_t>& fetch =
          cache.Plan(ids.data(), static_cast<int64_t>(ids.size()), step);
      rows.resize(fetch.size() * static_cast<size_t>(width));
      versions.assign(fetch.size(), -1);
      table.Pull(fetch.data(), static_cast<int64_t>(fetch.size()), rows.data());
      for (size_t i = 0; i < fetch.size(); ++i) {
        embedding::Table::RowView r;
        if (table.Row(fetch[i], &r)) versions[i] = r.last_step;
      }
      cache.Fill(fetch.data(), static_cast<int64_t>(fetch.size()), rows.data(), versions.data());
      out.resize(ids.size() * static_cast<size_t>(width));
      cache.Read(ids.data(), static_cast<int64_t>(ids.size()), out.data());
      grads.assign(out.size(), 1e-3f);
      table.Push(step, ids.data(), static_cast<int64_t>(ids.size()), grads.data());
      if (step >= 20) {
        fetched += static_cast<double>(fetch.size()) * (8 + row_bytes + 8);
        uncached += static_cast<double>(ids.size()) * (8 + row_bytes);
      }
    }
    const embedding::RowCacheStats st = cache.Stats();
    const double hit = static_cast<double>(st.hits - hits0) /
                       static_cast<double>(std::max<int64_t>(1, st.planned - planned0));
    const double per_step = fetched / static_cast<double>(steps);
    const double base = uncached / static_cast<double>(steps);
    if (json)
      std::printf(
          "%s{\"staleness\":%lld,\"hit_rate\":%.4f,\"bytes_per_step\":%.0f,"
          "\"uncached_bytes_per_step\":%.0f}",
          b ? "," : "", static_cast<long long>(bounds[b]), hit, per_step, base);
    else
      std::printf(
          "  S = %2lld: hit rate %5.1f %%, %7.3f MB fetched per step against %7.3f MB "
          "without a cache (%5.1f %% less), %lld rows cached\n",
          static_cast<long long>(bounds[b]), 100 * hit, per_step / 1e6, base / 1e6,
          100 * (1 - per_step / base), static_cast<long long>(st.cached));
  }
  if (json) std::printf("]\n");
  return 0;
}
}  // namespace

int BenchEmbedding(int argc, char** argv) {
  if (HasFlag(argc, argv, "--checkpoint")) return BenchCheckpoint(argc, argv);
  if (HasFlag(argc, argv, "--cache")) return BenchCache(argc, argv);
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
