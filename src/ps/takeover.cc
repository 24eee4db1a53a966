// Takeover (ps/takeover.h): the standby scheduler (PSKV_SCHEDULER_STANDBY;
// docs/fault-tolerance.md, "The scheduler"): the scheduler is no single point of
// failure.
//
// Before a takeover the standby is a node of the job that the scheduler waits for at
// registration (id kStandbyId, in every node's table with its token) and that follows
// it: it connects to every node (sending nothing: a node that dies with the scheduler
// is then known gone at the takeover, by its closed port), receives every range
// table, every barrier release (with the count of releases of its group) and every
// elastic worker's leave and join (it links a joined worker too), heartbeats it and
// watches it like the scheduler watches nodes — silence, or its port closed (a killed
// process: known at once). It never decides anything until then.
//
// A fresh standby (registered after the job formed, Scheduler::AdmitStandby) gets
// that state from the scheduler at once; every node then learns of it (kNodeTable,
// head kNodeTableStandby: AddStandby) and takes its question and takeover, no other.
//
// Takeover: the standby finds the scheduler gone, takes the id kSchedulerId, connects
// to every node of the table and sends each kTakeover (repeated until it answers).
// A node accepts kTakeover only from the standby's token, the one its node table
// names: it rebinds "the scheduler" to the standby (the dead scheduler's identity is
// forgotten: whatever it might still send is dropped), answers kRejoin with its range
// table, and resends what it waits for — its barrier (with the number of releases of
// that group it saw), the range copies it installed (spares). What the dead scheduler
// published to some nodes only is recovered: the newest range table any node reports
// is adopted and republished; a barrier release some nodes got and others did not is
// recognised from those counts (a node that reports one release more proves it; a
// node one behind is released at once). Barrier arrivals are sets: a resent arrival
// counts once. Data never passes through the scheduler, so no round is lost.
//
// Split brain: a standby that lost the scheduler after the job formed first asks
// every node (kTakeover, ask) and takes over only if each lost it too or is gone.
//
// Before the job formed, there is no table to follow: a node whose scheduler's port
// closed registers with the standby instead, and the standby, finding the scheduler
// gone, collects the registrations itself.
//
// A node that finds the scheduler dead before any kTakeover arrived waits for one,
// for as long as its own detection took (heartbeat timeout + interval), then fails
// naming both. Threads: as the Node's (node.h).
#include "ps/takeover.h"

#include <algorithm>

#include "common/logging.h"
#include "ps/node.h"
#include "ps/node_internal.h"
#include "ps/node_start.h"
#include "ps/scheduler.h"
#include "pskv/error.h"

namespace pskv {

using namespace std::chrono_literals;
using node_internal::SecsStr;

namespace {
// A kTakeover of `head` (ask or commit) to node `to`, from the standby's identity (the
// one the node's table names).
Message TakeoverMessage(uint8_t head, int to, uint64_t job) {
  Message m;
  m.h.control = static_cast<uint8_t>(Control::kTakeover);
  m.h.head = head;
  m.h.sender = kStandbyId;
  m.h.recver = to;
  m.h.job = job;
  return m;
}
constexpr auto kTakeoverRepeat = 200ms;
constexpr auto kAskRepeat = 50ms;  // the question to the nodes that did not lose it yet
}  // namespace

// ------------------------------------------------------------------ the standby

void Takeover::TakeOver(const std::string& why) {
  const auto t0 = Clock::now();
  size_t nodes = 0;
  {
    std::lock_guard<std::mutex> lk(n_.mu_);
    if (!n_.standby_ || n_.finished_ || n_.failure_ || job_done_ || n_.stop_) return;
    n_.standby_ = false;
    n_.id_ = kSchedulerId;
    n_.rank_ = 0;
    n_.transport_->Disconnect(kSchedulerId);
    // The dead scheduler: this process has its id now (its sequence numbers too).
    n_.ForgetPeer(kSchedulerId, Node::Forgotten::kReplaced);
    n_.status_.SetRank(0);
    if (!n_.ready_) {
      // Before the job formed: registrations start afresh here (nodes move theirs).
      n_.members_.Clear();
      n_.scheduler_token_ = 0;
      PSKV_WARN(n_.Tag() << ": " << why << "; the standby scheduler at "
                         << n_.options_.standby_scheduler
                         << " takes over and collects the registrations");
      n_.cv_.notify_all();
      return;
    }
    // The dead scheduler's identity is forgotten: whatever it might still send is
    // dropped. This process is "the scheduler" of the table from now on.
    n_.members_.PromoteStandby();
    for (auto& [id, d] : n_.members_.nodes()) {
      if (id == kSchedulerId || n_.members_.ServerDeparted(id)) continue;
      rejoin_pending_.insert(id);
    }
    nodes = rejoin_pending_.size();
    n_.scheduler_->TakeOver(n_.barriers_.released(), t0);
    // The start barrier still open: the dead scheduler's arrival is this one's.
    if (n_.barriers_.released()[kAllGroup] == 0) n_.scheduler_->OnBarrier(kSchedulerId, kAllGroup);
    next_takeover_ = {};
    PSKV_WARN(n_.Tag() << ": " << why << "; the standby at " << n_.options_.standby_scheduler
                       << " takes over as the job's scheduler; telling the " << nodes << " nodes");
  }
  {
    std::lock_guard<std::mutex> lk(n_.mu_);
    NodeStart(n_).StartWatching();  // every node now, as the scheduler does
  }
  Tick(Clock::now());  // the first kTakeover at once
  n_.cv_.notify_all();
}

void Takeover::Seek(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(n_.mu_);
    if (!n_.standby_ || n_.finished_ || n_.failure_ || job_done_ || n_.stop_) return;
    if (seeking_since_ != Clock::time_point{}) return;  // asking already
    seeking_since_ = Clock::now();
    seeking_why_ = why;
    next_takeover_ = {};
    PSKV_WARN(n_.Tag() << ": " << why
                       << "; asking every node whether it lost the scheduler too before taking "
                          "over");
  }
  n_.liveness_.Forget(kSchedulerId);
  Tick(Clock::now());  // the first question at once
}

