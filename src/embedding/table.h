// A dynamic embedding table: one shard of it (issue 41 items 1-4, 6, 9).
//
// Start here. A Table maps u64 ids (the whole u64 space; int64 on the API, the bits
// taken as they are) to rows of `width` float32 values. A row appears on its id's
// first admitted push, filled by a deterministic per-id initializer, and carries its
// optimizer state (SGD momentum, AdaGrad history, Adam moments and step count) in the
// same contiguous block, so state is created, saved and evicted with its row. A
// table is sharded by ShardOf(id, S): each server (or server thread) owns one Table.
//
// Semantics (docs/embedding.md):
//  * Push(step, ids, grads): duplicate ids in one push are summed (in order of
//    appearance) and update their row once. Each occurrence of an id whose row does
//    not exist is a sighting; the occurrence that brings an id's sightings to
//    `admit_after` creates the row (initializer values, zero state) and its gradient
//    (with the later ones of the push) is applied; earlier gradients are dropped and
//    counted (Stats::dropped_grads).
//  * Pull(ids, out): live rows are copied; an id without a row reads the
//    initializer's value (or zeros, `unadmitted_pull`). A pull never creates a row,
//    never counts as a sighting and does not refresh a row's age.
//  * Lazy updates: a row is updated only on the pushes that carry it, with its own
//    step count t (lazy Adam, as TF's LazyAdam and TorchRec), by pskv's own element
//    functions (device/kernel_ops.h), so a row pushed on k steps equals
//    pskv::Optimizer applied to that row on those k steps, bit for bit. The learning
//    rate is the schedule's at the push's `step`.
//  * Eviction: a row not pushed for `ttl_steps` steps is removed (swept every
//    max(1, ttl_steps/8) steps, at the start of a push). With `capacity` > 0, a push
//    that would exceed it first evicts the least recently pushed rows (LRU by the step
//    of the last push, ties by id), down to capacity - capacity/32, never a row of
//    the push itself.
//  * Budget: with `max_bytes` > 0 a push that would take the table over it is refused
//    whole (UsageError naming the fixes) before anything changes.
//
// Thread-safety: none inside. One Table is one shard and must be used by one thread at
// a time, as the server's ShardPool runs one shard's tasks (kvstore/distributed/
// server/shard_pool.h): route every id with ShardOf(id, shards) to one shard's thread.
// Determinism: a table's content depends only on its configuration and the sequence
// of calls (no addresses, no clocks), so replicas and restarts agree.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "embedding/admission.h"
#include "embedding/id_map.h"
#include "pskv/embedding.h"
#include "pskv/ndarray.h"
#include "pskv/optimizer.h"

namespace pskv::embedding {

/// The shard of `id` among `num_shards` (>= 1): a 64-bit mix of the id, reduced by a
/// multiply-high, so sequential ids, ids that are multiples of 2^32 and other
/// structured ids spread evenly. Independent of the table's row hashing.
uint32_t ShardOf(uint64_t id, uint32_t num_shards);

/// The per-id initializer and a table's configuration (include/pskv/embedding.h).
using Initializer = pskv::EmbeddingInitializer;
using TableConfig = pskv::EmbeddingConfig;

/// Counters of one shard (for metrics: the server exports them).
struct TableStats {
  int64_t live = 0;              ///< rows now
  int64_t admitted = 0;          ///< rows created (restores count as admitted)
  int64_t evicted_ttl = 0;       ///< rows removed by the TTL sweep
  int64_t evicted_capacity = 0;  ///< rows removed to stay under capacity
  int64_t dropped_grads = 0;     ///< gradient rows dropped before admission
  int64_t pulled_rows = 0;       ///< pulled ids that had a row
  int64_t pulled_defaults = 0;   ///< pulled ids that read the initializer / zeros
  int64_t pending_ids = 0;       ///< ids counted by the exact admission counter
  uint64_t memory_bytes = 0;     ///< allocated: row blocks, index, admission
  uint64_t row_bytes = 0;        ///< one row's block: header + values + optimizer state
};

/// The files of one saved shard, in order: a full save, then its deltas.
struct SavedShard {
  std::string full;
  std::vector<std::string> deltas;
};

class Table {
 public:
  /// Checks the configuration: InvalidArgument naming the field (width <= 0, a dtype
  /// other than float32, a registered or unknown optimizer, per-key fields, admission
  /// out of range, a capacity whose rows alone exceed max_bytes).
  explicit Table(TableConfig cfg);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  const TableConfig& config() const { return cfg_; }

  /// One push of `n` gradient rows (grads: n * width float32, row-major) for `ids`
  /// at `step` (>= 0; the caller's clock, e.g. the server's push count of the table).
  void Push(int64_t step, const uint64_t* ids, int64_t n, const float* grads);
  /// The same from arrays, checked: ids int64 of any shape (n elements), grads
  /// float32 (n, width). InvalidArgument for ids of another dtype, ShapeError for
  /// gradients of another dtype or width.
  void Push(int64_t step, const NDArray& ids, const NDArray& grads);
  /// Rows of `n` ids into out (n * width float32).
  void Pull(const uint64_t* ids, int64_t n, float* out);
  /// The same from arrays: out float32 (n, width), checked as Push's.
  void Pull(const NDArray& ids, NDArray* out);

