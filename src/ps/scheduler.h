// Scheduler: the scheduler's role in a job, as a component of the scheduler's Node.
//
// What it decides: who is in the job (registration: admits or refuses each
// registrant, checks that every node set the same PSKV_REPLICAS, PSKV_SPARE_SERVERS
// and worker layout, assigns ranks and sends the node table), when a barrier is
// released (distinct arrivals per group; a departure can complete one), and what the
// job does when a server dies with replicated servers (promotes replicas in the
// range table, makes a spare join, publishes the table, tells the removed server,
// lists a spare as replica once it installed its copy).
//
// What it owns: SchedulerState, every fact those decisions rest on that the other
// nodes do not have — one plain struct, so that a standby scheduler could later hold
// a copy of it. The facts every node has (the node table, the range table, the
// departed servers: the Node's Membership; completed barriers) stay in the Node, and a
// standby follows them as every node does (docs/design.md, "The scheduler as a
// component"). Elastic workers are its component ElasticWorkers (elastic_workers.h).
//
// What it uses of its Node (a friend): sending (SendControl, the transport's
// connections), the node table, the range table and departed set, the status
// reporter, liveness and resend. Threads: every method runs with the Node's mutex
// held (the receive thread, the timer thread, or the scheduler's own Barrier call),
// except SurviveServer, which takes it itself and calls the range table handlers
// without it. Node (not this class) answers heartbeats and turns kLeave and silence
// into failures.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/stall.h"
#include "protocol/message.h"
#include "ps/elastic_workers.h"

namespace pskv {

class Node;

/// Distinct arrivals at each group's barrier (a node counts once however often its
/// message comes). Pure bookkeeping: the caller knows the groups' sizes.
class BarrierBook {
 public:
  /// Node `id` arrived at `group`'s barrier, which has `size` members: true when
  /// every member arrived (the caller releases it and Clears the group).
  bool Arrive(int group, int id, int size);
  void Clear(int group) { arrived_[group].clear(); }
  /// Node `id` left the job: its arrivals no longer count.
  void Depart(int id);
  /// The groups some node waits at whose arrivals now reach their size (`size_of`:
  /// a group's size, smaller after a departure), in group order.
  template <typename SizeOf>
  std::vector<int> Completed(SizeOf size_of) const {
    std::vector<int> v;
    for (auto& [group, arrived] : arrived_)
      if (!arrived.empty() && static_cast<int>(arrived.size()) >= size_of(group))
        v.push_back(group);
    return v;
  }
  /// The nodes arrived at `group`'s barrier so far.
  std::vector<int> Arrived(int group) const {
    auto it = arrived_.find(group);
    return it == arrived_.end() ? std::vector<int>{}
                                : std::vector<int>(it->second.begin(), it->second.end());
  }
  bool HasArrived(int group, int id) const {
    auto it = arrived_.find(group);
    return it != arrived_.end() && it->second.count(id) > 0;
  }

 private:
  std::map<int, std::set<int>> arrived_;
};

/// Everything the scheduler knows that the other nodes do not (see the file comment).
struct SchedulerState {
  using Clock = std::chrono::steady_clock;
  // --- registration (until the node table is sent)
  std::map<uint64_t, NodeDesc> pending;  // registrants, by connection identity (token)
  std::map<uint64_t, int> temp_ids;      // token -> temporary peer id for replies
  int next_temp_id = 1000000;
  std::set<uint64_t> spare_tokens;  // registrants that are spare servers
  // Why the job cannot form: a registrant's PSKV_REPLICAS or PSKV_SPARE_SERVERS
  // differs (or the number of spares registered does), or a worker cuts its keys
  // differently from the first ("" while none).
  std::string mismatch;
  // The first registered worker's layout settings (NodeDesc::layout) and its address.
  std::string worker_layout, worker_layout_from;
  // --- barriers
  BarrierBook barriers;
  std::map<int, StallSchedule> barrier_stall;  // open barriers, for stall warnings
  // --- servers removed from the job (replicated servers)
  std::map<int, std::string> removal_reason;      // why each departed
  std::map<int, Clock::time_point> removed_told;  // last told it was removed
  // When the range table last lost a copy of a range that a spare then joined, and
  // what lost it (for the "back to full strength" log line).
  Clock::time_point copy_lost_at{};
  std::string copy_lost_what;
  // --- standby scheduler (scheduler_standby.cc)
  std::map<int, uint64_t> released;  // barriers released so far, per group
  bool took_over = false;            // this scheduler is a standby that took over
  Clock::time_point takeover_at{};
  int left_since_takeover = 0;  // nodes that left instead of rejoining
};

class Scheduler {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Scheduler(Node* node) : node_(node) {}
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // --- registration (scheduler_registration.cc)
  /// A kRegister whose body names the connection's own identity.
  void OnRegister(const Message& m);
  /// Before the job formed: tells every registrant why the start failed (`why`).
  void RefuseRegistered(const std::string& why);
  /// Why the job cannot form although everyone registered ("" if it can).
  const std::string& mismatch() const { return state_.mismatch; }
  /// The message of a registration that timed out (who registered, of how many).
  std::string RegistrationTimeout() const;