void Takeover::Vote(int sender, int head) {
  if (seeking_since_ == Clock::time_point{}) return;  // late: decided already
  (head == kVoteLost ? votes_lost_ : votes_alive_).insert(sender);
  (head == kVoteLost ? votes_alive_ : votes_lost_).erase(sender);
}

bool Takeover::Finalize() {
  std::unique_lock<std::mutex> lk(n_.mu_);
  // Until the scheduler's final release (the job ended), a failure, or a takeover.
  // Bounded by failure detection: the standby watches the scheduler.
  n_.cv_.wait(lk, [&] { return job_done_ || n_.failure_ || !n_.standby_ || n_.stop_; });
  if (n_.failure_ || job_done_ || n_.stop_) {
    std::exception_ptr err = n_.failure_;
    n_.finished_ = true;
    lk.unlock();
    n_.liveness_.Stop();
    if (err)
      n_.status_.Failed(ErrorKindName(err), ErrorMessage(err));
    else
      n_.status_.SetPhase(StatusPhase::kFinished);
    n_.StopThreads(200ms);
    n_.stopped_ = true;
    if (err) std::rethrow_exception(err);
    return true;
  }
  // Took over: the final barrier follows the start barrier (which a takeover during
  // start-up completes first).
  n_.cv_.wait(lk,
              [&] { return n_.barriers_.released()[kAllGroup] >= 1 || n_.failure_ != nullptr; });
  return false;  // Finalize goes on as the scheduler's
}

void Takeover::Tick(Clock::time_point now) {
  const Options& o = n_.options_;
  if (o.standby_scheduler.empty()) return;
  std::string lost_why, gave_up;
  bool take_over = false;
  std::string takeover_why =
      "the scheduler at " + o.root_uri + ":" + std::to_string(o.root_port) +
      " is gone before the job formed (its connection closed and a new one was refused)";
  {
    std::lock_guard<std::mutex> lk(n_.mu_);
    if (n_.stop_ || n_.finished_ || n_.failure_) return;
    const bool gone = n_.transport_->GoneSince(kSchedulerId) != Clock::time_point{};
    if (n_.standby_ && !n_.ready_ && gone) {
      take_over = true;  // below, without the lock
    } else if (!n_.IsScheduler() && !n_.standby_ && !n_.ready_ && gone && !registration_moved_) {
      // The scheduler's port closed before the job formed: register with the standby.
      registration_moved_ = true;
      n_.transport_->Disconnect(kSchedulerId);
      n_.transport_->Connect(kSchedulerId, o.standby_scheduler, kSchedulerToken);
      n_.scheduler_token_ = 0;  // bound to whoever answers there (a scheduler of this job)
      PSKV_WARN(n_.Tag() << ": the scheduler at " << o.root_uri << ":" << o.root_port
                         << " is gone; registering with the standby scheduler at "
                         << o.standby_scheduler);
    } else if (n_.IsScheduler() && !rejoin_pending_.empty() && now >= next_takeover_) {
      next_takeover_ = now + kTakeoverRepeat;
      // A node that left meanwhile (a server removed from the range table, an elastic
      // worker dropped) will not answer.
      for (int id : std::set<int>(rejoin_pending_))
        if (n_.members_.Departed(id)) n_.scheduler_->Settled(id);
      for (int id : rejoin_pending_) {
        try {
          n_.transport_->Send(id, Encode(TakeoverMessage(kTakeoverCommit, id, n_.job_)));
        } catch (const std::exception& e) {
          PSKV_LOG_LIMITED(n_.limiter_, "takeover", "WARN",
                           n_.Tag() << ": cannot tell " << n_.NameLocked(id) << ": " << e.what());
        }
      }
    } else if (n_.standby_ && seeking_since_ != Clock::time_point{}) {
      take_over = AskOrDecide(now, &takeover_why, &gave_up);
    } else if (awaiting_takeover_ != Clock::time_point{} &&
               now - awaiting_takeover_ > o.heartbeat_timeout + o.heartbeat_interval) {
      lost_why = scheduler_lost_ + "; the standby scheduler at " + o.standby_scheduler +
                 " did not take over within " +
                 SecsStr(o.heartbeat_timeout + o.heartbeat_interval) +
                 " (is it running? its log says why)";
      awaiting_takeover_ = {};
    }
  }
  if (take_over) TakeOver(takeover_why);
  if (!lost_why.empty()) n_.Fail(std::make_exception_ptr(NodeFailure(lost_why)), kSchedulerId);
  if (!gave_up.empty()) n_.Fail(std::make_exception_ptr(NodeFailure(gave_up)));
}

