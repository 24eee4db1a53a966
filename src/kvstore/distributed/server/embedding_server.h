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
// Not replicated yet: the DistServer refuses embedding requests on replicated
// servers (PSKV_REPLICAS > 0).
//
// Threads: a table part is touched only under its own mutex (the DistServer runs a
// one-key request on that key's ShardPool thread, so one table's requests run in
// arrival order on one thread; different tables in parallel); the table map is under
// mu_ (lookups and inserts only; parts are never removed).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "embedding/table.h"
#include "kvstore/distributed/server/answers.h"
#include "kvstore/distributed/server/range_store.h"
#include "kvstore/distributed/server/rounds.h"
#include "kvstore/distributed/wire/embedding_codec.h"
#include "ps/kv_app.h"

namespace pskv {

class EmbeddingServer {
 public:
  /// The tables of key range `range` (this server's index among the servers is
  /// range.index()); `config` is the range's (sync mode, finished workers), read at
  /// each request. Both outlive this.
  EmbeddingServer(RangeOf range, const RangeConfig& config) : range_(range), config_(config) {}

  /// True if `wire_key` is an embedding table here.
  bool Holds(int64_t wire_key) const;
  /// Handles one embedding request (kind from its cmd; one key); answers it now or,
  /// for a sync push, when the round completes.
  void Handle(KVRequest&& req, KVServer* srv);
  /// A worker finished: open rounds that still need its push fail with a message.
  void WorkerDone(int id, KVServer* srv);

 private:
  struct Part {
    std::mutex mu;
    std::string config;  // the create payload's bytes (a retry must match them)
    std::unique_ptr<embedding::Table> table;
    SyncRound<KVRequest> round;
    int64_t step = 0;       // updates applied
    uint64_t save_seq = 0;  // the number of the last save written or restored
    // The last admin operation's ticket and outcome (embedding_admin_codec.h).
    uint64_t admin_ticket = 0;
    ErrorKind admin_error_kind = ErrorKind::kGeneric;
    std::string admin_error;  // empty: it succeeded
    std::string admin_reply;
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
  /// Applies `pushes` (decoded already once: they are valid) as one update.
  void Apply(Part& p, const std::vector<const KVRequest*>& pushes) const;

  const RangeOf range_;
  const RangeConfig& config_;
  mutable std::mutex mu_;  // parts_
  std::map<int64_t, std::unique_ptr<Part>> parts_;
};

}  // namespace pskv