  // --- barriers (scheduler.cc)
  /// Node `sender` (the scheduler itself: kSchedulerId) arrived at `group`'s barrier,
  /// having passed `passed` of that group's barriers (a scheduler that took over uses
  /// it to recognise a release of the dead scheduler's that some nodes missed).
  void OnBarrier(int sender, int group, uint64_t passed = 0);
  /// Logs barriers waiting longer than PSKV_STALL_WARNING, naming the nodes that have
  /// not arrived (backing off); timer thread.
  void WarnStalledBarriers(Clock::time_point now);
  /// Node `id` failed: its barrier arrivals no longer count.
  void DropArrivals(int id) { state_.barriers.Depart(id); }

  // --- failures and removals (scheduler.cc)
  /// Tells every other node that `culprit` (kSchedulerId: this one) failed: `why`.
  void AnnounceFailure(int culprit, const std::string& why);
  /// Replicated job: server `dead_id` is gone; promotes its ranges' replicas and
  /// publishes the table. False if some range has no copy left (then `reason` names
  /// the ranges lost and the job fails). Takes the Node's mutex itself.
  bool SurviveServer(int dead_id, std::string* reason);
  /// A kRangeCopied from spare `sender`.
  void OnRangeCopied(const Message& m, int sender);
  /// Tells departed server `id` (still running, or it would not matter) that it was
  /// removed from the job, so that it stops (kNodeFailed naming itself).
  void TellRemoved(int id);

  // --- elastic workers (its component, ps/elastic_workers.h)
  ElasticWorkers& elastic() { return elastic_; }
  // --- standby scheduler (scheduler_standby.cc)
  /// This standby takes over; `released`: the releases it followed, per group.
  void TakeOver(const std::map<int, uint64_t>& released, Clock::time_point at);
  /// A kRejoin from node `sender` after the takeover (its range table).
  void OnRejoin(const Message& m, int sender);
  /// After a takeover: node `id` rejoined or left the job (no kRejoin will come from
  /// it); logs when every node did. Repeats do nothing.
  void Settled(int id);
  /// A standby scheduler's registration after the job formed (the launcher starts a
  /// fresh one after a takeover, or after the standby died): admitted as kStandbyId
  /// when the job has none — it gets the node table, the range table, the workers that
  /// left and the count of every group's releases, and every node learns of it
  /// (kNodeTable, head kNodeTableStandby) — else refused.
  void AdmitStandby(const NodeDesc& d, const Message& m);

  /// What a standby would copy (issue 42).
  const SchedulerState& state() const { return state_; }

 private:
  static constexpr int kMaxRefusalsPerSecond = 32;
  /// Sends `why` to registrant `d` on a temporary connection (rate limited).
  void Refuse(const NodeDesc& d, const std::string& why);
  /// Connects a reply channel to registrant `d` under temporary id `tid` (once).
  void ReplyTo(const NodeDesc& d, int tid);
  /// A registrant not seen before: admitted (true) or refused.
  bool Admit(const NodeDesc& d, const Message& m);
  /// Records the first setting of a registrant that differs from the job's.
  void CheckSettings(const NodeDesc& d, const Message& m);
  /// Every node registered: ranks, the node table, connections.
  void CompleteRegistration();
  /// Every member of `group` arrived: releases it.
  void Release(int group);
  /// Releases barriers that a departure completed.
  void ReleaseCompletedBarriers();
  /// Sends the range table to every node still in the job.
  void PublishRanges();
  Node* node_;
  SchedulerState state_;
  ElasticWorkers elastic_{*node_, *this};
  // Refusals sent in the current second (not job state: a standby starts afresh).
  Clock::time_point refusal_window_;
  int refusals_ = 0;

  friend class ElasticWorkers;  // its component: releases, refusals, removal reasons
};

}  // namespace pskv