bool Takeover::AskOrDecide(Clock::time_point now, std::string* takeover_why, std::string* gave_up) {
  // Split brain: only a scheduler that every node lost is taken over. A node that
  // still reaches it says so; one that does not answer may be cut off from this
  // standby only. A node gone itself (its port closed: died with the scheduler)
  // counts as lost.
  const Options& o = n_.options_;
  std::vector<int> alive, silent;
  int lost = 0, gone = 0;
  for (auto& [id, d] : n_.members_.nodes()) {
    if (id == kSchedulerId || id == kStandbyId || n_.members_.Departed(id)) continue;
    if (votes_lost_.count(id))
      ++lost;
    else if (n_.transport_->GoneSince(id) != Clock::time_point{})
      ++gone;
    else
      (votes_alive_.count(id) ? alive : silent).push_back(id);
  }
  const std::chrono::milliseconds bound =
      std::max<std::chrono::milliseconds>(o.heartbeat_timeout + o.heartbeat_interval, 1s);
  if (alive.empty() && silent.empty()) {
    *takeover_why = seeking_why_ + "; every node lost it too (" + std::to_string(lost) +
                    " said so, " + std::to_string(gone) + " gone with it)";
    seeking_since_ = {};
    return true;
  } else if (now - seeking_since_ > bound) {
    std::string who;
    for (int id : alive) who += (who.empty() ? "" : ", ") + n_.NameLocked(id);
    std::string quiet;
    for (int id : silent) quiet += (quiet.empty() ? "" : ", ") + n_.NameLocked(id);
    *gave_up = seeking_why_ + "; but " +
               (alive.empty() ? std::string("no node confirmed it")
                              : who + " still reach" + (alive.size() > 1 ? "" : "es") + " it") +
               (quiet.empty() ? "" : " (no answer from " + quiet + ")") + " within " +
               SecsStr(bound) +
               ": this standby is cut off from a scheduler that lives (a network "
               "partition?) and does not take over (two schedulers would split the "
               "job); it stops, and the job goes on without a standby";
    seeking_since_ = {};
  } else if (now >= next_takeover_) {
    next_takeover_ = now + kAskRepeat;
    for (auto* v : {&alive, &silent})
      for (int id : *v) {
        try {
          n_.transport_->Send(id, Encode(TakeoverMessage(kTakeoverAsk, id, n_.job_)));
        } catch (const std::exception& e) {
          PSKV_LOG_LIMITED(n_.limiter_, "ask", "WARN",
                           n_.Tag() << ": cannot ask " << n_.NameLocked(id) << ": " << e.what());
        }
      }
  }
  return false;
}

// ------------------------------------------------------------------ the nodes

bool Takeover::Await(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(n_.mu_);
    if (!n_.members_.Has(kStandbyId) || n_.failure_ || n_.finished_) return false;  // none
    if (awaiting_takeover_ != Clock::time_point{}) return true;
    awaiting_takeover_ = Clock::now();
    scheduler_lost_ = why;
  }
  n_.liveness_.Forget(kSchedulerId);  // watched again once the standby took over
  PSKV_WARN(n_.Tag() << ": " << why << "; waiting for the standby scheduler at "
                     << n_.options_.standby_scheduler << " to take over");
  return true;
}

bool Takeover::LostHere() const {
  return awaiting_takeover_ != Clock::time_point{} ||
         n_.transport_->GoneSince(kSchedulerId) != Clock::time_point{};
}

