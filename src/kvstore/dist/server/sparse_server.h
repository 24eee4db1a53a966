// SparseServer: a dist server's row_sparse keys (MXNet's row_sparse push and
// row_sparse_pull).
//
// Every row_sparse request carries exactly one key: the part of a table this server
// holds (its row range, dist::PlaceRows). Its values (kSparseInit, kSparsePush,
// kSparsePull) have the layout of kvstore/dist/wire/sparse_codec.h, the one codec the
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

#include "kvstore/dist/server/rounds.h"
#include "ps/kv_app.h"
#include "pskv/ndarray.h"
#include "pskv/optimizer.h"

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
  };

  /// True if `wire_key` is a row_sparse key here.
  bool Holds(int64_t wire_key) const;
  /// (element count, low precision) of `wire_key`'s slice here, or (-1, false): what
  /// Optimizer::LoadStates checks optimizer states against.
  std::pair<int64_t, bool> WeightInfo(int64_t wire_key) const;
  /// Handles one row_sparse request for `wire_key` (kind and dtype from its cmd);
  /// answers it now or, for a sync push, when the round completes.
  void Handle(int64_t wire_key, KVRequest&& req, KVServer* srv, const Context& ctx);
  /// A worker finished: open rounds that still need its push fail with a message.
  void WorkerDone(int id, KVServer* srv, const std::function<std::string(int)>& worker_name);

 private:
  struct Key {
    std::mutex mu;
    NDArray table;  // rows x row_size, the key's dtype
    int64_t rows = 0, row_size = 0;
    SyncRound<KVRequest> round;
  };
  void Init(int64_t wire_key, KVRequest&& req, KVServer* srv, DType dtype);
  void Apply(int64_t wire_key, Key& k, const std::vector<const KVRequest*>& pushes,
             Optimizer* optimizer);
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