  /// Removes the rows not pushed for ttl_steps by `now` (also done by Push).
  void ExpireRows(int64_t now);

  TableStats Stats() const;
  bool Contains(uint64_t id) const;
  /// A live row's values, optimizer state (slots * width), update count and the step
  /// of its last push; false if `id` has no row.
  struct RowView {
    const float* values = nullptr;
    const float* state = nullptr;
    int64_t t = 0, last_step = 0;
  };
  bool Row(uint64_t id, RowView* out) const;
  /// Calls fn for every live row, in no particular order.
  void ForEachRow(const std::function<void(uint64_t id, const RowView&)>& fn) const;
  int slots() const { return slots_; }
  /// The admission state (exact counter or filter), read-only: for checks and metrics.
  const Admission& admission() const { return admission_; }

  // ---- checkpoints (table_io.cc; format: docs/embedding.md)
  /// Writes every live row, its state and the admission state to `path` (temporary
  /// file, CRC32C, rename), as shard `shard` of `num_shards`, and starts a new delta
  /// chain. IOError naming the file if it cannot be written.
  void SaveFull(const std::string& path, uint32_t shard = 0, uint32_t num_shards = 1);
  /// Writes the rows pushed or created since the last save, the ids evicted since
  /// then, and the admission state changed since then (the exact counter's changed
  /// entries, the filter's changed counters). UsageError without a SaveFull (or
  /// Restore) first.
  void SaveDelta(const std::string& path);
  /// Replaces this table's content with shard `shard` of `num_shards` of a table
  /// saved by saved.size() shards (each a full save and its deltas, in order): rows
  /// whose ShardOf(id, num_shards) is `shard`. With the same shard count the result
  /// is the saved shard bit for bit (rows, state, counters, admission). IOError naming
  /// the file and the fix for a corrupt, cut, misordered or foreign file; ShapeError /
  /// UsageError when the saved table's width, dtype or optimizer differ. On error the
  /// table is left as it was.
  void Restore(const std::vector<SavedShard>& saved, uint32_t shard = 0, uint32_t num_shards = 1);
  /// Writes the live rows (id -> values; no state) for serving: "PSKVEMX1", width,
  /// count, (u64 id, width float32) each, CRC32C; temporary file and rename.
  void ExportRows(const std::string& path) const;

 private:
  // A row block's header; the row's values and optimizer state follow it.
  struct Head {
    uint64_t id;
    int64_t last_step;  // of the last push
    int64_t t;          // updates so far (Adam's bias correction)
    uint32_t flags;     // kLive, kDirty
    uint32_t pad;
  };
  static_assert(sizeof(Head) == 32);
  static constexpr uint32_t kLive = 1, kDirty = 2;
  struct Target;
  struct Chunk;
  Head* HeadAt(uint32_t slot) const;
  float* ValuesAt(uint32_t slot) const;
  uint32_t AllocSlot();
  void FreeRow(uint32_t slot);
  uint32_t CreateRow(uint64_t id, int64_t step);
  void MarkDirty(uint32_t slot);
  void EvictForCapacity(int64_t needed);
  uint64_t ProjectedBytes(int64_t rows) const;
  // Push's steps: resolve each id (nothing changes), check the room (capacity, budget;
  // returns the rows to evict), then commit.
  struct Resolved {
    int64_t creates = 0, dropped = 0, new_pending = 0, unrowed = 0;
  };
  Resolved Resolve(const uint64_t* ids, int64_t n, const float* grads);
  int64_t CheckRoom(const Resolved& r) const;
  void Commit(int64_t step, const uint64_t* ids, int64_t n, const float* grads, int64_t evict,
              int64_t dropped);
  void ApplyUpdates(int64_t step, const float* grads);
  void Clear();
  // Restore's steps (table_io.cc).
  struct Restoring;
  void PutRow(uint64_t id, int64_t last_step, int64_t t, const float* values_and_state);
  void DropRow(uint64_t id);
  void SwapContent(Table& o);

  TableConfig cfg_;
  int kind_ = 0;       // kops::UpdateKind
  int slots_ = 0;      // optimizer state buffers per row
  size_t stride_ = 0;  // bytes per row block
  std::vector<std::unique_ptr<Chunk>> chunks_;
  uint32_t top_ = 0;            // slots ever handed out
  std::vector<uint32_t> free_;  // freed slots
  IdMap index_;                 // id -> slot + 1
  Admission admission_;
  int64_t step_ = 0;        // the largest push step seen
  int64_t last_sweep_ = 0;  // of the TTL sweep
  TableStats stats_;
  // Checkpoint chain: rows dirty since the last save, ids evicted since then.
  std::vector<uint32_t> dirty_;
  std::vector<uint64_t> evicted_;
  uint64_t lineage_ = 0;  // of the last full save (0: none yet)
  uint64_t seq_ = 0;      // of the last save in that chain
  uint32_t saved_shard_ = 0, saved_shards_ = 1;
  // Per-push scratch (kept to avoid allocation per push).
  IdMap batch_;
  std::vector<Target> targets_;
  std::vector<float> acc_;
};

/// Reads a Table::ExportRows file: fn(id, values, width) for each row. IOError if
/// corrupt (table_io.cc).
void ReadExportFile(const std::string& path,
                    const std::function<void(uint64_t, const float*, int64_t width)>& fn);

}  // namespace pskv::embedding
