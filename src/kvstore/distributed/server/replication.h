// Replicator: a primary server's requests to the replicas of its key ranges, and
// their answers (docs/fault-tolerance.md, "Replicated servers, first slice").
//
// Send() sends one request to several replicas and runs its `done` exactly once:
// when every one answered (an error answer makes it an error), or with the job's
// failure. A replica that leaves the job (a newer range table no longer lists it)
// counts as having answered: the range goes on without it. Which servers replicate
// a range comes from the node's range table (ps/range_table.h).
//
// Threads: Send from any thread (the shard threads); answers, range tables and the
// job's failure arrive on the node's receive thread. `done` runs without the lock.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "ps/node.h"

namespace pskv {

class Replicator {
 public:
  using Done = std::function<void(std::exception_ptr)>;
  /// Subscribes to `node`'s range tables and failure; call before node->Start().
  explicit Replicator(Node* node);

  /// The servers other than this one that hold a copy of `range` (its primary and
  /// replicas, less this node and servers that left), and the spares joining it that
  /// this node has sent its copy to (AddCopying).
  std::vector<int> Targets(int range) const;
  /// This node (the range's primary) sent its copy of `range` to joining spare `id`:
  /// from now on the range's changes go to it too, while the range table lists it as
  /// joining (docs/fault-tolerance.md, "Back to full strength"). Call in the exclusive
  /// section that took the copy, so that every later change follows the copy.
  void AddCopying(int range, int id);
  /// Sends request `m` to each of `to` that the range table still lists (a server
  /// removed since `to` was chosen counts as having answered); `done` runs once, as
  /// above (at once, here, when no server of `to` is left).
  void Send(const std::vector<int>& to, Message m, Done done);
  /// An answer to one of our requests (the KVServer's reply handler).
  void OnReply(Message&& m);
  /// The version of the range table this replicator routes by (sent with each
  /// replicated round: a replica that has not applied that table yet still takes the
  /// round from a newly promoted primary).
  uint64_t version() const;
  /// True if server `id` holds a copy of `range` (primary or replica) in the table.
  bool Holds(int range, int id) const;
  /// Requests in flight.
  size_t Pending() const;

 private:
  struct Request {
    std::set<int> waiting;  // servers that have not answered
    std::exception_ptr error;
    Done done;
    bool narrowed = false;  // sent to fewer servers than `waiting` (FailPoints::ReplicationFanout)
  };
  void OnRangeTable(const RangeTable& t);
  void OnFailure(std::exception_ptr e);
  /// Runs the done of every request that waits for nobody (mu_ held on entry, taken
  /// again on return).
  void FinishReady(std::unique_lock<std::mutex>& lk);

  Node* node_;
  mutable std::mutex mu_;
  RangeTable table_;
  uint64_t next_ts_ = 1;
  std::map<uint64_t, Request> pending_;
  std::map<int, std::set<int>> copying_;  // range -> joining spares sent a copy
};

}  // namespace pskv
