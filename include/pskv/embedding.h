// Dynamic embedding tables (issue 41): tables keyed by u64 ids that grow on first use.
//
// Start here. An EmbeddingTable maps ids from the whole u64 space (int64 on the API,
// the bits taken as they are) to rows of `width` float32 values. There is no row
// count to declare: a row appears when its id is admitted (after `admit_after`
// sightings in pushes), filled by a deterministic per-id initializer, and leaves when
// it is not pushed for `ttl_steps` steps or when its shard is over `capacity` (least
// recently pushed first). Each row carries its own optimizer state (SGD momentum,
// AdaGrad history, Adam moments and step count) and is updated lazily, only on the
// pushes that carry it, with pskv's own update rules (bit-equal to pskv::Optimizer
// applied to that row). docs/embedding.md describes the semantics.
//
//   auto kv = pskv::KVStore::Create("dist_sync");
//   pskv::EmbeddingConfig cfg;
//   cfg.width = 16;
//   cfg.optimizer = pskv::OptimizerConfig::For("adagrad");
//   auto table = pskv::EmbeddingTable::Create(*kv, /*key=*/100, cfg);  // collective
//   pskv::NDArray rows = table->Pull(ids);      // (n, 16) float32
//   table->Push(ids, grads);                    // grads (n, 16) float32
//
// Where the rows live. With a dist store (dist_sync, dist_async and their _device
// variants) the table is sharded over every server by a hash of the id
// (EmbeddingShardOf), each server's part on one of its threads; with a local store
// ("local", "device") it lives in this process (one shard). The table's key shares
// the store's key namespace: do not also Init it as a dense or row_sparse key.
//
// One step of the table. Each Push is one update of the table: in dist_sync every
// worker pushes once per step (an empty push joins the step too) and the servers
// apply the workers' pushes together, in worker-rank order, as one push of the
// concatenated (ids, gradients); in dist_async and locally each push is applied when
// it arrives. The table's step (its clock for the TTL, the LRU and the learning
// rate's schedule) is the count of updates applied before. A worker's push sums the
// gradients of repeated ids first (in order of appearance): one sighting per id and
// worker per step.
//
// Errors (pskv::Error subclasses, each naming the fix): InvalidArgument for ids that
// are not int64 or a bad configuration, ShapeError for gradients of another dtype or
// width, UsageError for a push that would take a server's shard over `max_bytes` (the
// table is unchanged), KeyError for a key already used, TimeoutError when the
// servers do not answer within the timeout (the store's op_timeout unless given).
// Not replicated yet: with PSKV_REPLICAS > 0 Create fails with a UsageError.
//
// A worker's cache of hot rows (EmbeddingCacheConfig, dist stores): Pull asks the
// servers only for the rows not cached or cached more than `staleness` steps ago, so
// a row read at this worker's step t is the servers' row as of a step in [t - S, t]
// (S = 0: exactly a direct pull's rows). Pushes always go to the servers.
//
// Checkpoints (Save, Restore, Export): collective; with a dist store each server
// writes (and reads) its own part's files in a directory it can reach (one shared by
// the servers, or the same path on each host for Save/Export). File names, format and
// guarantees: docs/embedding.md, "Checkpoints of a dist table".
//
// Thread-safety: one EmbeddingTable may be used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "pskv/ndarray.h"
#include "pskv/optimizer.h"

