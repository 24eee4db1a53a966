// KVStore: the key-value store through which data-parallel workers share
// parameters (MXNet's `mx.kv`). Start here:
//
//   auto kv = pskv::KVStore::Create("local");      // or "device", "dist_sync", ...
//   kv->Init(3, pskv::NDArray({2, 3}));             // every key is initialised once
//   kv->Push(3, {grad_dev0, grad_dev1});            // values of one key are summed
//   kv->Pull(3, {weight_dev0, weight_dev1});        // every output gets the value
//   kv->WaitAll();                                  // operations are asynchronous
//
// Call model
// ----------
// Init, Push, Pull, PushPull and Broadcast validate their arguments at once (a
// misuse throws before anything is scheduled) and then *schedule* the work and
// return. Operations on one key run in the order they were issued; operations on
// different keys may run in any order and overlap, and among ready operations a
// higher `priority` runs first (MXNet's convention: priority = -layer index, so the
// last layer's gradient, produced first by backward, goes out first). Init is
// synchronous: when it returns the key exists.
//
// Buffer ownership while an operation is in flight: the store keeps a handle to
// every NDArray passed in. For owning arrays this keeps the memory alive; for
// wrapped (non-owning) arrays the caller must keep the memory alive. Until the
// operation has completed — Wait() on its key or WaitAll() returned — the caller
// must not write to the input values of Push/PushPull/Broadcast nor read or write
// the outputs of Pull/PushPull/Broadcast. A failure of a scheduled operation (a dead
// server, an exception thrown by an updater) is rethrown by the next Wait/WaitAll
// covering that key.
//
// Keys are either all ints (>= 0) or all strings for the life of a store. String
// keys receive int ids 0, 1, 2, ... in first-init order; in dist mode every worker
// must init string keys in the same order (pskv checks and reports a mismatch).
//
// Thread safety: a KVStore may be called from several threads; operations from
// different threads on the same key are ordered by the time of their call.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pskv/ndarray.h"
#include "pskv/optimizer.h"
#include "pskv/options.h"
#include "pskv/row_sparse.h"

namespace pskv {

/// Called with (key, merged pushed value, stored value); must update `stored` in
/// place. Runs on a pskv thread; exceptions propagate to the next Wait/WaitAll.
using Updater = std::function<void(int key, const NDArray& recv, NDArray* stored)>;
using StrUpdater =
    std::function<void(const std::string& key, const NDArray& recv, NDArray* stored)>;

/// Gradient compression settings (MXNet's; docs/mxnet-differences.md).
/// `type` is "none", "2bit" or "1bit".
struct CompressionConfig {
  std::string type = "none";
  float threshold = 0.5f;
  /// From string parameters {"type": "2bit", "threshold": "0.5"}; unknown names are
  /// an error (MXNet ignored them silently, hiding typos).
  static CompressionConfig FromParams(const std::map<std::string, std::string>& params);
  void Validate() const;
  bool active() const { return type != "none"; }
};

class KVStore {
 public:
  /// Creates a store. Valid types: local, device, dist, dist_sync, dist_async,
  /// dist_sync_device, dist_device_sync, dist_async_device (case-insensitive; the
  /// aliases local_update_cpu, local_allreduce_cpu, local_allreduce_device too).
  /// Anything else is an InvalidArgument listing these (MXNet silently made it local).
  /// Types are parsed once (pskv/store_type.h), whose registry makes the stores.
  ///
  /// Values on devices (docs/gpu.md): `local` stages them through pinned host memory
  /// and sums and updates on the CPU; `device` sums and updates on a home device per
  /// key (kernels bit-identical to the CPU's). `dist_*_device` sum a worker's device
  /// values on a home device per key and send the sum in pieces as its d2h copy lands;
  /// `dist_sync`/`dist_async` stage device values through pinned memory and sum on the
  /// CPU. Servers hold CPU values.
  ///
  /// For a dist type in a process whose DMLC_ROLE is `server` or `scheduler`, Create
  /// throws UsageError: the library never exits a process. A C++ program that is
  /// also started as a server or scheduler (pskv-launch --server-command) begins
  /// main with `if (auto rc = pskv::RunServerRoleIfAsked()) return *rc;` (MXNet ran
  /// the role inside `import mxnet` and exited; Python's pskv.create still does).
  ///
  /// Creating a store changes no process-wide setting: PSKV_LOG_LEVEL, PSKV_TIMELINE
  /// and PSKV_METRICS_* take effect in programs that call pskv::ConfigureProcess
  /// (pskv/process.h).
  static std::unique_ptr<KVStore> Create(const std::string& type = "local");
  static std::unique_ptr<KVStore> Create(const std::string& type, const Options& options);
  /// The type strings Create accepts.
  static std::vector<std::string> ValidTypes();

