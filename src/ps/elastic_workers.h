// ElasticWorkers: the scheduler's elastic-worker component (PSKV_ELASTIC;
// docs/fault-tolerance.md, "Elastic workers"). It decides what happens when a worker
// leaves the running job (SurviveWorker: dropped, every node hears kWorkerLeft, unless
// fewer than PSKV_MIN_WORKERS would be left) and when one asks to join it (a new or
// restarted process: refused, or seated in the place of a worker that left at the
// release of the workers' next epoch barrier, which waits until every live server took
// it: kJoinReady).
//
// What it owns: the workers waiting to join and the servers whose kJoinReady the
// epoch barrier's release waits for. What it uses: its Scheduler (a friend: the
// barrier release, refusals and reply channels, SchedulerState's removal reasons and
// temporary ids) and the scheduler's Node (a friend: the membership tables, sending,
// liveness). Threads: every method runs with the Node's mutex held, except
// SurviveWorker, which takes it itself.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "protocol/message.h"

namespace pskv {

class Node;
class Scheduler;

class ElasticWorkers {
 public:
  ElasticWorkers(Node& node, Scheduler& scheduler) : n_(node), s_(scheduler) {}

  /// Worker `dead_id` is gone: drops it from the job (every node hears kWorkerLeft;
  /// barriers count it out). False when that would leave fewer than PSKV_MIN_WORKERS
  /// (then `reason` says so and the job fails). Takes the Node's mutex itself.
  bool SurviveWorker(int dead_id, std::string* reason);
  /// A worker's registration after the job formed: it waits for the workers' next
  /// epoch barrier (kEpochGroup), or is refused (settings differ, the job ends).
  void OnJoinRequest(const NodeDesc& d, const Message& m);
  /// A kJoinReady: server `sender` takes the pushes of the workers just admitted.
  void OnJoinReady(int sender);
  /// At the release of the epoch barrier: seats the workers waiting to join; true
  /// while the release waits for the servers to take them (then ReleaseHeld lets it go).
  bool HoldRelease();
  /// A server left: the held release may not need to wait for it any more.
  void RecheckHeld() {
    if (join_held_) ReleaseHeld();
  }
  /// The job ended before the epoch barrier: refuses the workers waiting, saying `why`.
  void RefuseWaiting(const std::string& why);

 private:
  /// Why worker `d` (registering with `m`) cannot join the running job ("" if it can).
  std::string JoinRefusal(const NodeDesc& d, const Message& m) const;
  /// Seats every worker waiting; true while the release waits for kJoinReady.
  bool AdmitJoiners();
  /// The id a joiner takes: its launcher's rank (DMLC_TASK_ID) if that worker left,
  /// else the lowest that left; 0 when no place is free.
  int PlaceFor(const NodeDesc& asked) const;
  /// Makes joiner `d` (connection `token`) node `id` in the tables and connects it.
  void Seat(int id, uint64_t token, NodeDesc d);
  /// Sends the job to the workers just seated and tells every other node of them.
  void Announce(const std::vector<int>& admitted);
  /// Releases the epoch barrier held for joiners once every live server took them.
  void ReleaseHeld();

  Node& n_;
  Scheduler& s_;
  std::map<uint64_t, NodeDesc> joiners_;  // by token: seated at the next epoch barrier
  std::set<int> join_acks_;               // servers yet to take the workers just seated
  bool join_held_ = false;                // the epoch barrier's release waits for them
};

}  // namespace pskv
