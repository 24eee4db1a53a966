// The standby scheduler (PSKV_SCHEDULER_STANDBY; docs/fault-tolerance.md, "The
// scheduler"): the scheduler is no single point of failure.
//
// Before a takeover the standby is a node of the job that the scheduler waits for at
// registration (id kStandbyId, in every node's table with its token) and that follows
// it: it connects to every node (sending nothing: a node that dies with the scheduler
// is then known gone at the takeover, by its closed port), receives every range
// table and every barrier release (with the count of
// releases of its group), heartbeats it and watches it like the scheduler watches
// nodes — silence, or its port closed (a killed process: known at once). It never
// decides anything until then.
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
// Before the job formed, there is no table to follow: a node whose scheduler's port
// closed registers with the standby instead, and the standby, finding the scheduler
// gone, collects the registrations itself.
//
// A node that finds the scheduler dead before any kTakeover arrived waits for one,
// for as long as its own detection took (heartbeat timeout + interval), then fails
// naming both. Threads: as the Node's (node.h).
#include <algorithm>

#include "common/logging.h"
#include "ps/node.h"
#include "ps/node_internal.h"
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

void Node::TakeOver(const std::string& why) {
  const auto t0 = Clock::now();
  size_t nodes = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!standby_ || finished_ || failure_ || job_done_ || stop_) return;
    standby_ = false;
    id_ = kSchedulerId;
    rank_ = 0;
    transport_->Disconnect(kSchedulerId);
    resender_.Reset(kSchedulerId);
    held_.erase(kSchedulerId);
    status_.SetRank(0);
    if (!ready_) {
      // Before the job formed: registrations start afresh here (nodes move theirs).
      nodes_.clear();
      id_of_token_.clear();
      scheduler_token_ = 0;
      PSKV_WARN(Tag() << ": " << why << "; the standby scheduler at " << options_.standby_scheduler
                      << " takes over and collects the registrations");
      cv_.notify_all();
      return;
    }
    // The dead scheduler's identity is forgotten: whatever it might still send is
    // dropped. This process is "the scheduler" of the table from now on.
    for (auto it = id_of_token_.begin(); it != id_of_token_.end();)
      it = it->second == kSchedulerId || it->second == kStandbyId ? id_of_token_.erase(it)
                                                                  : std::next(it);
    NodeDesc me = nodes_[kStandbyId];
    me.id = kSchedulerId;
    nodes_.erase(kStandbyId);
    nodes_[kSchedulerId] = me;
    id_of_token_[token_] = kSchedulerId;
    for (auto& [id, d] : nodes_) {
      if (id == kSchedulerId || departed_.count(id)) continue;
      rejoin_pending_.insert(id);
    }
    nodes = rejoin_pending_.size();
    scheduler_->TakeOver(barrier_gen_, t0);
    // The start barrier still open: the dead scheduler's arrival is this one's.
    if (barrier_gen_[kAllGroup] == 0) scheduler_->OnBarrier(kSchedulerId, kAllGroup);
    next_takeover_ = {};
    PSKV_WARN(Tag() << ": " << why << "; the standby at " << options_.standby_scheduler
                    << " takes over as the job's scheduler; telling the " << nodes << " nodes");
  }
  liveness_.Forget(kSchedulerId);
  {
    std::lock_guard<std::mutex> lk(mu_);
    StartWatching();  // every node now, as the scheduler does
  }
  StandbyTick(Clock::now());  // the first kTakeover at once
  cv_.notify_all();
}

void Node::SeekTakeover(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!standby_ || finished_ || failure_ || job_done_ || stop_) return;
    if (seeking_since_ != Clock::time_point{}) return;  // asking already
    seeking_since_ = Clock::now();
    seeking_why_ = why;
    next_takeover_ = {};
    PSKV_WARN(Tag() << ": " << why
                    << "; asking every node whether it lost the scheduler too before taking over");
  }
  liveness_.Forget(kSchedulerId);
  StandbyTick(Clock::now());  // the first question at once
}

