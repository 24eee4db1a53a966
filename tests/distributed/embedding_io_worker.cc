// A worker of the dist embedding tables' cache and checkpoint jobs
// (test_dist_embedding.cc), started by pskv-launch with W workers and S servers:
//
//   embedding_io_worker SCENARIO DIR ROUNDS [NEEDLE]
//
//  cache    dist_sync; four tables of one configuration (AdaGrad, admission after 2
//           sightings, a TTL of 3 steps) pushed the same gradients: no cache, and
//           caches with S = 0, 2, 8. Each round every worker pulls its Zipf batch from
//           each, then pushes. Every worker computes one embedding::Table pushed the
//           workers' de-duplicated batches in rank order, and snapshots its rows of
//           every id before each round: the uncached and S = 0 pulls must equal the
//           snapshot of their round bit for bit, an S > 0 pull of round t the snapshot
//           of some round in [t - S, t] (and some must be stale: the bound is used).
//           The pulls' bytes must fall with S (S = 0: exactly the uncached bytes), and
//           the tables' counters (Stats) equal the reference's.
//  save     ROUNDS (12) rounds of one table (as above); Save(kFull) after round 4,
//           Save(kDelta) after 6 and 8; rank 0 writes the rows and versions of every
//           id after rounds 8 and 12 to DIR/expected8.bin, DIR/expected12.bin; then
//           Export into DIR/export, read back against the live rows.
//  restore  Restore(DIR) on any server count: the rows and versions must be those of
//           DIR/expected8.bin, the step 8; rounds 8..11 again give expected12.bin bit
//           for bit (the optimizer state, admission and TTL clocks were restored).
//  broken   Restore(DIR) must fail with an IOError whose message contains NEEDLE on
//           every worker, the table left as it was (no rows).
// Exit status 0 = every check passed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "embedding/batch.h"
#include "embedding/table.h"
#include "pskv/embedding.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"

using namespace pskv;

namespace {

int g_failures = 0;
void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "embedding_io_worker: CHECK FAILED: %s\n", what.c_str());
    ++g_failures;
  }
}

constexpr int kRanks = 600;
constexpr int64_t kWidth = 8;

uint64_t IdOf(uint64_t rank) {
  uint64_t x = rank * 0x9e3779b97f4a7c15ULL + 777;
  x ^= x >> 29;
  return x * 0xbf58476d1ce4e5b9ULL;
}
std::vector<uint64_t> Universe() {
  std::vector<uint64_t> ids;
  for (int k = 0; k < kRanks; ++k) ids.push_back(IdOf(static_cast<uint64_t>(k)));
  return ids;
}
// Zipf(1.1) over kRanks ranks: a function of (rank, round).
std::vector<uint64_t> Batch(int rank, int round, int n) {
  static const std::vector<double> cdf = [] {
    std::vector<double> c;
    double s = 0;
    for (int k = 1; k <= kRanks; ++k) c.push_back(s += 1.0 / std::pow(k, 1.1));
    for (double& x : c) x /= s;
    return c;
  }();
  std::mt19937_64 rng(static_cast<uint64_t>(rank) * 1000003 + static_cast<uint64_t>(round));
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    ids.push_back(
        IdOf(static_cast<uint64_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin())));
  }
  return ids;
}
std::vector<float> Grads(const std::vector<uint64_t>& ids, int rank, int round) {
  std::vector<float> g(ids.size() * kWidth);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < kWidth; ++c)
      g[i * kWidth + static_cast<size_t>(c)] =
          static_cast<float>(static_cast<int>((ids[i] >> 7) % 17 + c * 3 + rank * 5 + round) % 11 -
                             5) /
          8.0f;
  return g;
}
NDArray IdsArray(const std::vector<uint64_t>& ids) {
  NDArray a(Shape{static_cast<int64_t>(ids.size())}, DType::kInt64);
  std::memcpy(a.raw(), ids.data(), ids.size() * 8);
  return a;
}
NDArray Floats(const std::vector<float>& v) {
  NDArray a(Shape{static_cast<int64_t>(v.size()) / kWidth, kWidth}, DType::kFloat32);
  std::memcpy(a.raw(), v.data(), v.size() * 4);
  return a;
}

