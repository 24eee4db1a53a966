// EmbeddingServer: a dist server's parts of the dynamic embedding tables
// (include/pskv/embedding.h) — a component beside RangeStore (docs/design.md, "The
// server as components"), owning its tables.
//
// Every embedding request carries exactly one key: the table's part on this server
// (the ids with EmbeddingShardOf(id, servers) == this server's index). Its values
// (kEmbeddingCreate, kEmbeddingPush, kEmbeddingPull) have the layout of
// kvstore/distributed/wire/embedding_codec.h, decoded here as hostile bytes (sizes
// first, then the width against the table's and each id against this server) before
// the table changes. A table part is one embedding::Table (src/embedding/table.h).
//
// Create: every server receives the configuration once (rank 0 sends it, collective
// init); the same configuration again is answered (a retry), another one is an error.
// Push: one update of the table at its step (the count of updates applied before).
//   Sync mode: a round (rounds.h) completes when every worker pushed (an empty push
//   counts); the pushes, in worker-rank order, are applied as one Table::Push of
//   their concatenated ids and gradients, so a table part equals one
//   embedding::Table given the same concatenated pushes, bit for bit.
//   Async mode: each push is applied when it arrives.
//   A push the table refuses (over max_bytes: UsageError) fails every push of its round
//   and changes nothing.
// Pull: each id's row (or the initializer's value) and its version (the step of its
//   last push; -1 without a row).
//
// Admin (kEmbeddingAdmin, embedding_admin.cc): save, restore, export and counters of
//   a part, run between rounds under the part's mutex (so a save is the part after
//   a whole round); the outcome of each ticket is kept for the other workers' ask.
//
// Replicated (PSKV_REPLICAS >= 1; docs/fault-tolerance.md, "Dynamic embedding tables";
// embedding_replication.cc): the primary of the range sends each change it applied —
// an update (a sync round's concatenated pushes, or one async push) or a restore —
// numbered in the part's change order, with the pushes' push counts, to the range's
// replicas (kReplicateEmbedding) and answers once every replica acknowledged it; a
// replica applies it the same way (Table::Push at the same step, or a restore from
// the same files: same bits). A create is forwarded the same way. With R >= 2 a
// replica keeps its parts' last changes, which it sends again once promoted
// (TakeLastChanges, through ReplicaApply::ResendLastRounds). Each
// part remembers, per worker, the push count of its last applied push, so a push
// retried after a failover that the part holds is answered, not applied again. A
// replica takes a change only from the range's primary in its range table.
//
// Threads: a table part is touched only under its own mutex (the DistServer runs a
// one-key request on that key's ShardPool thread, so one table's requests run in
// arrival order on one thread; different tables in parallel); the table map is under
// mu_ (lookups and inserts only; parts are never removed).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/observe.h"
#include "embedding/table.h"
#include "kvstore/distributed/server/answers.h"
#include "kvstore/distributed/server/range_store.h"
#include "kvstore/distributed/server/rounds.h"
#include "kvstore/distributed/wire/embedding_codec.h"
#include "ps/kv_app.h"

namespace pskv {

namespace dist::embedding_admin {
struct Request;
}  // namespace dist::embedding_admin

class EmbeddingServer {
 public:
  /// The tables of key range `range` (this server's index among the servers is
  /// range.index()); `config` is the range's (sync mode, finished workers), read at
  /// each request. Both outlive this.
  /// Registers the parts' counters as gauges of the metrics endpoint
  /// (pskv_embedding_*{table, range}; embedding/stats_fields.h).
  EmbeddingServer(RangeOf range, const RangeConfig& config);

  /// True if `wire_key` is an embedding table here.
  bool Holds(int64_t wire_key) const;
  /// Handles one embedding request (kind from its cmd; one key); answers it now or,
  /// for a sync push, when the round completes.
  void Handle(KVRequest&& req, KVServer* srv);
  /// A worker finished: open rounds that still need its push fail with a message.
  void WorkerDone(int id, KVServer* srv);

  /// What a replicated range's DistServer gives its tables (embedding_replication.cc).
  struct Replication {
    /// The servers to copy a request's changes to (none unless a worker sent it).
    std::function<std::vector<int>(const KVRequest&)> targets;
    /// Sends a change to `to`; `done` runs once all acknowledged it (or with the error).
    std::function<void(const std::vector<int>& to, Message m,
                       std::function<void(std::exception_ptr)> done)>
        send;
    /// Forwards a create applied here to `to`; answers it once they applied it too.
    std::function<void(const KVRequest& create, const std::vector<int>& to)> forward;
    /// Why a server's change of this range may not be applied here ("": from its primary).
    std::function<std::string(const KVRequest&)> not_from_primary;
    std::function<uint64_t()> version;  // of the range table changes are sent under
    /// The replicas acknowledged an update, before its pushes are answered (a test's
    /// fail point: FailPoints::RoundReplicated).
    std::function<void()> replicated;
    int replicas = 0, spares = 0;  // PSKV_REPLICAS, PSKV_SPARE_SERVERS
  };
  /// Makes this range's tables replicated; before any request.
  void SetReplication(Replication r) { rep_ = std::move(r); }
  /// A replica just promoted to primary (PSKV_REPLICAS >= 2): per part, the last
  /// changes it applied as a replica, in order (sync: the last one; async: the last
  /// num_workers), for ReplicaApply::ResendLastRounds to send again to the other
  /// copies, which may have missed them. Taken: a second call returns none.
  std::vector<std::vector<std::shared_ptr<const Message>>> TakeLastChanges();