namespace pskv {

class KVStore;

/// The per-id initializer: value(seed, id, column) is a pure function (a 64-bit mix
/// of the three), so every server, replica and restart computes the same row.
struct EmbeddingInitializer {
  enum class Kind : uint8_t { kZeros = 0, kUniform = 1, kNormal = 2 };
  Kind kind = Kind::kUniform;
  double a = -0.01;  ///< uniform: low;  normal: mean
  double b = 0.01;   ///< uniform: high; normal: standard deviation
  /// Fills `out[0..width)` with id's row.
  void Fill(uint64_t seed, uint64_t id, int64_t width, float* out) const;
};

/// Admission of new ids: a row only after `admit_after` sightings (an exact counter
/// per pending id, or a counting Bloom filter of fixed memory whose estimate is never
/// below the true count; docs/embedding.md states its false-positive rate).
struct EmbeddingAdmission {
  enum class Mode : uint8_t { kExact = 0, kCountingBloom = 1 };
  Mode mode = Mode::kExact;
  uint32_t admit_after = 1;         ///< sightings before a row exists; <= 1: admit at once
  uint64_t cbf_counters = 1 << 20;  ///< kCountingBloom: counters (bytes) per shard
  uint32_t cbf_hashes = 4;          ///< kCountingBloom: counters per id
  /// A counting Bloom filter for `distinct_ids` ids at false-positive rate `fpr`.
  static EmbeddingAdmission CountingBloom(uint32_t admit_after, uint64_t distinct_ids, double fpr);
};

/// A table's configuration. Limits (capacity, max_bytes, the Bloom filter's counters)
/// are per shard: per server for a dist store.
struct EmbeddingConfig {
  std::string name = "embedding";  ///< for messages
  int64_t width = 64;              ///< elements per row
  DType dtype = DType::kFloat32;   ///< the rows' dtype: float32 only (so far)
  uint64_t seed = 0;               ///< of the initializer
  EmbeddingInitializer init;
  /// sgd (momentum or not), nag, adam, adamw, rmsprop, adagrad: pskv's rules and
  /// hyper-parameters; lr_mult, wd_mult and sum_keys (per dense key) do not apply.
  OptimizerConfig optimizer = OptimizerConfig::For("adagrad");
  EmbeddingAdmission admission;  ///< default: every id admitted at its first push
  /// What a pull of an id without a row reads.
  enum class UnadmittedPull : uint8_t { kInitializer = 0, kZeros = 1 };
  UnadmittedPull unadmitted_pull = UnadmittedPull::kInitializer;
  int64_t ttl_steps = 0;   ///< rows not pushed for this many steps go; 0: never
  int64_t capacity = 0;    ///< live rows per shard at most (LRU above); 0: unbounded
  uint64_t max_bytes = 0;  ///< memory budget per shard (rows, index, admission); 0: none
};

/// A worker's cache of hot rows in front of a dist table's pulls (ignored by a local
/// store's table, which reads its rows in process). capacity 0: no cache.
struct EmbeddingCacheConfig {
  int64_t capacity = 0;       ///< rows cached at most; 0: no cache
  int64_t staleness = 0;      ///< S: a cached row is served while fetched <= S steps ago
  int64_t aging_steps = 256;  ///< LFU access counts halve every this many steps
};

/// Counters of a table: the servers' parts summed (the `table` fields), and this
/// worker's pulls and cache (the `worker` fields).
struct EmbeddingStats {
  // table (every server's part, summed)
  int64_t live = 0;              ///< rows now
  int64_t admitted = 0;          ///< rows created (restored rows count as admitted)
  int64_t evicted_ttl = 0;       ///< rows removed by the TTL
  int64_t evicted_capacity = 0;  ///< rows removed to stay under a part's capacity
  int64_t dropped_grads = 0;     ///< gradient rows dropped: ids not admitted yet
  int64_t pulled_rows = 0;       ///< pulled ids that had a row (all workers)
  int64_t pulled_defaults = 0;   ///< pulled ids that read the initializer or zeros
  int64_t pending_ids = 0;       ///< ids counted by the exact admission counter
  uint64_t memory_bytes = 0;     ///< allocated by the parts: rows, index, admission
  int64_t step = 0;              ///< updates applied (the largest over the parts)
  // worker (this one's calls)
  int64_t pulls = 0;                 ///< Pull calls
  int64_t pulled_ids = 0;            ///< distinct ids asked of the servers
  uint64_t pull_bytes_sent = 0;      ///< pull requests' values (8 per id, 8 per part)
  uint64_t pull_bytes_received = 0;  ///< replies' rows and versions
  int64_t cache_hits = 0;            ///< distinct ids of pulls served by the cache
  int64_t cache_evicted = 0;         ///< rows the cache dropped (capacity)
  int64_t cache_rows = 0;            ///< rows cached now
};

/// What Save writes: every live row (kFull, starting a chain) or the rows changed
/// since the previous save (kDelta).
enum class EmbeddingSaveKind : uint8_t { kFull = 0, kDelta = 1 };

/// The shard (server) of `id` among `num_shards`: a 64-bit mix of the id reduced by a
/// multiply-high, balanced whatever the ids' structure.
uint32_t EmbeddingShardOf(uint64_t id, uint32_t num_shards);

class EmbeddingTable {
 public:
  /// Creates table `key` (collective: every worker of a dist store calls it with the
  /// same key and configuration; a mismatch is an error on every worker). Checks the
  /// configuration first (InvalidArgument naming the field).
  static std::unique_ptr<EmbeddingTable> Create(KVStore& store, int key,
                                                const EmbeddingConfig& config,
                                                const EmbeddingCacheConfig& cache = {});
  virtual ~EmbeddingTable();
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const EmbeddingConfig& config() const { return config_; }
  int key() const { return key_; }