EmbeddingConfig Config() {
  EmbeddingConfig c;
  c.name = "io";
  c.width = kWidth;
  c.seed = 5;
  c.optimizer = OptimizerConfig::For("adagrad");
  c.optimizer.learning_rate = 0.1;
  c.admission.admit_after = 2;
  c.ttl_steps = 3;
  return c;
}

// Round `r` of every worker, concatenated in rank order (de-duplicated per worker),
// pushed to `ref` at step r.
void PushReference(embedding::Table& ref, int workers, int r) {
  std::vector<uint64_t> all;
  std::vector<float> sums;
  for (int w = 0; w < workers; ++w) {
    const auto ids = Batch(w, r, 64);
    const auto g = Grads(ids, w, r);
    const auto d = embedding::DistinctOf(ids.data(), static_cast<int64_t>(ids.size()));
    const auto s = embedding::SumGrads(d, g.data(), static_cast<int64_t>(ids.size()), kWidth);
    all.insert(all.end(), d.ids.begin(), d.ids.end());
    sums.insert(sums.end(), s.begin(), s.end());
  }
  ref.Push(r, all.data(), static_cast<int64_t>(all.size()), sums.data());
}

void Cache(KVStore& kv, int rounds) {
  const int W = kv.NumWorkers(), rank = kv.Rank();
  const std::vector<int64_t> staleness = {-1, 0, 2, 8};  // -1: no cache
  std::vector<std::unique_ptr<EmbeddingTable>> tables;
  for (size_t k = 0; k < staleness.size(); ++k) {
    EmbeddingCacheConfig cc;
    if (staleness[k] >= 0) {
      cc.capacity = 256;
      cc.staleness = staleness[k];
    }
    tables.push_back(EmbeddingTable::Create(kv, 70 + static_cast<int>(k), Config(), cc));
  }
  embedding::Table ref(Config());
  const auto universe = Universe();
  std::map<uint64_t, size_t> at;
  for (size_t i = 0; i < universe.size(); ++i) at[universe[i]] = i;
  std::vector<std::vector<float>> snap;  // per round: every id's row before its pushes
  int64_t stale = 0;
  for (int r = 0; r < rounds; ++r) {
    snap.emplace_back(universe.size() * kWidth);
    ref.Pull(universe.data(), static_cast<int64_t>(universe.size()), snap.back().data());
    const auto ids = Batch(rank, r, 64);
    std::vector<NDArray> got;
    for (auto& t : tables) got.push_back(t->Pull(IdsArray(ids)));
    for (size_t k = 0; k < tables.size(); ++k) {
      const int64_t S = std::max<int64_t>(0, staleness[k]);
      int bad = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        const float* row = got[k].data<float>() + i * kWidth;
        bool ok = false;
        for (int64_t f = r; f >= std::max<int64_t>(0, r - S) && !ok; --f)
          ok = std::memcmp(row, snap[static_cast<size_t>(f)].data() + at[ids[i]] * kWidth,
                           kWidth * 4) == 0;
        bad += !ok;
        if (ok && std::memcmp(row, snap.back().data() + at[ids[i]] * kWidth, kWidth * 4) != 0)
          ++stale;
      }
      Check(bad == 0, "round " + std::to_string(r) + ", S = " + std::to_string(staleness[k]) +
                          ": " + std::to_string(bad) +
                          " rows are not the servers' row of a step in [t - S, t]");
    }
    Check(std::memcmp(got[0].raw(), got[1].raw(), got[0].size() * 4) == 0,
          "round " + std::to_string(r) + ": S = 0 differs from the uncached pull");
    const auto g = Grads(ids, rank, r);
    for (auto& t : tables) t->Push(IdsArray(ids), Floats(g));
    PushReference(ref, W, r);
  }
  Check(stale > 0, "no stale row was served with S > 0: the bound was not used");
  std::vector<EmbeddingStats> st;
  for (auto& t : tables) st.push_back(t->Stats());
  for (size_t k = 0; k < tables.size(); ++k)
    std::printf(
        "embedding_io_worker[%d]: S = %lld: %.0f pull bytes received per step, %lld "
        "cache hits, %lld rows cached\n",
        rank, static_cast<long long>(staleness[k]),
        static_cast<double>(st[k].pull_bytes_received) / rounds,
        static_cast<long long>(st[k].cache_hits), static_cast<long long>(st[k].cache_rows));
  Check(st[1].pull_bytes_received == st[0].pull_bytes_received &&
            st[1].pull_bytes_sent == st[0].pull_bytes_sent,
        "S = 0 moved other bytes than no cache");
  Check(st[2].pull_bytes_received < st[1].pull_bytes_received &&
            st[3].pull_bytes_received < st[2].pull_bytes_received,
        "the pulls' bytes do not fall with S");
  Check(st[0].cache_rows == 0 && st[3].cache_hits > st[2].cache_hits, "cache counters");
  // The table's counters: the servers' parts summed equal the one reference table.
  const embedding::TableStats want = ref.Stats();
  for (size_t k = 0; k < tables.size(); ++k) {
    const EmbeddingStats& s = st[k];
    Check(s.live == want.live && s.admitted == want.admitted && s.evicted_ttl == want.evicted_ttl &&
              s.dropped_grads == want.dropped_grads && s.pending_ids == want.pending_ids &&
              s.step == rounds && s.memory_bytes > 0,
          "table " + std::to_string(70 + k) + " counters: live " + std::to_string(s.live) + "/" +
              std::to_string(want.live) + ", admitted " + std::to_string(s.admitted) + "/" +
              std::to_string(want.admitted) + ", evicted " + std::to_string(s.evicted_ttl) + "/" +
              std::to_string(want.evicted_ttl) + ", dropped " + std::to_string(s.dropped_grads) +
              "/" + std::to_string(want.dropped_grads) + ", step " + std::to_string(s.step));
  }
  Check(want.dropped_grads > 0 && want.evicted_ttl > 0, "no admission drop or TTL eviction");
}