bool Node::StandbyFinalize() {
  std::unique_lock<std::mutex> lk(mu_);
  // Until the scheduler's final release (the job ended), a failure, or a takeover.
  // Bounded by failure detection: the standby watches the scheduler.
  cv_.wait(lk, [&] { return job_done_ || failure_ || !standby_ || stop_; });
  if (failure_ || job_done_ || stop_) {
    std::exception_ptr err = failure_;
    finished_ = true;
    lk.unlock();
    liveness_.Stop();
    if (err)
      status_.Failed(ErrorKindName(err), ErrorMessage(err));
    else
      status_.SetPhase(StatusPhase::kFinished);
    StopThreads(200ms);
    stopped_ = true;
    if (err) std::rethrow_exception(err);
    return true;
  }
  // Took over: the final barrier follows the start barrier (which a takeover during
  // start-up completes first).
  cv_.wait(lk, [&] { return barrier_gen_[kAllGroup] >= 1 || failure_ != nullptr; });
  return false;  // Finalize goes on as the scheduler's
}

void Node::StandbyTick(Clock::time_point now) {
  if (options_.standby_scheduler.empty()) return;
  std::string lost_why, gave_up;
  bool take_over = false;
  std::string takeover_why =
      "the scheduler at " + options_.root_uri + ":" + std::to_string(options_.root_port) +
      " is gone before the job formed (its connection closed and a new one was refused)";
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_ || finished_ || failure_) return;
    const bool gone = transport_->GoneSince(kSchedulerId) != Clock::time_point{};
    if (standby_ && !ready_ && gone) {
      take_over = true;  // below, without the lock
    } else if (!IsScheduler() && !standby_ && !ready_ && gone && !registration_moved_) {
      // The scheduler's port closed before the job formed: register with the standby.
      registration_moved_ = true;
      transport_->Disconnect(kSchedulerId);
      transport_->Connect(kSchedulerId, options_.standby_scheduler, kSchedulerToken);
      scheduler_token_ = 0;  // bound to whoever answers there (a scheduler of this job)
      PSKV_WARN(Tag() << ": the scheduler at " << options_.root_uri << ":" << options_.root_port
                      << " is gone; registering with the standby scheduler at "
                      << options_.standby_scheduler);
    } else if (IsScheduler() && !rejoin_pending_.empty() && now >= next_takeover_) {
      next_takeover_ = now + kTakeoverRepeat;
      // A node that left meanwhile (a server removed from the range table, an elastic
      // worker dropped) will not answer.
      for (int id : std::set<int>(rejoin_pending_))
        if (departed_.count(id) || departed_workers_.count(id)) scheduler_->Settled(id);
      for (int id : rejoin_pending_) {
        try {
          transport_->Send(id, Encode(TakeoverMessage(kTakeoverCommit, id, job_)));
        } catch (const std::exception& e) {
          PSKV_LOG_LIMITED(limiter_, "takeover", "WARN",
                           Tag() << ": cannot tell " << NameLocked(id) << ": " << e.what());
        }
      }
    } else if (standby_ && seeking_since_ != Clock::time_point{}) {
      // Split brain: only a scheduler that every node lost is taken over. A node that
      // still reaches it says so; one that does not answer may be cut off from this
      // standby only. A node gone itself (its port closed: died with the scheduler)
      // counts as lost.
      std::vector<int> alive, silent;
      int lost = 0, gone = 0;
      for (auto& [id, d] : nodes_) {
        if (id == kSchedulerId || id == kStandbyId || departed_.count(id) ||
            departed_workers_.count(id))
          continue;
        if (votes_lost_.count(id))
          ++lost;
        else if (transport_->GoneSince(id) != Clock::time_point{})
          ++gone;
        else
          (votes_alive_.count(id) ? alive : silent).push_back(id);
      }
      const std::chrono::milliseconds bound = std::max<std::chrono::milliseconds>(
          options_.heartbeat_timeout + options_.heartbeat_interval, 1s);
      if (alive.empty() && silent.empty()) {
        take_over = true;
        takeover_why = seeking_why_ + "; every node lost it too (" + std::to_string(lost) +
                       " said so, " + std::to_string(gone) + " gone with it)";
        seeking_since_ = {};
      } else if (now - seeking_since_ > bound) {
        std::string who;
        for (int id : alive) who += (who.empty() ? "" : ", ") + NameLocked(id);
        std::string quiet;
        for (int id : silent) quiet += (quiet.empty() ? "" : ", ") + NameLocked(id);
        gave_up = seeking_why_ + "; but " +
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
              transport_->Send(id, Encode(TakeoverMessage(kTakeoverAsk, id, job_)));
            } catch (const std::exception& e) {
              PSKV_LOG_LIMITED(limiter_, "ask", "WARN",
                               Tag() << ": cannot ask " << NameLocked(id) << ": " << e.what());
            }
          }
      }
    } else if (awaiting_takeover_ != Clock::time_point{} &&
               now - awaiting_takeover_ >
                   options_.heartbeat_timeout + options_.heartbeat_interval) {
      lost_why = scheduler_lost_ + "; the standby scheduler at " + options_.standby_scheduler +
                 " did not take over within " +
                 SecsStr(options_.heartbeat_timeout + options_.heartbeat_interval) +
                 " (is it running? its log says why)";
      awaiting_takeover_ = {};
    }
  }
  if (take_over) TakeOver(takeover_why);
  if (!lost_why.empty()) Fail(std::make_exception_ptr(NodeFailure(lost_why)), kSchedulerId);
  if (!gave_up.empty()) Fail(std::make_exception_ptr(NodeFailure(gave_up)));
}