  virtual ~KVStore();
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;

  // ---- int keys. `keys[i]` pairs with `values[i]`; a key may repeat (its values
  // ---- are summed for Push, each output receives the value for Pull).
  void Init(int key, const NDArray& value);
  void Init(const std::vector<int>& keys, const std::vector<NDArray>& values);
  void Push(int key, const std::vector<NDArray>& values, int priority = 0);
  void Push(const std::vector<int>& keys, const std::vector<NDArray>& values, int priority = 0);
  void Pull(int key, const std::vector<NDArray>& outs, int priority = 0);
  void Pull(const std::vector<int>& keys, const std::vector<NDArray>& outs, int priority = 0);
  /// Push then pull; all inputs are read before any output is written. `outs` may
  /// name the input arrays (in-place all-reduce).
  void PushPull(int key, const std::vector<NDArray>& values, const std::vector<NDArray>& outs,
                int priority = 0);
  void PushPull(const std::vector<int>& keys, const std::vector<NDArray>& values,
                const std::vector<int>& out_keys, const std::vector<NDArray>& outs,
                int priority = 0);
  /// Init(key, value) followed by Pull(key, outs). In dist mode rank 0's value wins.
  void Broadcast(int key, const NDArray& value, const std::vector<NDArray>& outs, int priority = 0);
  void Broadcast(const std::vector<int>& keys, const std::vector<NDArray>& values,
                 const std::vector<int>& out_keys, const std::vector<NDArray>& outs,
                 int priority = 0);

  // ---- string keys (same semantics)
  void Init(const std::string& key, const NDArray& value);
  void Init(const std::vector<std::string>& keys, const std::vector<NDArray>& values);
  void Push(const std::string& key, const std::vector<NDArray>& values, int priority = 0);
  void Push(const std::vector<std::string>& keys, const std::vector<NDArray>& values,
            int priority = 0);
  void Pull(const std::string& key, const std::vector<NDArray>& outs, int priority = 0);
  void Pull(const std::vector<std::string>& keys, const std::vector<NDArray>& outs,
            int priority = 0);
  void PushPull(const std::string& key, const std::vector<NDArray>& values,
                const std::vector<NDArray>& outs, int priority = 0);
  void PushPull(const std::vector<std::string>& keys, const std::vector<NDArray>& values,
                const std::vector<std::string>& out_keys, const std::vector<NDArray>& outs,
                int priority = 0);
  void Broadcast(const std::string& key, const NDArray& value, const std::vector<NDArray>& outs,
                 int priority = 0);

