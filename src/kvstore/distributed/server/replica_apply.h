// ReplicaApply: the replica side of a replicated key range (PSKV_REPLICAS >= 1,
// docs/fault-tolerance.md): applies the changes the range's primary copies to it, and,
// once promoted, sends the last of them again to the range's other copies.
//
//  * ApplyRound (kReplicate): a dense sync round's sum, acknowledged on receipt and
//    applied right after with the primary's code (RangeStore::ApplyRound: same bits);
//    rounds arrive in order, one already held is acknowledged again, never applied
//    twice; the answers the primary left to this copy are given here (AnswerDelegated).
//  * ApplyAsync (kReplicateAsync): async pushes as the primary applied them (same
//    gradient, same sequence, same rate).
//  * ApplySparse (kReplicateSparse): a row_sparse round (SparseServer::ApplyCopy).
//  * ResendLastRounds (resend.cc): a replica just promoted to primary sends the last
//    changes of every key it applied as a replica to the range's other copies, which
//    may have missed them (the dead primary sent them to this node only).
// Every change is taken only from the range's primary in this node's range table
// (NotFromPrimary).
//
// State: with PSKV_REPLICAS >= 2, per key the last round applied (its request, holding
// the sum's receive buffers) and the last num_workers async copies, for
// ResendLastRounds; kept per shard (kept_[shard]) and touched only by that shard's
// thread or in an exclusive section, like the keys themselves.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvstore/distributed/server/range_store.h"
#include "kvstore/distributed/server/replication.h"
#include "kvstore/distributed/server/shard_pool.h"

namespace pskv {

/// Why `req`, a replicated change (its body starts with the sender's range-table
/// version), may not be applied to `range` on `node`, or "": only the range's primary
/// replicates it.
std::string NotFromPrimary(const Node& node, int range, const KVRequest& req);

class ReplicaApply {
 public:
  /// `replicator`: sends ResendLastRounds' changes; `pool`: its exclusive section.
  ReplicaApply(Node* node, RangeOf range, Replicator* replicator, RangeStore* store,
               ShardPool<KVRequest>* pool);
  ~ReplicaApply();

  /// Acknowledges a kReplicate request (a round's sum) on receipt, then applies it (on
  /// the key's shard, before any later request of the key).
  void ApplyRound(const KVRequest& req);
  /// Applies a kReplicateAsync request and acknowledges it.
  void ApplyAsync(const KVRequest& req);
  /// Applies a kReplicateSparse request for row_sparse key `key` and acknowledges it
  /// (SparseServer answers with `server`).
  void ApplySparse(int64_t key, KVRequest&& req, KVServer* server);
  /// A replica just promoted to primary of this range (receive thread, before any
  /// request of the range runs here as its primary): sends the last changes of every
  /// key it applied as a replica (a dense or row_sparse sync round; dist_async: the
  /// last num_workers copies) to the range's other copies; a copy that holds one
  /// acknowledges it without applying it again. `done` runs once every copy
  /// acknowledged them (or failed), possibly before this returns. Kept only with
  /// PSKV_REPLICAS >= 2. `more`: further sequences of changes kept elsewhere (an
  /// embedding table part's last changes, in order), each sent one per wave. Returns
  /// the number of keys (and sequences) sent.
  size_t ResendLastRounds(std::function<void()> done,
                          std::vector<std::vector<std::shared_ptr<const Message>>> more = {});

 private:
  /// What the primary's workers expect of this copy for one round: Delegated answers.
  struct Delegated {
    int worker;
    uint64_t timestamp;
    int32_t priority, cmd;
  };
  /// Per key, what ResendLastRounds sends again.
  struct Kept {
    std::shared_ptr<const Message> last_round;
    std::deque<std::pair<uint64_t, std::shared_ptr<const Message>>> async_copies;
  };
  /// A kReplicate request, parsed and checked (CheckRound).
  struct RoundIn {
    int64_t key = 0;
    KeyState* st = nullptr;
    int64_t round = 0;
    std::vector<std::pair<int, uint64_t>> counts;  // worker id, push count
    std::vector<Delegated> answers;                // the primary's workers this copy answers
  };
  std::string CheckRound(const KVRequest& req, RoundIn* in);
  /// One key of a kReplicateAsync request, parsed and checked (CheckAsync).
  struct AsyncIn {
    int64_t key;
    KeyState* st;
    uint64_t off, len;
    int64_t seq, schedule_at;
    uint64_t count;
  };
  std::string CheckAsync(const KVRequest& req, DType dtype, std::vector<AsyncIn>* ones,
                         int* sender);
  /// Answers the workers' push-pulls of the round just applied to `key` that the
  /// primary left to this copy, with the value, or with `failure`.
  void AnswerDelegated(int64_t key, KeyState& st, const std::vector<Delegated>& answers,
                       const Failure* failure);

  Node* node_;
  RangeOf range_;
  Replicator* replicator_;
  RangeStore* store_;
  ShardPool<KVRequest>* pool_;
  const bool keep_;  // PSKV_REPLICAS >= 2: keeps what ResendLastRounds sends
  std::vector<std::map<int64_t, Kept>> kept_;  // per shard (keep_ only)
  std::atomic<uint64_t> async_applied_{0};     // kReplicateAsync requests applied (keep_)
  // Push-pulls of workers on this host answered here for the primary
  // (docs/fault-tolerance.md, "Answers from a copy on the worker's host").
  std::atomic<uint64_t> answered_for_primary_{0};
};

}  // namespace pskv