 private:
  struct Part {
    std::mutex mu;
    std::string config;  // the create payload's bytes (a retry must match them)
    std::unique_ptr<embedding::Table> table;
    SyncRound<KVRequest> round;
    int64_t step = 0;       // updates applied (the table's step; a restore sets it)
    int64_t changes = 0;    // updates and restores applied: their order on every copy
    uint64_t save_seq = 0;  // the number of the last save written or restored
    // The last admin operation's ticket and outcome (embedding_admin_codec.h).
    uint64_t admin_ticket = 0;
    ErrorKind admin_error_kind = ErrorKind::kGeneric;
    std::string admin_error;  // empty: it succeeded
    std::string admin_reply;
    // Replicated: worker id -> the push count of its last push applied here.
    std::map<int, uint64_t> applied_push;
    // Replica: async updates that arrived before the one they follow (a big copy
    // overtaken by a smaller one, docs/design.md "Send scheduling"), by step.
    std::map<int64_t, KVRequest> ahead;
    // Replica with PSKV_REPLICAS >= 2: the last changes applied here (TakeLastChanges).
    std::deque<std::shared_ptr<const Message>> kept;
  };
  void Create(int64_t wire_key, KVRequest&& req, KVServer* srv);
  /// Who may hold an id here (embedding_codec.h).
  dist::embedding_wire::Owner Owner() const;
  void Pull(Part& p, KVRequest&& req, KVServer* srv, std::unique_lock<std::mutex>& lk);
  /// A push for an existing part: validated, then joins its round or is applied.
  void Push(int64_t wire_key, Part& p, KVRequest&& req, KVServer* srv,
            std::unique_lock<std::mutex>& lk);
  /// A sync push (validated): joins the part's round; the last one applies it.
  void JoinRound(int64_t wire_key, Part& p, KVRequest&& req, KVServer* srv,
                 std::unique_lock<std::mutex>& lk);
  /// A kEmbeddingAdmin request (embedding_admin.cc).
  void Admin(int64_t wire_key, Part& p, KVRequest&& req, KVServer* srv,
             std::unique_lock<std::mutex>& lk);
  /// Replaces the part by the save in `dir` (embedding/table_files.h): its rows, step
  /// and save number; the number of the save restored. Throws what FindSaved and
  /// Table::Restore throw (the part unchanged).
  uint64_t RestorePart(Part& p, int64_t wire_key, const std::string& dir) const;
  /// Writes the part's save (full or delta, numbered after every save of its table in
  /// the directory) or export file for `a`; returns the file's path.
  std::string WritePart(Part& p, int64_t wire_key, const dist::embedding_admin::Request& a) const;
  /// Applies `pushes` (decoded already once: they are valid) as one update; returns
  /// the rows it pushed.
  dist::embedding_wire::PushRows Apply(Part& p, const std::vector<const KVRequest*>& pushes) const;

  // Replication (embedding_replication.cc).
  /// A worker's push that the part holds already (retried after a failover): answered.
  bool HeldAlready(const Part& p, const KVRequest& req, KVServer* srv) const;
  /// After an update of `pushes` was applied at `step` (`rows`): records their push
  /// counts and, on a replicated range's primary, sends the update to the replicas
  /// and answers the pushes once they acknowledged it. Else answers them. Under the
  /// part's lock (`lk`: one part's updates reach the replicas in order).
  void Applied(int64_t wire_key, Part& p, const dist::embedding_wire::PushRows& rows,
               std::vector<KVRequest> pushes, KVServer* srv, std::unique_lock<std::mutex>& lk);
  /// After a restore from `dir` was applied on a replicated range's primary: sends it to
  /// the replicas, then answers `req` with `reply` (or the replication's error). Else
  /// answers it. Under the part's lock (`lk`), which it releases.
  void Restored(int64_t wire_key, Part& p, const std::string& dir, KVRequest&& req,
                std::string reply, KVServer* srv, std::unique_lock<std::mutex>& lk);
  /// Sends change `m` (its body set) of part `p` to `to`; `done` as Replication::send's.
  void SendChange(int64_t wire_key, const std::vector<int>& to, Message m,
                  std::function<void(std::exception_ptr)> done);
  /// Replica: a kReplicateEmbedding of `wire_key`, checked, then applied in step order.
  void ApplyCopy(int64_t wire_key, KVRequest&& req, KVServer* srv);
  /// Replica: applies copy `req` (checked) of `p` at its step; "" or why not.
  std::string ApplyCopyNow(int64_t wire_key, Part& p, const KVRequest& req, KVServer* srv);
  /// Why a create may not be made here ("" if it may): what replication does not cover.
  std::string CreateRefusal(const KVRequest& req) const;

  const RangeOf range_;
  const RangeConfig& config_;
  Replication rep_;        // unset (no targets): not replicated
  mutable std::mutex mu_;  // parts_
  std::map<int64_t, std::unique_ptr<Part>> parts_;
  obs::Gauges gauges_;  // last: unregistered before the parts go
};

}  // namespace pskv
