// A worker's cache of hot embedding rows with bounded staleness (issue 41 item 5).
//
// Start here. A worker keeps up to `capacity` rows of a dynamic table (table.h), the
// ones it reads most, and serves reads from them; a cached row is refetched once it
// may be more than `staleness` (S) steps older than the servers' copy. Pushes always
// go to the servers: the cache never changes a row itself. The worker side of a
// training step calls, in order:
//   1. Plan(ids, step): the distinct ids of the batch whose rows must be fetched (not
//      cached, or cached from more than S steps ago);
//   2. the pull of those ids from the servers, which returns each row and its version
//      (the server step of its last update: Table::RowView::last_step; -1 for an id
//      without a row);
//   3. Fill(ids, rows, versions): the fetched rows, fresh as of the plan's step;
//   4. Read(ids, out): every id of the batch, from the cache.
//
// Staleness (HET's per-embedding clock, Miao et al., VLDB 2022, as the model): `step`
// is the worker's clock, the count of pushes the servers had applied when the step's
// reads are made; a row fetched at step f is the servers' row as of f, and Plan
// serves it at step t only while t - f <= S. So a row served at step t is the
// servers' row as of a step in [t - S, t]: S = 0 reads the servers' rows exactly (a
// row is fetched once per step, however often the step reads it), S = k lets a hot
// row be fetched once per k + 1 steps. The version of each cached row is kept
// (Version) for checks and for a later version check, where a row whose servers'
// version did not change could be renewed without moving its values.
//
// Policy: LFU with aging among the cached rows. Each distinct id a Plan holds counts
// one access of its row; counts halve every `aging_steps` steps (computed lazily), so
// rows that were hot long ago leave. When a Fill takes the cache over `capacity`,
// the rows with the fewest (aged) accesses go first, ties by the step of their last
// access (older first), then by id, down to capacity - capacity/32 (so sweeps are
// amortised), never a row of the current step: a batch with more distinct ids than
// the capacity is cached whole until the next Fill. Ids that are not cached have no
// count (an id enters with one access).
//
// Not thread-safe: one cache per worker (per table), used by one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "embedding/id_map.h"

namespace pskv::embedding {

struct RowCacheConfig {
  int64_t width = 64;         ///< float32 elements per row (the table's width)
  int64_t capacity = 65536;   ///< rows cached at most (between steps); >= 1
  int64_t staleness = 0;      ///< S: a row is served while fetched at most S steps ago
  int64_t aging_steps = 256;  ///< access counts halve every this many steps; >= 1
};

struct RowCacheStats {
  int64_t planned = 0;  ///< distinct ids planned (one per id and step)
  int64_t hits = 0;     ///< of those, served from the cache without a fetch
  int64_t fetched = 0;  ///< rows filled (missing or stale)
  int64_t evicted = 0;  ///< rows removed to stay under the capacity
  int64_t cached = 0;   ///< rows now
};

class RowCache {
 public:
  /// InvalidArgument for width <= 0, capacity < 1, staleness < 0 or aging_steps < 1.
  explicit RowCache(RowCacheConfig cfg);

  const RowCacheConfig& config() const { return cfg_; }

  /// The distinct ids of ids[0..n) (in order of first appearance) whose rows must be
  /// fetched at `step` (>= the previous plan's step): not cached, or fetched more than
  /// S steps before `step`. Counts one access of each distinct cached id. The list is
  /// valid until the next Plan.
  const std::vector<uint64_t>& Plan(const uint64_t* ids, int64_t n, int64_t step);
  /// Stores fetched rows (rows: n * width float32; versions: n, the servers' step of
  /// each row's last update) as fresh at the last plan's step, then evicts down to the
  /// capacity (never a row of that step). Ids not planned are stored too.
  void Fill(const uint64_t* ids, int64_t n, const float* rows, const int64_t* versions);
  /// The rows of ids[0..n) into out (n * width). UsageError for an id not cached (one
  /// the last Plan listed that Fill did not bring).
  void Read(const uint64_t* ids, int64_t n, float* out) const;

  bool Contains(uint64_t id) const { return index_.Find(id) != nullptr; }
  /// The version (servers' step of the last update) of a cached row; false if absent.
  bool Version(uint64_t id, int64_t* version, int64_t* fetched_step = nullptr) const;
  RowCacheStats Stats() const;

 private:
  struct Meta {
    uint64_t id;
    int64_t version;    // the servers' step of the row's last update
    int64_t fetched;    // the plan step it was filled at
    int64_t last_used;  // the last plan step that held it
    uint32_t count;     // accesses, aged to `epoch`
    uint32_t epoch;     // last_used / aging_steps when count was last aged
  };
  uint32_t Aged(const Meta& m, uint32_t epoch) const;
  void Evict();

  RowCacheConfig cfg_;
  IdMap index_;  // id -> slot + 1
  std::vector<Meta> meta_;
  std::vector<float> rows_;
  std::vector<uint32_t> free_;
  int64_t step_ = -1;  // of the last Plan
  std::vector<uint64_t> fetch_;
  IdMap batch_;  // Plan's de-duplication
  RowCacheStats stats_;
};

}  // namespace pskv::embedding