// ------------------------------------------------------------------ the nodes

bool Node::AwaitTakeover(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!nodes_.count(kStandbyId) || failure_ || finished_) return false;  // none (left)
    if (awaiting_takeover_ != Clock::time_point{}) return true;
    awaiting_takeover_ = Clock::now();
    scheduler_lost_ = why;
  }
  liveness_.Forget(kSchedulerId);  // watched again once the standby took over
  PSKV_WARN(Tag() << ": " << why << "; waiting for the standby scheduler at "
                  << options_.standby_scheduler << " to take over");
  return true;
}

bool Node::SchedulerLostHere() const {
  return awaiting_takeover_ != Clock::time_point{} ||
         transport_->GoneSince(kSchedulerId) != Clock::time_point{};
}

void Node::AnswerTakeover(int head, std::unique_lock<std::mutex>& lk) {
  const bool lost = SchedulerLostHere();
  if (head == kTakeoverCommit && lost) return FollowStandby(lk);
  // A question; or a commit while this node still reaches its scheduler, refused:
  // following it would make two schedulers of one job (docs/security.md).
  if (!nodes_.count(kStandbyId)) return;
  if (head == kTakeoverCommit)
    PSKV_LOG_LIMITED(limiter_, "takeover-refused", "WARN",
                     Tag() << ": refused the standby scheduler's takeover: the scheduler still "
                              "answers here");
  const NodeDesc& sd = nodes_[kStandbyId];
  if (!vote_linked_) {  // answered on a connection of its own (the standby is no peer)
    transport_->Connect(kStandbyId, sd.host + ":" + std::to_string(sd.port), sd.token);
    vote_linked_ = true;
  }
  SendControl(kStandbyId, Control::kRejoin, lost ? kVoteLost : kVoteAlive);
}

void Node::FollowStandby(std::unique_lock<std::mutex>& lk) {
  if (nodes_.count(kStandbyId)) {
    if (vote_linked_) transport_->Disconnect(kStandbyId);
    vote_linked_ = false;  // a fresh standby's question needs a link of its own
    NodeDesc sd = nodes_[kStandbyId];
    for (auto it = id_of_token_.begin(); it != id_of_token_.end();)
      it = it->second == kSchedulerId || it->second == kStandbyId ? id_of_token_.erase(it)
                                                                  : std::next(it);
    sd.id = kSchedulerId;
    nodes_.erase(kStandbyId);
    nodes_[kSchedulerId] = sd;
    id_of_token_[sd.token] = kSchedulerId;
    scheduler_token_ = sd.token;
    transport_->Disconnect(kSchedulerId);
    transport_->Connect(kSchedulerId, sd.host + ":" + std::to_string(sd.port), sd.token);
    resender_.Reset(kSchedulerId);
    held_.erase(kSchedulerId);
    const bool waited = awaiting_takeover_ != Clock::time_point{};
    awaiting_takeover_ = {};
    liveness_.Watch(kSchedulerId);
    PSKV_WARN(Tag() << ": the standby scheduler at " << sd.host << ":" << sd.port << " took over"
                    << (waited ? "" : " (the scheduler died)") << "; rejoining it");
  }
  // Repeated kTakeover (its kRejoin may be lost): all of this is idempotent there.
  SendControl(kSchedulerId, Control::kRejoin, kRejoinAfterTakeover,
              replicated_ ? payload::EncodeRangeTable(ranges_.ToData()) : std::string());
  if (waiting_group_)
    SendControl(kSchedulerId, Control::kBarrier, waiting_group_, {}, barrier_gen_[waiting_group_]);
  for (auto& [range, fb] : copies_reported_)
    SendControl(kSchedulerId, Control::kRangeCopied, range, std::to_string(fb.second), fb.first);
  (void)lk;
}