// Every id's rows and versions, as bytes.
std::string Snapshot(EmbeddingTable& t) {
  const auto universe = Universe();
  NDArray versions;
  const NDArray rows = t.Pull(IdsArray(universe), &versions);
  return std::string(static_cast<const char*>(rows.raw()), rows.size() * 4) +
         std::string(static_cast<const char*>(versions.raw()), versions.size() * 8);
}
std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void Round(KVStore& kv, EmbeddingTable& t, int r) {
  const auto ids = Batch(kv.Rank(), r, 64);
  t.Push(IdsArray(ids), Floats(Grads(ids, kv.Rank(), r)));
}

void Save(KVStore& kv, const std::string& dir, int rounds) {
  auto t = EmbeddingTable::Create(kv, 80, Config());
  std::vector<uint64_t> bytes;
  for (int r = 0; r < rounds; ++r) {
    Round(kv, *t, r);
    if (r + 1 == 4) bytes.push_back(t->Save(dir, EmbeddingSaveKind::kFull));
    if (r + 1 == 6 || r + 1 == 8) bytes.push_back(t->Save(dir, EmbeddingSaveKind::kDelta));
    if ((r + 1 == 8 || r + 1 == rounds) && kv.Rank() == 0)
      std::ofstream(dir + "/expected" + std::to_string(r + 1) + ".bin", std::ios::binary)
          << Snapshot(*t);
  }
  Check(bytes.size() == 3 && bytes[0] > 0 && bytes[1] > 0 && bytes[2] > 0,
        "Save returned no bytes");
  std::printf("embedding_io_worker[%d]: saved full %llu, deltas %llu and %llu bytes\n", kv.Rank(),
              static_cast<unsigned long long>(bytes[0]), static_cast<unsigned long long>(bytes[1]),
              static_cast<unsigned long long>(bytes[2]));
  const uint64_t exported = t->Export(dir + "/export");
  kv.Barrier();
  // The export holds exactly the live rows, with their values.
  const auto universe = Universe();
  NDArray versions;
  const NDArray rows = t->Pull(IdsArray(universe), &versions);
  std::map<uint64_t, std::vector<float>> live;
  for (size_t i = 0; i < universe.size(); ++i)
    if (versions.data<int64_t>()[i] >= 0)
      live[universe[i]].assign(rows.data<float>() + i * kWidth,
                               rows.data<float>() + (i + 1) * kWidth);
  size_t read = 0, differ = 0;
  EmbeddingTable::ReadExport(dir + "/export", 80, [&](uint64_t id, const float* v, int64_t w) {
    ++read;
    auto it = live.find(id);
    differ += w != kWidth || it == live.end() || std::memcmp(it->second.data(), v, kWidth * 4);
  });
  Check(read == live.size() && differ == 0 && exported > 0 &&
            static_cast<int64_t>(read) == t->Stats().live,
        "export: " + std::to_string(read) + " rows read, " + std::to_string(live.size()) +
            " live, " + std::to_string(differ) + " differ");
}

