// Barriers: this node's side of the job's barriers, as a component of Node that owns
// that state — how many barriers of each group the scheduler released (as this node
// heard), the barrier this node waits at (resent to a standby that took over), whether
// that is the final one, and (elastic workers) the live workers at each group's last
// release. The counting is the scheduler's (ps/scheduler.h); this is the waiting.
//
// It acts through its Node (sending, the failure, the status reporter, the node
// table's group sizes): it is part of the node's protocol, not an independent layer.
//
// Lock rule: its members are guarded by the Node's mutex (Node::mu_), as the Node's
// own are; each method says whether it is called with that mutex held ("mu_ held")
// or takes it itself ("no lock held"). The Scheduler, on the scheduler's node,
// releases its own waits by writing gen_ (a friend; under the same mutex).
// Threads: the application's (Wait, AwaitAdmission, the queries), the receive thread
// (OnRelease), the timer thread (ResendWait, after a takeover).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

namespace pskv {

class Node;

class Barriers {
 public:
  explicit Barriers(Node& node) : n_(node) {}

  /// No lock held: blocks until every member of `group` called it (the scheduler
  /// counts). `final`: the barrier of Finalize (quieter stall warnings). Throws
  /// NodeFailure / TimeoutError.
  void Wait(int group, std::chrono::milliseconds timeout, bool final);
  /// No lock held: a worker that joined a running job waits for the release of the
  /// epoch barrier that admitted it (it passes no start barrier). Throws as Start does.
  void AwaitAdmission();
  /// No lock held: the live workers at the last release of `group` (empty before it).
  std::vector<int> LiveWorkersAtRelease(int group) const;
  /// No lock held: the barriers of `group` released so far.
  uint64_t Released(int group) const;

  /// mu_ held: a kBarrierDone for `group` (`released`: the scheduler's count of its
  /// releases, 0 from an old sender: one more).
  void OnRelease(int group, uint64_t released);
  /// mu_ held: resends the barrier this node waits at (after a takeover), with the
  /// releases of its group seen so far.
  void ResendWait();
  /// mu_ held: the releases of every group so far (a standby that takes over starts
  /// counting from them).
  std::map<int, uint64_t>& released() { return gen_; }

 private:
  Node& n_;
  std::map<int, uint64_t> gen_;                      // completed barriers per group
  int waiting_group_ = 0;                            // the barrier this node waits at (0: none)
  bool at_final_ = false;                            // this node waits at the final barrier
  std::map<int, std::vector<int>> live_at_release_;  // per barrier group (elastic)

  friend class Scheduler;  // releases the scheduler's own waits (gen_, at_final_)
};

}  // namespace pskv