void Node::AddStandby(const Message& m) {
  std::vector<NodeDesc> ds;
  try {
    ds = DecodeNodes(m.body);
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(limiter_, "standby", "WARN", Tag() << ": dropped a new standby: " << e.what());
    return;
  }
  if (ds.size() != 1 || ds[0].id != kStandbyId ||
      ds[0].role != static_cast<int>(Role::kScheduler)) {
    PSKV_LOG_LIMITED(limiter_, "standby", "WARN",
                     Tag() << ": dropped a new standby that does not describe a standby scheduler");
    return;
  }
  if (standby_ || role() == Role::kScheduler) return;
  const NodeDesc& d = ds[0];
  if (auto it = nodes_.find(kStandbyId); it != nodes_.end()) {
    if (it->second.token == d.token) return;  // resent
    id_of_token_.erase(it->second.token);
  }
  if (vote_linked_) transport_->Disconnect(kStandbyId);
  vote_linked_ = false;
  nodes_[kStandbyId] = d;
  id_of_token_[d.token] = kStandbyId;
  if (options_.verbose >= 1)
    PSKV_INFO(Tag() << ": a fresh standby scheduler at " << d.host << ":" << d.port
                    << " follows the scheduler");
}

// ------------------------------------------------------------------ the scheduler's part

void Scheduler::AdmitStandby(const NodeDesc& asked, const Message& m) {
  Node& n = *node_;
  const Options& o = n.options_;
  const RegisterHead head = RegisterHead::Decode(m.h.head);
  const std::string at = asked.host + ":" + std::to_string(asked.port);
  // Not amid a takeover: a node that has not followed it yet would drop the news (from
  // whom it still takes for the standby). The standby repeats its registration.
  if (!n.rejoin_pending_.empty()) return;
  // Nor before the scheduler forgot a standby that died (its port closed): the fresh
  // one that replaces it repeats its registration until then.
  if (n.nodes_.count(kStandbyId) &&
      n.transport_->GoneSince(kStandbyId) != Node::Clock::time_point{})
    return;
  std::string why;
  if (o.standby_scheduler.empty())
    why = "this job has no standby scheduler (its nodes set no PSKV_SCHEDULER_STANDBY)";
  else if (n.nodes_.count(kStandbyId))
    why = "the job already has its standby scheduler (PSKV_SCHEDULER_STANDBY)";
  else if (n.failure_ || n.finished_ || n.job_done_)
    why = "the job is ending";
  else if (head.replicas != o.replicas || head.spares != o.spare_servers ||
           head.elastic != o.elastic)
    why = "its PSKV_REPLICAS, PSKV_SPARE_SERVERS or PSKV_ELASTIC differ from the job's";
  if (!why.empty()) {
    PSKV_WARN(n.Tag() << ": refused the standby scheduler at " << at << ": " << why);
    return Refuse(asked, why);
  }
  NodeDesc d = asked;
  d.id = kStandbyId;
  d.rank = 0;
  n.nodes_[kStandbyId] = d;
  n.id_of_token_[d.token] = kStandbyId;
  n.resender_.Forget(kStandbyId);
  n.transport_->Disconnect(kStandbyId);
  n.transport_->Connect(kStandbyId, at, d.token);
  // What a standby following from the start would have: the node table, the range
  // table, the workers that left and how many releases of each group there were (a
  // takeover tells a missed release from a new barrier by them). Barrier arrivals in
  // progress are not copied: after a takeover every node resends its own.
  std::vector<NodeDesc> all;
  for (auto& [i, x] : n.nodes_) all.push_back(x);
  n.SendControl(kStandbyId, Control::kNodeTable, kNodeTableStart, EncodeNodes(all));
  if (n.replicated_)
    n.SendControl(kStandbyId, Control::kRangeTable, 0,
                  payload::EncodeRangeTable(n.ranges_.ToData()));
  for (int gone : n.departed_workers_)
    n.SendControl(kStandbyId, Control::kWorkerLeft, gone, state_.removal_reason[gone]);
  for (auto& [group, count] : state_.released)
    if (count > 0) n.SendControl(kStandbyId, Control::kBarrierDone, group, {}, count);
  // Every node's table names it from now on: it may ask and commit a takeover.
  const std::string body = EncodeNodes({d});
  for (auto& [id, x] : n.nodes_) {
    if (id == kSchedulerId || id == kStandbyId || n.departed_.count(id) ||
        n.departed_workers_.count(id))
      continue;
    try {
      n.SendControl(id, Control::kNodeTable, kNodeTableStandby, body);
    } catch (const std::exception& e) {
      PSKV_WARN(n.Tag() << ": could not tell " << n.NameLocked(id)
                        << " of the new standby: " << e.what());
    }
  }
  n.liveness_.Watch(kStandbyId);
  PSKV_WARN(n.Tag() << ": the standby scheduler at " << at
                    << " registered: it follows this scheduler as its standby (every node "
                       "was told)");
}

