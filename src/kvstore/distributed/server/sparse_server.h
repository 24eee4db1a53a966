// SparseServer: a dist server's row_sparse keys (MXNet's row_sparse push and
// row_sparse_pull).
//
// Every row_sparse request carries exactly one key: the part of a table this server
// holds (its row range, dist::PlaceRows). Its values (kSparseInit, kSparsePush,
// kSparsePull) have the layout of kvstore/distributed/wire/sparse_codec.h, the one codec the
// workers encode with and this server decodes with: everything is validated (sizes
// before any allocation, ids ascending and in range, row size and dtype equal to the
// key's) before the key changes.
//
// The slice is stored dense (absent rows are zero rows). Sync mode: a round
// (rounds.h) completes when every worker pushed (an empty push counts, as zeros); the
// pushes are summed in worker-rank order (union of rows, reproducible), then the
// optimizer updates only those rows (Optimizer::UpdateRows) or, without one, the
// slice becomes the sum.
// Async mode: each push is applied at once (an optimizer is required).
//
// Replicated servers (docs/fault-tolerance.md): as a primary (Context::replicate set),
// a completed round is applied, then its sum (kReplicateSparse: the summed rows in
// the push layout of sparse_codec.h, the round number, the update count the rate came
// from, each pusher's push count, after the sender's range-table version) goes to
// the range's replicas, and the round's
// pushes are answered when every replica acknowledged it; an init is forwarded
// (Context::answer_init). A replica applies the sum with the same UpdateRows (same
// bits; ApplyCopy). Each key remembers the push count of each worker's last applied
// push, so a push retried after a failover that the key holds is answered, not
// applied again. Async pushes are not replicated (the DistServer refuses them).
//
// Threads: a key's state is touched only under its own mutex (so one key is never
// updated concurrently, whatever thread runs the handler; different keys may run in
// parallel); the key table is under mu_ (lookups and inserts only).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kvstore/distributed/server/rounds.h"
#include "ps/kv_app.h"
#include "pskv/ndarray.h"
#include "pskv/optimizer.h"
#include "pskv/row_sparse.h"

namespace pskv {

class SparseServer {
 public:
  /// What the server tells the handler about the job at the time of a request.
  struct Context {
    bool sync = false;
    Optimizer* optimizer = nullptr;  // of the key's store, or null
    int num_workers = 0;
    const std::set<int>* done_workers = nullptr;  // node ids of finished workers
    std::function<std::string(int)> worker_name;  // node id -> "worker[1]"
    /// Primary of a replicated range: sends a round's copy to the replicas; `done`
    /// runs once they all acknowledged it (or with the error). Null otherwise.
    std::function<void(Message copy, std::function<void(std::exception_ptr)> done)> replicate;
    /// Primary of a replicated range: answers an init applied here once its replicas
    /// applied it too. Null: answered at once.
    std::function<void(const KVRequest& init)> answer_init;
    uint64_t table_version = 0;  // with `replicate`: sent first in each copy
    /// Replicated, a kSparseInit: the worker it came from and its push count (0:
    /// none). A key that holds that push already answers the init as a retry.
    int init_worker = -1;
    uint64_t init_count = 0;
  };

  /// True if `wire_key` is a row_sparse key here.
  bool Holds(int64_t wire_key) const;
  /// True if some row_sparse key is here.
  bool any() const { return count_.load() > 0; }
  /// (element count, low precision) of `wire_key`'s slice here, or (-1, false): what
  /// Optimizer::LoadStates checks optimizer states against.
  std::pair<int64_t, bool> WeightInfo(int64_t wire_key) const;
  /// Handles one row_sparse request for `wire_key` (kind and dtype from its cmd);
  /// answers it now or, for a sync push, when the round completes.
  void Handle(int64_t wire_key, KVRequest&& req, KVServer* srv, const Context& ctx);
  /// Replica: applies a kReplicateSparse request (a round's sum) for `wire_key` and
  /// acknowledges it.
  /// `is_worker(id)`: id is a worker of this job. The caller checked the sender.
  /// `keep_last` (PSKV_REPLICAS >= 2): the request is kept as the key's last round,
  /// for TakeLastRounds.
  void ApplyCopy(int64_t wire_key, KVRequest&& req, KVServer* srv, Optimizer* optimizer,
                 const std::function<bool(int)>& is_worker, bool keep_last = false);
  /// The last round each key applied as a replica (ApplyCopy's `keep_last`), in key
  /// order; no key keeps one afterwards. For a replica promoted to primary, which sends
  /// them again to the range's other copies (ReplicaApply::ResendLastRounds).
  std::vector<std::shared_ptr<const Message>> TakeLastRounds();
  /// A worker finished: open rounds that still need its push fail with a message.
  void WorkerDone(int id, KVServer* srv, const std::function<std::string(int)>& worker_name);

  /// One key's state in a copy of a range for a spare that joins it (RangeTransfer, range_copy.cc).
  struct KeyCopy {
    int64_t wire_key = 0;
    NDArray table;      // rows x row_size, the key's dtype
    int64_t round = 1;  // the open round
    std::map<int, uint64_t> applied_push;
  };
  /// A copy of every key, in key order (their tables cloned). Only when no request
  /// of these keys runs (the DistServer's exclusive section).
  std::vector<KeyCopy> Copy() const;
  /// Adds a key from a copy; "" or why not (a key held already, a malformed table).
  std::string Install(KeyCopy copy);

 private:
  struct Key {
    std::mutex mu;
    NDArray table;  // rows x row_size, the key's dtype
    int64_t rows = 0, row_size = 0;
    SyncRound<KVRequest> round;
    std::map<int, uint64_t> applied_push;       // replicated: worker id -> last applied push count
    std::shared_ptr<const Message> last_round;  // ApplyCopy's keep_last
  };
  void Init(int64_t wire_key, KVRequest&& req, KVServer* srv, DType dtype, const Context& ctx);
  /// The sum of `pushes` (in their order), validated against the key.
  static RowSparseNDArray SumOf(const Key& k, const std::vector<const KVRequest*>& pushes);
  /// Updates the key's rows from `sum` (Optimizer::UpdateRows; `schedule_at` as there).
  static void ApplySum(int64_t wire_key, Key& k, const RowSparseNDArray& sum, Optimizer* optimizer,
                       int64_t* schedule_at);
  /// Primary: sends the round just applied (`sum`, `round`, its `pushes`) to the
  /// replicas; the pushes are answered when they acknowledged it.
  static void Replicate(const Key& k, const RowSparseNDArray& sum, int64_t round,
                        int64_t schedule_at, std::vector<SyncRound<KVRequest>::Entry> pushes,
                        KVServer* srv, const Context& ctx);
  /// A sync push (validated): joins the key's round; the last one applies it.
  void JoinRound(int64_t wire_key, Key& k, KVRequest&& req, KVServer* srv, const Context& ctx,
                 std::unique_lock<std::mutex>& lk);
  static void FailRound(std::vector<SyncRound<KVRequest>::Entry> pushes, KVServer* srv,
                        ErrorKind kind, const std::string& why);

  mutable std::mutex mu_;  // keys_
  std::map<int64_t, std::unique_ptr<Key>> keys_;
  // keys_.size(), readable without mu_: a dense request's keys skip the lookup (and the
  // lock) while no row_sparse key exists (keys are only added).
  std::atomic<size_t> count_{0};
};

}  // namespace pskv
