// ServerCommands: a key range's commands (dist_protocol.h, Command) and its
// optimizer-states requests.
//
// One method per command, each run in an exclusive section of the pool (so a command
// sees every key between two of its rounds); a command's exception becomes its error
// reply. Most configure the RangeStore (mode, optimizers, compression, workers done);
// kReportInit/kCheckInit go to InitChecks, kBarrierState to the BarrierBoard,
// kRoundStatus to the StallInspector. Optimizer states travel as data (states.cc):
// kStatesSize snapshots a store's states; a pull of the store's key 0 (Kind::kStates)
// returns the snapshot and drops it; a push to it loads states (on a replicated
// range's primary, then on its replicas: the store's OnInitApplied, before the answer).
//
// State: the init reports and the states snapshot, written in exclusive sections.
#pragma once

#include <memory>
#include <string>

#include "kvstore/distributed/server/init_checks.h"
#include "kvstore/distributed/server/range_store.h"
#include "kvstore/distributed/server/shard_pool.h"
#include "kvstore/distributed/server/stall_inspector.h"

namespace pskv {

class EmbeddingServer;

class ServerCommands {
 public:
  /// `events`: told of a states load applied (null: none). `server`: row_sparse
  /// rounds failed by kWorkerDone are answered with it.
  ServerCommands(Node* node, KVServer* server, RangeStore* store, EmbeddingServer* tables,
                 ShardPool<KVRequest>* pool, BarrierBoard* barriers, StallInspector* inspector,
                 RangeEvents* events)
      : node_(node),
        server_(server),
        store_(store),
        tables_(tables),
        pool_(pool),
        barriers_(barriers),
        inspector_(inspector),
        events_(events) {}

  /// Runs command `head` (bits 0..7: the command, 8..: the store it concerns) of
  /// `sender` in an exclusive section; returns the reply body.
  std::string Run(int sender, int head, const std::string& body);
  /// A Kind::kStates request, in an exclusive section.
  void HandleStates(KVRequest&& req);

 private:
  /// What a command handler gets: the sender, the store the command concerns
  /// (bits 8.. of the head) and the body.
  struct Call {
    int sender;
    int store;
    const std::string& body;
  };
  using Fn = std::string (ServerCommands::*)(const Call&);
  std::string SetMode(const Call& c);
  std::string SetOptimizer(const Call& c);
  std::string SetCompression(const Call& c);
  std::string WorkerDone(const Call& c);
  std::string HasOptimizer(const Call& c);
  std::string ReportInit(const Call& c);
  std::string CheckInit(const Call& c);
  std::string BarrierState(const Call& c);
  std::string RoundStatus(const Call& c);
  std::string StatesSize(const Call& c);  // states.cc

  Node* node_;
  KVServer* server_;
  RangeStore* store_;
  EmbeddingServer* tables_;  // the embedding tables' rounds failed by kWorkerDone
  ShardPool<KVRequest>* pool_;
  BarrierBoard* barriers_;
  StallInspector* inspector_;
  RangeEvents* events_;
  InitChecks init_checks_;
  std::shared_ptr<const std::string> states_snapshot_;  // taken by kStatesSize
  int states_store_ = 0;                                // the store of states_snapshot_
};

}  // namespace pskv