void Takeover::Answer(int head, std::unique_lock<std::mutex>& lk) {
  (void)lk;  // held throughout
  const bool lost = LostHere();
  if (head == kTakeoverCommit && lost) return Follow();
  // A question; or a commit while this node still reaches its scheduler, refused:
  // following it would make two schedulers of one job (docs/security.md).
  if (!n_.members_.Has(kStandbyId)) return;
  if (head == kTakeoverCommit)
    PSKV_LOG_LIMITED(n_.limiter_, "takeover-refused", "WARN",
                     n_.Tag() << ": refused the standby scheduler's takeover: the scheduler "
                                 "still answers here");
  const NodeDesc& sd = n_.members_.nodes().at(kStandbyId);
  if (!vote_linked_) {  // answered on a connection of its own (the standby is no peer)
    n_.transport_->Connect(kStandbyId, sd.host + ":" + std::to_string(sd.port), sd.token);
    vote_linked_ = true;
  }
  n_.SendControl(kStandbyId, Control::kRejoin, lost ? kVoteLost : kVoteAlive);
}

void Takeover::Follow() {
  if (n_.members_.Has(kStandbyId)) {
    if (vote_linked_) n_.transport_->Disconnect(kStandbyId);
    vote_linked_ = false;  // a fresh standby's question needs a link of its own
    const NodeDesc sd = n_.members_.PromoteStandby();
    n_.scheduler_token_ = sd.token;
    n_.transport_->Disconnect(kSchedulerId);
    n_.transport_->Connect(kSchedulerId, sd.host + ":" + std::to_string(sd.port), sd.token);
    // The dead one; its sequence numbers too: the standby's start afresh.
    n_.ForgetPeer(kSchedulerId, Node::Forgotten::kReplaced);
    const bool waited = awaiting_takeover_ != Clock::time_point{};
    awaiting_takeover_ = {};
    n_.liveness_.Watch(kSchedulerId);
    PSKV_WARN(n_.Tag() << ": the standby scheduler at " << sd.host << ":" << sd.port << " took over"
                       << (waited ? "" : " (the scheduler died)") << "; rejoining it");
  }
  // Repeated kTakeover (its kRejoin may be lost): all of this is idempotent there.
  n_.SendControl(kSchedulerId, Control::kRejoin, kRejoinAfterTakeover,
                 n_.members_.replicated() ? payload::EncodeRangeTable(n_.members_.ranges().ToData())
                                          : std::string());
  n_.barriers_.ResendWait();
  for (auto& [range, fb] : n_.copies_reported_)  // the range copies it installed
    n_.SendControl(kSchedulerId, Control::kRangeCopied, range, std::to_string(fb.second), fb.first);
}

void Takeover::RegisterWithStandby(int head, const std::string& body) {
  if (n_.options_.standby_scheduler.empty() || n_.standby_ || registration_moved_) return;
  if (!standby_linked_)
    n_.transport_->Connect(kStandbyId, n_.options_.standby_scheduler, kSchedulerToken);
  standby_linked_ = true;
  n_.SendControl(kStandbyId, Control::kRegister, head, body);
}

void Takeover::AddStandby(const Message& m) {
  std::vector<NodeDesc> ds;
  try {
    ds = DecodeNodes(m.body);
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(n_.limiter_, "standby", "WARN",
                     n_.Tag() << ": dropped a new standby: " << e.what());
    return;
  }
  if (ds.size() != 1 || ds[0].id != kStandbyId ||
      ds[0].role != static_cast<int>(Role::kScheduler)) {
    PSKV_LOG_LIMITED(n_.limiter_, "standby", "WARN",
                     n_.Tag() << ": dropped a new standby that does not describe a standby "
                                 "scheduler");
    return;
  }
  if (n_.standby_ || n_.role() == Role::kScheduler) return;
  if (!n_.members_.SetStandby(ds[0])) return;  // resent
  if (vote_linked_) n_.transport_->Disconnect(kStandbyId);
  vote_linked_ = false;
  if (n_.options_.verbose >= 1)
    PSKV_INFO(n_.Tag() << ": a fresh standby scheduler at " << ds[0].host << ":" << ds[0].port
                       << " follows the scheduler");
}

void Takeover::OnNodeTable(const NodeDesc* d) {
  if (standby_linked_) n_.transport_->Disconnect(kStandbyId);  // registration's link only
  if (!d) return;
  // A standby that took over before the job formed sent it: "the scheduler" is there.
  const std::string at = d->host + ":" + std::to_string(d->port);
  if (!registration_moved_ &&
      at != n_.options_.root_uri + ":" + std::to_string(n_.options_.root_port)) {
    n_.transport_->Disconnect(kSchedulerId);
    n_.transport_->Connect(kSchedulerId, at, d->token);
    registration_moved_ = true;
  }
}

}  // namespace pskv
