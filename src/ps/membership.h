// Membership: who is in the job as one node sees it — a component of Node that owns
// that state: the node table (and the connection identities it binds), the servers
// and workers that left the job, the servers this node lost and waits for a verdict
// on (suspects), and, with replicated servers, the range table. Pure bookkeeping: it
// sends, connects and logs nothing; Node (and its Scheduler) act on what it answers.
//
// Lock rule: Membership has no lock of its own. Every member is guarded by the owning
// Node's mutex (Node::mu_): every method is called with it held (Node's public
// queries take it and delegate). The Scheduler, which decides membership on the
// scheduler's node, writes the tables directly (a friend; under the same mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "protocol/message.h"
#include "ps/range_table.h"
#include "pskv/options.h"

namespace pskv {

class Membership {
 public:
  using Clock = std::chrono::steady_clock;

  /// Sizes and names from `o`; the initial range table when servers replicate.
  explicit Membership(const Options& o);

  /// True when servers replicate their ranges (PSKV_REPLICAS >= 1 and S >= 2).
  bool replicated() const { return replicated_; }
  /// The servers that hold the job's key ranges at the start.
  std::vector<int> ServerIds() const;
  /// Every server process: ServerIds() and the spares.
  std::vector<int> AllServerIds() const;
  std::vector<int> WorkerIds() const;
  /// AllServerIds() less those the range table removed.
  std::vector<int> LiveServerIds() const;
  /// WorkerIds() less those an elastic job dropped.
  std::vector<int> LiveWorkerIds() const;
  /// The live members of barrier group `group` (kSchedulerGroup | kServerGroup | ...).
  int GroupSize(int group) const;
  std::vector<int> GroupMembers(int group) const;
  /// The node id bound to connection identity `token`, or 0 (unknown).
  int IdOfToken(uint64_t token) const;
  /// "worker[1] at 127.0.0.1:4321" for any node id of the job.
  std::string Name(int id) const;
  /// The address node `id` advertised; "" if unknown.
  std::string HostOf(int id) const;
  /// The primary of key range `range` (-1: no such range) and the table's version.
  std::pair<int, uint64_t> RangePrimary(int range) const;
  /// Replicated: server `id` left the range table or this node lost it (a suspect).
  bool ServerLost(int id) const;
  /// Server or worker `id` left the job (nothing it sends counts any more).
  bool Departed(int id) const { return departed_.count(id) || departed_workers_.count(id); }
  bool ServerDeparted(int id) const { return departed_.count(id) > 0; }
  bool Has(int id) const { return nodes_.count(id) > 0; }
  const std::map<int, NodeDesc>& nodes() const { return nodes_; }
  const RangeTable& ranges() const { return ranges_; }

  // --- changes (Node's handlers; the Scheduler's decisions)
  /// Adopts the scheduler's node table.
  void AdoptTable(const std::vector<NodeDesc>& all);
  /// Forgets every node (a standby that took over before the job formed).
  void Clear();
  /// The standby took over: the table's standby entry becomes the scheduler's (the
  /// old scheduler's and standby's identities are forgotten); returns that entry.
  NodeDesc PromoteStandby();
  /// Drops the standby from the table (it died); false if it was not there.
  bool DropStandby();
  /// A fresh standby `d` (id kStandbyId) replaces the table's standby, if any; false
  /// if it is that one already (a resent notice).
  bool SetStandby(const NodeDesc& d);
  /// Applies a newer range table; false if it is not newer. `gone`: the servers it
  /// removed that had not departed yet (now departed).
  bool ApplyRanges(const RangeTable& next, std::vector<int>* gone);
  /// This node lost server `id` (`reason`) and waits for the range table; false if
  /// the table removed it already.
  bool Suspect(int id, const std::string& reason);
  /// Forgets suspects the table removed; the first one lost longer than `grace`
  /// ago (id, reason), or {0, ""}.
  std::pair<int, std::string> OverdueSuspect(Clock::time_point now, Clock::duration grace);
  /// Elastic: worker `id` left the job; false if known already.
  bool WorkerLeft(int id) { return departed_workers_.insert(id).second; }
  /// Elastic: worker `d` joined in place of one that left; false if known already
  /// (a resent notice).
  bool WorkerJoined(const NodeDesc& d);

 private:
  const int num_workers_, num_servers_, spare_servers_;
  const std::string scheduler_at_, standby_at_;  // for Name()
  const bool replicated_;
  std::map<int, NodeDesc> nodes_;        // the node table, by id
  std::map<uint64_t, int> id_of_token_;  // connection identity -> node id (from the table)
  RangeTable ranges_;                    // replicated servers only
  std::set<int> departed_;               // servers the range table removed
  std::set<int> departed_workers_;       // workers an elastic job dropped
  struct Suspect_ {
    Clock::time_point since;  // when this node found the server gone
    std::string reason;
  };
  std::map<int, Suspect_> suspects_;  // replicated: servers lost here, not yet removed

  friend class Scheduler;       // decides membership on the scheduler's node
  friend class ElasticWorkers;  // the scheduler's component: seats joining workers
};

}  // namespace pskv
