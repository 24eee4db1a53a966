// DistServer: the server side of the dist KVStore for one key range — a thin
// coordinator over components that own their state (docs/design.md, "The server as
// components"; leveldb's DBImpl is the model):
//
//   RangeStore          the range's keys and rounds (range_store.h): validate, init,
//                       async apply, sync rounds, answers; emits RangeEvents
//   PrimaryReplication  the listener of those events on a replicated range's primary:
//                       copies each change to the replicas (primary_replication.h)
//   ReplicaApply        applies a primary's copies; resends them when promoted
//                       (replica_apply.h)
//   RangeTransfer       a copy of the range to a joining spare, and its install
//                       (range_transfer.h)
//   ServerCommands      commands and optimizer states (commands.h; InitChecks)
//   StallInspector      stalled rounds and barrier deadlocks (stall_inspector.h)
//   SparseServer        row_sparse keys (sparse_server.h, held by the RangeStore)
//   EmbeddingServer     the range's parts of the dynamic embedding tables
//                       (embedding_server.h); one key per request, on its shard
//
// DistServer itself only dispatches: Handle picks the thread, Process the component.
//
// Threads (PSKV_SERVER_THREADS): the keys are sharded over a ShardPool (shard_pool.h)
// by a hash of the wire key (RangeStore::ShardOf). The node's receive thread only
// dispatches: a data request whose keys all belong to one shard is submitted there, so
// requests for different shards are merged, updated and answered in parallel, and the
// requests of one key are handled one at a time in arrival order. Everything else runs
// in an exclusive section of the pool: multi-shard data requests, optimizer-state
// requests, commands, the inspector's passes, range copies and installs. State written
// only in exclusive sections (the RangeConfig, init reports, the states snapshot) is
// read freely by the shards; the BarrierBoard has its own lock. Replies are sent from
// the shard threads, or from the receive thread once replicas acknowledged a change
// (Node::Send is thread-safe). row_sparse requests carry one key, so they run on that
// key's shard like any one-shard request.
//
// Replicated servers (PSKV_REPLICAS >= 1, docs/fault-tolerance.md): a DistServer
// holds one key range (its `range`); a server process runs one per range it holds,
// as primary or replica (ReplicaHost, replicated_server.h), sharing its KVServer.
// Each key remembers, per worker, the count of its last applied push (sent by the
// worker, kv_app.h), so a push retried after a failover that the state already holds
// is answered from the value, never applied twice.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kvstore/distributed/server/answers.h"
#include "kvstore/distributed/server/commands.h"
#include "kvstore/distributed/server/embedding_server.h"
#include "kvstore/distributed/server/primary_replication.h"
#include "kvstore/distributed/server/range_store.h"
#include "kvstore/distributed/server/range_transfer.h"
#include "kvstore/distributed/server/replica_apply.h"
#include "kvstore/distributed/server/replication.h"
#include "kvstore/distributed/server/shard_pool.h"
#include "kvstore/distributed/server/stall_inspector.h"
#include "ps/kv_app.h"

namespace pskv {

/// The refusal of what replicated servers (PSKV_REPLICAS > 0) do not copy to their
/// replicas yet (docs/fault-tolerance.md): `what` is not replicated.
inline std::string NotReplicated(const std::string& what) {
  return what +
         " with PSKV_REPLICAS > 0 is not supported yet (its state would not reach the "
         "replicas, and a promoted replica would serve stale values): set PSKV_REPLICAS=0 for this "
         "job (docs/fault-tolerance.md)";
}

class DistServer {
 public:
  /// Installs itself as `node`'s request handler; call before node->Start().
  explicit DistServer(Node* node);
  /// One key range (`range`) of a replicated server: requests come from `host`
  /// (HandleRequest, RunCommand), which owns `server`; `replicator` sends this
  /// range's changes to its replicas. Call once the node has started.
  DistServer(Node* node, KVServer* server, int range, Replicator* replicator);
  ~DistServer();

  /// A hosted instance's request (the host's KVServer handler).
  void HandleRequest(KVRequest&& req) { Handle(std::move(req)); }
  /// A hosted instance's command; returns the reply body.
  std::string RunCommand(int sender, int head, const std::string& body) {
    return commands_.Run(sender, head, body);
  }
  /// Primary of a replicated range: sends spare `to` a copy of the range
  /// (RangeTransfer::CopyTo). Receive thread.
  void CopyTo(int to) { transfer_.CopyTo(to); }
  /// A replica just promoted to primary of this range sends the last changes it
  /// applied as a replica to the range's other copies (ReplicaApply::ResendLastRounds).
  /// With the embedding tables' last changes (EmbeddingServer::TakeLastChanges).
  size_t ResendLastRounds(std::function<void()> done) {
    return replica_.ResendLastRounds(std::move(done), tables_.TakeLastChanges());
  }

 private:
  /// Receive thread: submits a data request to its shard, or runs it exclusively.
  void Handle(KVRequest&& req);
  /// Runs one request on its shard (or exclusively): picks the component.
  void Process(KVRequest&& req);
  /// A row_sparse request: one key (this server's rows of it), handled by SparseServer.
  void HandleSparse(KVRequest&& req);

  Node* node_;
  std::unique_ptr<KVServer> own_server_;  // a plain server's (null when hosted)
  KVServer* server_;
  RangeOf range_;                     // hosted: the range held; else the node's rank
  Replicator* replicator_ = nullptr;  // hosted only
  ServerAnswers answers_;
  BarrierBoard barriers_;
  RangeStore store_;
  EmbeddingServer tables_;
  std::unique_ptr<PrimaryReplication> primary_;  // hosted only: store_'s listener
  ReplicaApply replica_;
  RangeTransfer transfer_;
  // What runs a data request (Process; WithReplyDelay in dist_server.cc). It and the
  // store's keys are declared before pool_, whose threads use them.
  std::function<void(KVRequest&&)> process_;
  ShardPool<KVRequest> pool_;
  StallInspector inspector_;
  ServerCommands commands_;
};

}  // namespace pskv
