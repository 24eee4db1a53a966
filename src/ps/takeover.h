// Takeover: the standby scheduler's failover (PSKV_SCHEDULER_STANDBY;
// docs/fault-tolerance.md, "The scheduler"), as a component of Node that owns its
// state — both sides of it: the standby's (it asks the nodes whether they lost the
// scheduler too, takes over, repeats kTakeover until every node rejoined) and a
// node's (it answers the standby's question, waits a bounded time for the takeover
// once it lost its scheduler, follows the standby, moves its registration to the
// standby when the scheduler died before the job formed). The protocol is described
// in takeover.cc; the scheduler's part of a takeover (adopting the newest range
// table, counting the rejoins) is Scheduler's (scheduler_standby.cc).
//
// It acts through its Node (the transport, the node table in Membership, liveness,
// resend, the status reporter, sending, failing): it is part of the node's protocol,
// not an independent layer.
//
// Lock rule: its members are guarded by the Node's mutex (Node::mu_), as the Node's
// own are; each method says whether it is called with that mutex held ("mu_ held")
// or takes it itself ("no lock held"). Threads: the timer thread (Tick, and Seek /
// Await through failure detection), the receive thread (Answer, Vote, OnNodeTable),
// the application's (Finalize).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

namespace pskv {

class Node;
struct NodeDesc;
struct Message;

class Takeover {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Takeover(Node& node) : n_(node) {}

  // --- the standby
  /// The scheduler is gone (`why`); this process becomes the scheduler. No lock held.
  void TakeOver(const std::string& why);
  /// After the job formed: the scheduler seems gone from here (`why`); asks every
  /// node whether it lost it too, and takes over only once each did or is gone
  /// itself (Tick). No lock held.
  void Seek(const std::string& why);
  /// mu_ held: node `sender`'s answer (kRejoin head kVoteLost / kVoteAlive).
  void Vote(int sender, int head);
  /// mu_ held: the scheduler released the final barrier (the job ended).
  void JobDone() { job_done_ = true; }
  /// Finalize of a standby: waits for the scheduler's final release (true: the job
  /// ended or failed, the node stopped) or its own takeover (false: Finalize goes on
  /// as the scheduler's). No lock held.
  bool Finalize();

  // --- a node
  /// mu_ held: a kTakeover with head `head` from the standby — a question (answered
  /// with a vote) or a commit (followed if this node lost its scheduler).
  void Answer(int head, std::unique_lock<std::mutex>& lk);
  /// The scheduler died (`why`): waits a bounded time for the standby's kTakeover
  /// instead of failing (false: no standby, fail as before). No lock held.
  bool Await(const std::string& why);
  /// mu_ held: registers with the standby too (`head`, `body`: the kRegister), so a
  /// node started after the scheduler died reaches the job.
  void RegisterWithStandby(int head, const std::string& body);
  /// mu_ held, at the node table: the registration's link to the standby is closed;
  /// "the scheduler" moves to `scheduler` (its entry, if any) if a standby that took over before
  /// the job formed sent the table.
  void OnNodeTable(const NodeDesc* scheduler);

  /// mu_ held, a node of a running job: the scheduler's kNodeTable (head
  /// kNodeTableStandby) naming a fresh standby, which the table names from now on.
  void AddStandby(const Message& m);
  /// Timer thread, no lock held: a standby's takeover before it had the node table,
  /// a node's registration moved to the standby, kTakeover repeated, the standby's
  /// question repeated and decided, and a node whose standby never took over fails.
  void Tick(Clock::time_point now);

 private:
  /// A standby asking the nodes, mu_ held: asks again those that did not say they
  /// lost the scheduler; true (with `*takeover_why`) when every node lost it too;
  /// `*gave_up` when some did not within the bound (this standby then stops).
  bool AskOrDecide(Clock::time_point now, std::string* takeover_why, std::string* gave_up);
  /// mu_ held: whether this node's own link to the scheduler is lost.
  bool LostHere() const;
  /// mu_ held: the standby took over; "the scheduler" is it from now on.
  void Follow();

  Node& n_;
  bool job_done_ = false;         // the standby saw the scheduler's final release
  std::set<int> rejoin_pending_;  // the scheduler that took over: nodes to answer kTakeover
  Clock::time_point next_takeover_{};
  // A standby that lost the scheduler: since when it asks the nodes (epoch: not
  // asking), why, and their latest answers (bounded by the node table).
  Clock::time_point seeking_since_{};
  std::string seeking_why_;
  std::set<int> votes_lost_, votes_alive_;
  bool vote_linked_ = false;  // a node: connected to the standby to answer its question
  // A node: when it lost the scheduler and waits for the standby's kTakeover (epoch:
  // not waiting); whether its registration moved to the standby.
  Clock::time_point awaiting_takeover_{};
  std::string scheduler_lost_;
  bool registration_moved_ = false;
  bool standby_linked_ = false;  // registrations also go to the standby (kStandbyId)

  friend class Scheduler;  // counts the rejoins (rejoin_pending_)
};

}  // namespace pskv