  // ---- row_sparse keys (MXNet's stype 'row_sparse', docs/sparse.md): an embedding table
  // ---- whose gradients touch few rows. A key initialised with a RowSparseNDArray is
  // ---- row_sparse for its whole life; pushes carry only the rows that have
  // ---- gradients, and RowSparsePull fetches only the rows asked for.
  //
  // Rules, each checked at the call (a typed error naming the rule, as MXNet's):
  //  * the values of one key share one storage type: pushing a RowSparseNDArray to a
  //    dense key, a dense NDArray to a row_sparse key, or Init of a row_sparse key
  //    twice is a UsageError / KeyError;
  //  * a row_sparse key is read with RowSparsePull only: Pull and PushPull of it are a
  //    UsageError (MXNet's dist stores refuse a dense pull of a row_sparse value);
  //  * row ids must lie in [0, rows): KeyError naming the id;
  //  * gradient compression does not apply to row_sparse keys (UsageError at Init).
  // Push: the values are summed (union of rows; unsorted or repeated row ids are
  // sorted and summed first); with an optimizer only the pushed rows are updated
  // (lazy update, optimizer.h); with a custom updater, the updater receives the sum
  // as a dense array (zeros in the other rows); without either the stored value
  // becomes the sum (rows not pushed become zero, MXNet's assignment). An empty push
  // (no rows) counts as a push of zeros (in dist_sync it completes the worker's part
  // of the round).
  // Dist stores: rows of a table of at least MXNET_KVSTORE_BIGARRAY_BOUND elements are
  // sliced over all servers by row range (docs/sparse.md); smaller tables live on one.
  void Init(int key, const RowSparseNDArray& value);
  void Init(const std::string& key, const RowSparseNDArray& value);
  void Push(int key, const std::vector<RowSparseNDArray>& values, int priority = 0);
  void Push(const std::string& key, const std::vector<RowSparseNDArray>& values, int priority = 0);
  /// Pulls rows `row_ids[i]` of row_sparse key `key` into `outs[i]` (whose shape and
  /// dtype are the key's): afterwards outs[i] holds exactly the requested rows (ids of
  /// any integer dtype and shape, flattened, de-duplicated and sorted), every other row
  /// zero. One `row_ids` array for several outs gives every out those rows. Empty ids:
  /// an empty result. Asynchronous like Pull: read outs after Wait/WaitAll.
  void RowSparsePull(int key, const std::vector<RowSparseNDArray>& outs,
                     const std::vector<NDArray>& row_ids, int priority = 0);
  void RowSparsePull(const std::string& key, const std::vector<RowSparseNDArray>& outs,
                     const std::vector<NDArray>& row_ids, int priority = 0);

  /// Blocks until every scheduled operation on `keys` (resp. all keys) completed;
  /// rethrows the first failure. TimeoutError after `timeout` (default: the
  /// store's Options::op_timeout).
  void Wait(const std::vector<int>& keys, std::chrono::milliseconds timeout = {});
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout = {});
  void WaitAll(std::chrono::milliseconds timeout = {});

  /// Installs the function that merges a pushed value into the stored one
  /// (default without an updater: the stored value is replaced by the pushed sum).
  void SetUpdater(Updater updater);
  void SetUpdater(StrUpdater updater);
  /// Runs `config` on the store: locally, or shipped to every server in dist mode.
  virtual void SetOptimizer(const OptimizerConfig& config);
  /// Must be called before the first Init. UsageError on `local` (use `device`).
  virtual void SetGradientCompression(const CompressionConfig& config);
  /// Saves/loads the optimizer's per-key states (UsageError without an optimizer).
  /// `dump_optimizer`: the file also carries the optimizer (MXNet's flag), and
  /// loading it replaces the store's optimizer configuration (learning rate, ...)
  /// by the saved one; without it, loading keeps the current configuration.
  /// Files hold whole keys: states saved by a dist job load into a dist job with
  /// any number of servers, or into a local store, and the reverse (load after Init:
  /// KeyError / ShapeError for keys that are not the store's, nothing loaded).
  /// A dist store's save writes a temporary file renamed at the end.
  virtual void SaveOptimizerStates(const std::string& fname, bool dump_optimizer = false);
  virtual void LoadOptimizerStates(const std::string& fname);

