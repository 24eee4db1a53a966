// PrimaryReplication: the primary side of a replicated key range (PSKV_REPLICAS >= 1,
// docs/fault-tolerance.md) — the listener of its RangeStore's events (range_store.h).
//
//  * A round closed (OnRoundClosed): the round's sum and the pushes' counts go to the
//    range's replicas (kReplicate), and the round's pushes are answered only when
//    every replica acknowledged it. A replica applies the sum with the same code (same
//    bits). A one-key push-pull whose worker named the only replica as its answerer
//    is answered there instead ("Answers from a copy on the worker's host").
//  * Async pushes applied (OnAsyncApplied): copied as the gradients the primary
//    applied, each with the key's apply sequence and the update count its learning
//    rate came from (kReplicateAsync), so that a replica repeats the same updates in
//    the same order with the same rates (same bits); the push is answered when every
//    replica acknowledged it.
//  * An init or an optimizer-states load applied (OnInitApplied): forwarded as it is
//    (Forward), answered when the replicas applied it too.
// Only a worker's request is copied on: what a primary sends is applied, not sent on.
//
// Threads: the events arrive on the key's shard (or in an exclusive section); the
// answers run on the thread that delivers the replicas' acknowledgements (the
// receive thread). Holds no state of its own but the Replicator it sends with.
#pragma once

#include <vector>

#include "kvstore/distributed/server/range_store.h"
#include "kvstore/distributed/server/replication.h"

namespace pskv {

class PrimaryReplication final : public RangeEvents {
 public:
  PrimaryReplication(Node* node, RangeOf range, Replicator* replicator, RangeStore* store)
      : node_(node), range_(range), replicator_(replicator), store_(store) {}

  /// The servers to copy `req`'s changes to: none unless it came from a worker.
  std::vector<int> Targets(const KVRequest& req) const;
  /// `req` (an init, dense or row_sparse, or a states load, applied here) sent on to
  /// `to`; answered when they did. An init carries the worker it came from and its
  /// push counts (InitOriginOf), by which a copy knows a retried init.
  void Forward(const KVRequest& req, const std::vector<int>& to);
  /// On the key's shard: true if `req` is a worker's one-key push-pull sent again while
  /// its first copy still waits in the key's open round (its answerer left the range):
  /// that one is then answered here, and `req` is dropped (same timestamp).
  bool RetryOfWaitingPush(const KVRequest& req);

  bool OnRoundClosed(RoundClosed& ev) override;
  bool OnAsyncApplied(AsyncApplied& ev) override;
  bool OnInitApplied(const KVRequest& req) override;

 private:
  Node* node_;
  RangeOf range_;
  Replicator* replicator_;
  RangeStore* store_;
};

}  // namespace pskv