void Scheduler::TakeOver(const std::map<int, uint64_t>& released, Clock::time_point at) {
  state_.took_over = true;
  state_.takeover_at = at;
  for (auto& [group, n] : released) state_.released[group] = std::max(state_.released[group], n);
}

void Scheduler::OnRejoin(const Message& m, int sender) {
  Node& n = *node_;
  if (!state_.took_over || !n.rejoin_pending_.count(sender)) return;  // repeated
  if (n.replicated_ && !m.body.empty()) {
    RangeTable next;
    try {
      next = RangeTable::FromData(payload::DecodeRangeTable(m.body), n.options_.num_servers,
                                  n.options_.spare_servers);
    } catch (const std::exception& e) {
      PSKV_LOG_LIMITED(n.limiter_, "rejoin", "WARN",
                       n.Tag() << ": dropped the range table of " << n.NameLocked(sender)
                               << "'s rejoin: " << e.what());
      next = RangeTable();
    }
    // What the dead scheduler can have published past this standby's table: the last
    // table or two, never a server back that left (a node's claim is checked, not
    // trusted: it could only be a table this job's scheduler made).
    const char* refused = nullptr;
    if (next.num_ranges() > 0 && next.version() > n.ranges_.version() + 2)
      refused = "it is more than two versions ahead of the last one the scheduler sent here";
    for (int id : n.AllServerIds())
      if (!refused && next.num_ranges() > 0 && n.ranges_.Gone(id) && !next.Gone(id))
        refused = "it lists a server that left the job";
    if (refused) {
      PSKV_LOG_LIMITED(n.limiter_, "rejoin", "WARN",
                       n.Tag() << ": ignored the range table of " << n.NameLocked(sender)
                               << "'s rejoin: " << refused);
      next = RangeTable();
    }
    if (next.num_ranges() > 0 && n.ranges_.Apply(next)) {
      // The dead scheduler published it to some nodes only: everyone gets it now.
      for (int id : n.AllServerIds()) {
        if (!n.ranges_.Gone(id) || !n.departed_.insert(id).second) continue;
        n.held_.erase(id);
        n.schedule_.Forget(id);
        n.liveness_.Forget(id);
        n.resender_.Forget(id);
        state_.barriers.Depart(id);
        Settled(id);
      }
      PSKV_WARN(n.Tag() << ": adopted the newer range table " << n.NameLocked(sender)
                        << " had: " << n.ranges_.Describe());
      PublishRanges();
      ReleaseCompletedBarriers();
    }
  }
  Settled(sender);
}

void Scheduler::Settled(int id) {
  Node& n = *node_;
  if (!state_.took_over || !n.rejoin_pending_.erase(id)) return;
  if (n.departed_.count(id) || n.departed_workers_.count(id)) ++state_.left_since_takeover;
  if (!n.rejoin_pending_.empty()) return;
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - state_.takeover_at);
  const int left = state_.left_since_takeover;
  // The tests measure the takeover by this line: every case must write it.
  PSKV_WARN(n.Tag() << ": every node rejoined, " << ms.count() << " ms after the takeover"
                    << (left ? " (" + std::to_string(left) + " left the job instead)" : ""));
}

}  // namespace pskv