  /// Worker rank in [0, NumWorkers()); 0 for single-machine stores.
  virtual int Rank() const { return 0; }
  virtual int NumWorkers() const { return 1; }
  /// Blocks until every worker reached the barrier (no-op for one worker).
  virtual void Barrier() {}
  /// The data partition this worker reads next epoch, as {num_parts, part_index}.
  /// With elastic workers (PSKV_ELASTIC=1; docs/fault-tolerance.md, "Elastic
  /// workers"), call it at every epoch boundary: it passes a workers' barrier and
  /// returns the workers still in the job at its release and this worker's position
  /// among them (by rank) — the same list on every worker, so the parts cover the
  /// data once. Otherwise {NumWorkers(), Rank()} (no barrier).
  /// A worker that joined a running elastic job (in place of one that left) calls
  /// it first of all at its first epoch: it was admitted at the release of the others'
  /// epoch barrier, and gets its part of that epoch without waiting.
  virtual std::pair<int, int> EpochPartition() {
    ++epoch_;
    return {NumWorkers(), Rank()};
  }
  /// The epoch the last EpochPartition() dealt, counted from 0 (-1 before the first
  /// call): the epoch barriers the job released before it, so a worker that joined a
  /// running job learns which epoch it starts in (the calls of this process otherwise).
  int Epoch() const { return epoch_; }
  /// The creation string, lower-cased.
  const std::string& Type() const { return type_; }
  const Options& options() const { return options_; }

 protected:
  KVStore(std::string type, Options options);

  // Implementations receive int ids (string keys already mapped) in the order the
  // caller gave them; grouping by key is done by the implementation.
  virtual void InitImpl(const std::vector<int>& keys, const std::vector<NDArray>& values) = 0;
  virtual void PushImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                        int priority) = 0;
  virtual void PullImpl(const std::vector<int>& keys, const std::vector<NDArray>& outs,
                        int priority) = 0;
  virtual void PushPullImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                            const std::vector<int>& out_keys, const std::vector<NDArray>& outs,
                            int priority) = 0;
  virtual void WaitImpl(const std::vector<int>* keys, std::chrono::milliseconds timeout) = 0;
  /// Installs an int-keyed updater (string updaters are wrapped by the base class).
  virtual void SetUpdaterImpl(Updater updater) = 0;
  /// row_sparse keys; the defaults throw UsageError (a store type without them).
  /// RowSparsePullImpl receives as many row_ids as outs (the base class repeats a
  /// single one), not yet canonical.
  virtual void InitRowSparseImpl(int key, const RowSparseNDArray& value);
  virtual void PushRowSparseImpl(int key, const std::vector<RowSparseNDArray>& values,
                                 int priority);
  virtual void RowSparsePullImpl(int key, const std::vector<RowSparseNDArray>& outs,
                                 const std::vector<NDArray>& row_ids, int priority);
  /// Human-readable form of key id `k` for messages ("3" or "'fc1_weight'").
  std::string KeyName(int k) const;
  /// Called when the first string key is created; dist stores verify the order.
  virtual void OnStringKeyCreated(const std::string& /*name*/, int /*id*/) {}

  std::string type_;
  Options options_;
  /// The optimizer installed by SetOptimizer on a store that updates locally.
  std::shared_ptr<Optimizer> optimizer_;
  /// What Epoch() returns (EpochPartition sets it).
  int epoch_ = -1;

 private:
  enum class KeyKind { kUnset, kInt, kString };
  void UseKind(KeyKind k);
  std::vector<int> MapKeys(const std::vector<std::string>& keys, bool create);
  std::vector<int> CheckIntKeys(const std::vector<int>& keys);

  struct KeyTable;
  std::unique_ptr<KeyTable> table_;
};

/// For a process whose DMLC_ROLE is `server` or `scheduler`: runs that role until
/// the job ends and returns the process's exit status (0 clean end, 1 the job
/// failed — the reason is logged). For a worker, or without DMLC_ROLE: nullopt at
/// once. Throws ConfigError for a malformed environment.
///
/// The process becomes that server or scheduler until the job ends, so this is a
/// program-level call: before running the role it configures the process
/// (ConfigureProcess, pskv/process.h: log levels and name, timeline, metrics).
std::optional<int> RunServerRoleIfAsked();
std::optional<int> RunServerRoleIfAsked(const Options& options);

}  // namespace pskv