  /// The rows of `ids` (int64, any shape, n elements): float32 (n, width). An id
  /// without a row reads the initializer's value (or zeros). Blocks until the
  /// servers answered, at most `timeout` (0: the store's op_timeout).
  virtual NDArray Pull(const NDArray& ids, std::chrono::milliseconds timeout = {}) = 0;
  /// As Pull, also returning each row's version (the table's step of its last push;
  /// -1 for an id without a row) in `versions` (int64, n): what a cache of rows with
  /// bounded staleness compares.
  virtual NDArray Pull(const NDArray& ids, NDArray* versions,
                       std::chrono::milliseconds timeout = {}) = 0;
  /// Pushes gradients `grads` (float32 (n, width), or any shape of n * width
  /// elements) for `ids` (int64, n): one update of the table (see above). Blocks
  /// until the servers applied it (dist_sync: until every worker pushed the step),
  /// at most `timeout` (0: the store's op_timeout).
  virtual void Push(const NDArray& ids, const NDArray& grads,
                    std::chrono::milliseconds timeout = {}) = 0;

  /// The table's counters (see EmbeddingStats): asks every server; not collective.
  virtual EmbeddingStats Stats(std::chrono::milliseconds timeout = {}) = 0;

  /// Saves the table into directory `dir` (created if missing): every server writes
  /// its part's file, atomically (a temporary file renamed). Collective: every worker
  /// calls it at the same point of its steps (between a push and the next); rank 0
  /// sends the request between two barriers, so the files are the table after the
  /// same step on every server. A kDelta needs an earlier kFull (or Restore onto the
  /// same server count) into the same directory. Returns the bytes written (all
  /// servers). IOError naming the file when one cannot be written (nothing is lost:
  /// the rows go into the next save); every worker gets the error.
  virtual uint64_t Save(const std::string& dir, EmbeddingSaveKind kind,
                        std::chrono::milliseconds timeout = {}) = 0;
  /// Replaces the table's content with the newest save in `dir` (its full save and
  /// the deltas after it), saved by any number of servers. Collective, between two
  /// barriers; clears this worker's cache. IOError naming the file and the fix for a
  /// missing, cut or corrupt file (the table is left as it was); ShapeError /
  /// UsageError when the saved table's width or optimizer differ.
  virtual void Restore(const std::string& dir, std::chrono::milliseconds timeout = {}) = 0;
  /// Writes the live rows (id -> values, no optimizer state) for serving: one file
  /// per server in `dir`, read back by ReadExport. Collective. Returns the bytes.
  virtual uint64_t Export(const std::string& dir, std::chrono::milliseconds timeout = {}) = 0;
  /// Reads the export of table `key` in `dir` (every server's file): fn(id, values,
  /// width) per live row. IOError naming the file for a missing or corrupt one.
  static void ReadExport(
      const std::string& dir, int key,
      const std::function<void(uint64_t id, const float* values, int64_t width)>& fn);

 protected:
  EmbeddingTable(int key, EmbeddingConfig config) : key_(key), config_(std::move(config)) {}

 private:
  const int key_;
  const EmbeddingConfig config_;
};

}  // namespace pskv
