// Node, receiving — every message is decoded, checked to belong to this
// job, bound to the node its connection's identity belongs to (never the
// header's sender), checked for entitlement (who may send which control
// message), de-duplicated and ordered (PS_RESEND), credited (SendSchedule) and
// dispatched; and what the scheduler tells every node (the node table, a range
// table, a worker that left or joined) applied to the Membership, with the
// connections, liveness and handlers that follow from it. The receive thread runs
// it; see node.h.
#include <algorithm>

#include "common/logging.h"
#include "ps/node.h"
#include "ps/scheduler.h"
#include "pskv/error.h"

namespace pskv {

using namespace std::chrono_literals;

void Node::ReceiveLoop() {
  LogScope named([this] { return Tag(); });  // lines of this thread carry the node's name
  Received in;
  while (!stop_) {
    bool got;
    liveness_.Listening();  // what arrived while we were handling is not silence
    try {
      got = transport_->Recv(&in, 100ms);
    } catch (const std::exception& e) {
      PSKV_LOG_LIMITED(limiter_, "recv", "ERROR", Tag() << ": " << e.what());
      std::this_thread::sleep_for(10ms);  // a persistent error must not spin a core
      continue;
    }
    if (!got) continue;
    liveness_.Deaf();
    Message m;
    try {
      m = Decode(std::move(in.frames));
    } catch (const std::exception& e) {
      PSKV_LOG_LIMITED(limiter_, in.peer_addr + "/decode", "WARN",
                       Tag() << ": dropped a malformed message from " << in.peer_addr << ": "
                             << std::string(e.what()).substr(0, 200));
      continue;
    }
    if (m.h.job != job_) {
      // Only an authenticated peer gets here; nothing is sent or connected back.
      PSKV_LOG_LIMITED(limiter_, in.peer_addr + "/job", "WARN",
                       Tag() << ": dropped a message from " << in.peer_addr
                             << ": it belongs to another job (PSKV_JOB_ID, DMLC_PS_ROOT_URI:PORT, "
                                "DMLC_NUM_WORKER or DMLC_NUM_SERVER differ)");
      continue;
    }
    if (options_.verbose >= 2) PSKV_INFO(Tag() << " recv " << Describe(m.h));
    try {
      Handle(std::move(m), in.peer);
    } catch (const std::exception& e) {
      PSKV_LOG_LIMITED(limiter_, in.peer_addr + "/handle", "WARN",
                       Tag() << ": error handling a message from " << in.peer_addr << ": "
                             << std::string(e.what()).substr(0, 200));
    }
  }
}

void Node::Handle(Message&& m, uint64_t token) {
  const auto c = static_cast<Control>(m.h.control);
  std::unique_lock<std::mutex> lk(mu_);
  // Who sent it: the node its connection's identity belongs to, never the header.
  int sender = members_.IdOfToken(token);
  const bool sched = IsScheduler();
  auto drop = [&](const char* why) {
    PSKV_LOG_LIMITED(limiter_, std::to_string(token) + why, "WARN",
                     Tag() << ": dropped a " << ControlName(c) << " message (header says node "
                           << m.h.sender << ", connection is "
                           << (sender ? NameLocked(sender) : std::string("not a node of the job"))
                           << "): " << why);
  };
  // A standby that has not taken over ignores the registrations nodes also send it.
  if (standby_ && c == Control::kRegister) return;
  if (const char* why = BindSender(c, token, m.h.sender, &sender)) return drop(why);
  m.h.sender = sender;  // from here on, the bound identity is the sender
  if (members_.Departed(sender)) {
    // A server the job went on without, yet still running (frozen and resumed, or cut
    // off from the scheduler only): nothing it sends counts any more — no data, no
    // barrier arrival, no ack. The scheduler tells it that it was removed.
    if (sched) scheduler_->TellRemoved(sender);
    return drop(IsWorkerId(sender) ? "the worker left the job (PSKV_ELASTIC)"
                                   : "the sender was removed from the job");
  }
  if (const char* why = Unentitled(c, sender, m.h.head)) return drop(why);
  liveness_.Heard(sender);
  if (sender == kSchedulerId) scheduler_seen_ = true;

  if (c == Control::kAck) {
    resender_.Ack(sender, m.h.timestamp);
    return;
  }
  if (c == Control::kRegister && sched) {
    auto ds = DecodeNodes(m.body);
    if (ds.size() != 1 || ds[0].token != token) return drop("registration for another identity");
  }
  // A data message before the node table counts as never received: no ack, so the
  // sender resends it.
  if (c == Control::kData && !ready_) return;
  // A scheduled message is acknowledged on arrival (once), before it is handled.
  const bool scheduled = c == Control::kData && (m.h.flags & kScheduled);
  if (!m.h.seq) {
    if (scheduled) send_.Credit(sender);
    return Dispatch(std::move(m), sender, lk);
  }
  DispatchInOrder(std::move(m), sender, scheduled, lk);
}

const char* Node::BindSender(Control c, uint64_t token, int header_sender, int* sender) {
  if (*sender != 0) {
    // 0: the sender has not learned its id yet (its node table is in flight).
    if (header_sender != *sender && header_sender != 0)
      return "header's sender differs from the connection's identity";
    return nullptr;
  }
  // Before the node table exists only registration traffic can flow: to the
  // scheduler, kRegister (whose body must carry the connection's own token); from
  // it, the table, a refusal or "registration received".
  const bool sched = IsScheduler();
  if (ready_ && !(sched && c == Control::kRegister)) return "unknown sender";
  if (sched) return c != Control::kRegister ? "not registered" : nullptr;
  if (c != Control::kNodeTable && c != Control::kRefuse && c != Control::kHeartbeat &&
      c != Control::kAck)
    return "not registered yet";
  if (scheduler_token_ == 0) scheduler_token_ = token;
  if (token != scheduler_token_) return "not the scheduler";
  *sender = kSchedulerId;
  return nullptr;
}

const char* Node::Unentitled(Control c, int sender, int head) const {
  const bool sched = IsScheduler();
  switch (c) {
    case Control::kNodeTable:
    case Control::kBarrierDone:
    case Control::kNodeFailed:
    case Control::kRefuse:
    case Control::kRangeTable:
    case Control::kWorkerLeft:
    case Control::kWorkerJoined:
      return sender != kSchedulerId ? "only the scheduler sends this" : nullptr;
    case Control::kRejoin:
      if (head == kVoteLost || head == kVoteAlive)  // a node's answer to a standby's question
        return !standby_ || !(IsServerId(sender) || IsWorkerId(sender))
                   ? "only a node answers a standby scheduler's question"
                   : nullptr;
      if (head != kRejoinAfterTakeover) return "unknown kind of rejoin";
      [[fallthrough]];
    case Control::kRegister:
    case Control::kBarrier:
    case Control::kLeave:
      return !sched ? "only the scheduler receives this" : nullptr;
    case Control::kTakeover:  // from the standby the node table names, to a node
      if (head != kTakeoverAsk && head != kTakeoverCommit) return "unknown kind of takeover";
      return sender != kStandbyId || sched || standby_ ? "only the standby scheduler sends this"
                                                       : nullptr;
    case Control::kRangeCopied:
    case Control::kJoinReady:
      return !sched || !IsServerId(sender) ? "only a server tells the scheduler this" : nullptr;
    case Control::kData:
    case Control::kCredit: {
      // Servers replicating their ranges also talk to each other.
      const bool ok = role() == Role::kServer
                          ? IsWorkerId(sender) || (replicated() && IsServerId(sender))
                      : role() == Role::kWorker ? IsServerId(sender)
                                                : false;
      return ok ? nullptr : "data between these roles is not part of the protocol";
    }
    default:
      return nullptr;
  }
}

void Node::DispatchInOrder(Message&& m, int sender, bool scheduled,
                           std::unique_lock<std::mutex>& lk) {
  const uint64_t seq = m.h.seq;
  const auto arrival = resender_.Accept(sender, seq);
  if (arrival == Resender::Arrival::kFull) return;  // resent later
  SendControl(sender, Control::kAck, 0, {}, seq);
  if (arrival == Resender::Arrival::kDuplicate) return;
  if (scheduled) send_.Credit(sender);
  if (arrival == Resender::Arrival::kHold) {
    held_[sender].emplace(seq, std::move(m));
    return;
  }
  Dispatch(std::move(m), sender, lk);
  // The messages held behind it, in order.
  for (;;) {
    if (!lk.owns_lock()) lk.lock();
    const uint64_t next = resender_.TakeNext(sender);
    if (!next) break;
    auto& mine = held_[sender];
    auto it = mine.find(next);
    if (it == mine.end()) break;  // cannot happen: Accept and held_ agree
    Message h = std::move(it->second);
    mine.erase(it);
    Dispatch(std::move(h), sender, lk);
  }
  if (!lk.owns_lock()) lk.lock();
  if (auto it = held_.find(sender); it != held_.end() && it->second.empty()) held_.erase(it);
}

// Over 80 lines on purpose: the protocol's dispatch table, one case per control kind,
// each a few lines or a call to the component that handles it — read in one piece.
void Node::Dispatch(Message&& m, int sender, std::unique_lock<std::mutex>& lk) {
  const auto c = static_cast<Control>(m.h.control);
  switch (c) {
    case Control::kData: {
      lk.unlock();
      // Run the handler right here (no separate handler thread: one hop less per
      // message); messages are still handled one at a time, in order.
      if (data_handler_) {
        // (The receive thread counts as deaf while it is here: Liveness.)
        try {
          data_handler_(std::move(m));
        } catch (const std::exception& e) {
          PSKV_ERROR(Tag() << ": data handler failed: " << e.what());
        }
      }
      return;
    }
    case Control::kRegister:
      if (IsScheduler()) scheduler_->OnRegister(m);
      return;
    case Control::kNodeTable:
      if (!IsScheduler()) HandleNodeTable(m);
      return;
    case Control::kRefuse:
      refused_ = m.body.empty() ? "no reason given" : m.body;
      cv_.notify_all();
      return;
    case Control::kBarrier:
      if (IsScheduler()) scheduler_->OnBarrier(sender, m.h.head, m.h.timestamp);
      return;
    case Control::kBarrierDone: {
      barriers_.OnRelease(m.h.head, m.h.timestamp);
      if (standby_ && m.body == "final") {
        // The scheduler released the final barrier: the job ended; nothing to take over.
        takeover_.JobDone();
        finished_ = true;
        liveness_.Stop();
      }
      cv_.notify_all();
      return;
    }
    case Control::kTakeover:
      takeover_.Answer(m.h.head, lk);
      return;
    case Control::kRejoin:
      if (m.h.head != kRejoinAfterTakeover) {  // a vote (Unentitled: to a standby)
        takeover_.Vote(sender, m.h.head);
        return;
      }
      scheduler_->OnRejoin(m, sender);
      return;
    case Control::kHeartbeat:
      if (IsScheduler() && sender != kSchedulerId && ready_) {
        // The answer's head: the job's link rate (ps/link_rate_share.h). A node silent
        // for 3 intervals no longer counts (it left, or stopped learning).
        const auto expiry =
            std::max<Clock::duration>(3 * options_.heartbeat_interval, std::chrono::seconds(3));
        TellLinkRate(sender, link_rates_.Record(sender, m.h.head, Clock::now(), expiry));
      } else if (ready_ && sender == kSchedulerId) {
        link_rates_.Heard(m.h.head);
      } else if (!ready_ && sender == kSchedulerId && m.h.head == 1 && !join_pending_) {
        // Registration received as a join of the running job (elastic workers).
        join_pending_ = true;
        PSKV_INFO(Tag() << ": the job is running; this worker joins it at the workers' next "
                           "epoch barrier (PSKV_ELASTIC)");
      }
      return;
    case Control::kNodeFailed: {
      std::string reason = m.body;
      if (m.h.head == id_ && replicated() && role() == Role::kServer)
        reason = Tag() + " was removed from the job by the scheduler (" + m.body +
                 "); the job goes on without this server, whose key ranges continue on their "
                 "replicas: this process stops";
      if (m.h.head == id_ && options_.elastic && role() == Role::kWorker)
        reason = Tag() + " was dropped from the job by the scheduler (" + m.body +
                 "); the job goes on without this worker (PSKV_ELASTIC): this process stops";
      const int culprit = members_.Has(m.h.head) ? m.h.head : 0;
      lk.unlock();
      Fail(std::make_exception_ptr(NodeFailure(reason)), culprit);
      return;
    }
    case Control::kAck:  // handled above
      return;
    case Control::kRangeTable:
      if (!IsScheduler()) HandleRangeTable(m, lk);
      return;
    case Control::kRangeCopied:
      scheduler_->OnRangeCopied(m, sender);
      return;
    case Control::kCredit:
      send_.OnCredit(sender, m.h.timestamp);
      return;
    case Control::kWorkerLeft:  // a standby follows them too (its table)
      if (!IsScheduler()) HandleWorkerLeft(m.h.head, lk);
      return;
    case Control::kWorkerJoined:
      if (!IsScheduler()) HandleWorkerJoined(m, lk);
      return;
    case Control::kJoinReady:
      scheduler_->elastic().OnJoinReady(sender);
      return;
    case Control::kLeave:
      if (IsScheduler() && !finished_) {
        std::string who = NameLocked(sender);
        lk.unlock();
        FailNode(sender, who + " exited before the job finished: " + m.body);
      }
      return;
  }
}

// ------------------------------------------------------------------ what the scheduler tells

void Node::HandleNodeTable(const Message& m) {
  if (ready_ && m.h.head == kNodeTableStandby) return takeover_.AddStandby(m);
  if (ready_) return;  // a resent table
  std::vector<NodeDesc> all = DecodeNodes(m.body);
  const NodeDesc* self = nullptr;
  for (auto& d : all)
    if (d.token == token_) self = &d;
  if (!self) throw ProtocolError("node table without this node");
  for (auto& d : all)
    if (d.id == kSchedulerId && d.token != scheduler_token_)
      throw ProtocolError("node table not sent by the scheduler it names");
  id_ = self->id;
  rank_ = self->rank;
  // Elastic workers: a table sent at an epoch barrier's release to a worker that joins
  // the running job (it passes no start barrier: Start awaits that release).
  joined_ = m.h.head == kNodeTableJoined && options_.elastic && role() == Role::kWorker;
  const NodeDesc* sched = nullptr;
  for (auto& d : all)
    if (d.id == kSchedulerId) sched = &d;
  takeover_.OnNodeTable(sched);  // the registration's link to a standby, a moved scheduler
  status_.SetRank(rank_);
  members_.AdoptTable(all);
  for (auto& d : all) {
    if (d.id == kSchedulerId || d.id == kStandbyId || d.id == id_) continue;
    if (standby_) {  // the standby's links for a takeover (ps/takeover.h)
      transport_->Connect(d.id, d.host + ":" + std::to_string(d.port), d.token);
      continue;
    }
    // Replicated servers also send to each other (their ranges' copies).
    const bool talks = role() == Role::kWorker
                           ? IsServerId(d.id)
                           : IsWorkerId(d.id) || (replicated() && IsServerId(d.id));
    if (talks) transport_->Connect(d.id, d.host + ":" + std::to_string(d.port), d.token);
  }
  ready_ = true;
  cv_.notify_all();
}

void Node::HandleRangeTable(const Message& m, std::unique_lock<std::mutex>& lk) {
  if (!replicated()) return;
  RangeTable next;
  try {
    next = RangeTable::FromData(payload::DecodeRangeTable(m.body), options_.num_servers,
                                options_.spare_servers);
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(limiter_, "range table", "WARN", Tag() << ": dropped: " << e.what());
    return;
  }
  std::vector<int> gone;
  if (!members_.ApplyRanges(next, &gone)) return;  // not newer
  for (int id : gone) ForgetPeer(id, Forgotten::kGone);
  if (options_.verbose >= 1) PSKV_INFO(Tag() << ": range table " << members_.ranges().Describe());
  auto handlers = events_.range_table;
  RangeTable table = members_.ranges();
  lk.unlock();
  for (int id : gone) transport_->Disconnect(id);  // what it still sends is dropped (Handle)
  for (auto& h : handlers) h(table);
}

void Node::HandleWorkerLeft(int id, std::unique_lock<std::mutex>& lk) {
  if (!options_.elastic || !IsWorkerId(id) || RankOfId(id) >= options_.num_workers) return;
  if (id == id_) return;                 // this worker: kNodeFailed naming it stops it
  if (!members_.WorkerLeft(id)) return;  // resent
  ForgetPeer(id, Forgotten::kGone);
  auto handlers = events_.worker_left;
  lk.unlock();
  if (role() == Role::kServer) transport_->Disconnect(id);  // what it still sends is dropped
  PSKV_WARN(Tag() << ": " << NodeName(id)
                  << " left the job (PSKV_ELASTIC); the job goes on without it");
  for (auto& h : handlers) h(id);
}

void Node::HandleWorkerJoined(const Message& m, std::unique_lock<std::mutex>& lk) {
  const int id = m.h.head;
  if (!options_.elastic || !IsWorkerId(id) || RankOfId(id) >= options_.num_workers || id == id_)
    return;
  std::vector<NodeDesc> ds;
  try {
    ds = DecodeNodes(m.body);
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(limiter_, "joined", "WARN",
                     Tag() << ": dropped a worker_joined: " << e.what());
    return;
  }
  if (ds.size() != 1 || ds[0].id != id || ds[0].role != static_cast<int>(Role::kWorker)) {
    PSKV_LOG_LIMITED(limiter_, "joined", "WARN",
                     Tag() << ": dropped a worker_joined that does not describe worker " << id);
    return;
  }
  const NodeDesc d = ds[0];
  const bool server = role() == Role::kServer;
  std::vector<WorkerLeftHandler> handlers;
  if (members_.WorkerJoined(d)) {          // else: resent
    ForgetPeer(id, Forgotten::kReplaced);  // the process that left; numbering afresh
    handlers = events_.worker_joined;
    lk.unlock();
    if (server || standby_) {  // a standby links every node, for a takeover
      transport_->Disconnect(id);
      transport_->Connect(id, d.host + ":" + std::to_string(d.port), d.token);
      if (server) liveness_.Watch(id, /*silence=*/false);  // its connection, as for every worker
    }
    PSKV_WARN(Tag() << ": " << NodeName(id)
                    << " joined the job (PSKV_ELASTIC); the rounds from now on expect it");
    for (auto& h : handlers) h(id);
  }
  if (!server) return;
  if (!lk.owns_lock()) lk.lock();
  SendControl(kSchedulerId, Control::kJoinReady, id);  // the scheduler releases the epoch
}

void Node::TellLinkRate(int to, const LinkRateShare::Answer& a) {
  std::vector<int> ids;
  if (to != 0) ids.push_back(to);
  if (a.to_all) {  // a new rate: every learning node changes to it now
    for (int id : link_rates_.Learners())
      if (id != to) ids.push_back(id);
  }
  for (int id : ids) {
    try {
      SendControl(id, Control::kHeartbeat, a.head);
    } catch (const std::exception& e) {  // a peer gone: its failure is handled elsewhere
      PSKV_LOG_LIMITED(
          limiter_, "linkrate", "WARN",
          Tag() << ": the job's link rate not sent to " << NameLocked(id) << ": " << e.what());
    }
  }
}

}  // namespace pskv