void Restore(KVStore& kv, const std::string& dir, int rounds) {
  auto t = EmbeddingTable::Create(kv, 80, Config());
  t->Restore(dir);
  Check(Snapshot(*t) == ReadFile(dir + "/expected8.bin"),
        "the restored rows and versions differ from those saved after round 8");
  Check(t->Stats().step == 8, "the restored step is not 8");
  for (int r = 8; r < rounds; ++r) Round(kv, *t, r);
  Check(Snapshot(*t) == ReadFile(dir + "/expected" + std::to_string(rounds) + ".bin"),
        "rounds 8.." + std::to_string(rounds - 1) +
            " after the restore differ from those of the saving job");
}

void Broken(KVStore& kv, const std::string& dir, const std::string& needle) {
  auto t = EmbeddingTable::Create(kv, 80, Config());
  try {
    t->Restore(dir);
    Check(false, "a broken save restored");
  } catch (const IOError& e) {
    Check(std::string(e.what()).find(needle) != std::string::npos,
          "the IOError does not name '" + needle + "': " + e.what());
    std::printf("embedding_io_worker[%d]: %s\n", kv.Rank(), e.what());
  } catch (const std::exception& e) {
    Check(false, std::string("another error than IOError: ") + e.what());
  }
  NDArray versions;
  t->Pull(IdsArray(Universe()), &versions);
  Check(std::all_of(versions.data<int64_t>(), versions.data<int64_t>() + versions.size(),
                    [](int64_t v) { return v == -1; }),
        "a failed restore changed the table");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: embedding_io_worker SCENARIO DIR ROUNDS [NEEDLE]\n");
    return 2;
  }
  const std::string scenario = argv[1], dir = argv[2];
  const int rounds = std::atoi(argv[3]);
  try {
    auto kv = KVStore::Create("dist_sync");
    if (scenario == "cache") {
      Cache(*kv, rounds);
    } else if (scenario == "save") {
      Save(*kv, dir, rounds);
    } else if (scenario == "restore") {
      Restore(*kv, dir, rounds);
    } else if (scenario == "broken" && argc > 4) {
      Broken(*kv, dir, argv[4]);
    } else {
      std::fprintf(stderr, "embedding_io_worker: unknown scenario %s\n", scenario.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embedding_io_worker: %s\n", e.what());
    return 1;
  }
  return g_failures ? 1 : 0;
}
