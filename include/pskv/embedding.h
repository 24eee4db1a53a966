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
// Thread-safety: one EmbeddingTable may be used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
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

/// The shard (server) of `id` among `num_shards`: a 64-bit mix of the id reduced by a
/// multiply-high, balanced whatever the ids' structure.
uint32_t EmbeddingShardOf(uint64_t id, uint32_t num_shards);

class EmbeddingTable {
 public:
  /// Creates table `key` (collective: every worker of a dist store calls it with the
  /// same key and configuration; a mismatch is an error on every worker). Checks the
  /// configuration first (InvalidArgument naming the field).
  static std::unique_ptr<EmbeddingTable> Create(KVStore& store, int key,
                                                const EmbeddingConfig& config);
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

 protected:
  EmbeddingTable(int key, EmbeddingConfig config) : key_(key), config_(std::move(config)) {}

 private:
  const int key_;
  const EmbeddingConfig config_;
};

}  // namespace pskv
