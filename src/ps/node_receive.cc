// Node, part 4: receiving — every message is decoded, checked to belong to this
// job, bound to the node its connection's identity belongs to (never the
// header's sender), checked for entitlement (who may send which control
// message), de-duplicated and ordered (PS_RESEND), credited (SendSchedule) and
// dispatched. The receive thread runs it; see node.h.
#include "common/logging.h"
#include "ps/node.h"
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
  int sender = IdOfToken(token);
  const bool sched = role() == Role::kScheduler;
  auto drop = [&](const char* why) {
    PSKV_LOG_LIMITED(limiter_, std::to_string(token) + why, "WARN",
                     Tag() << ": dropped a " << ControlName(c) << " message (header says node "
                           << m.h.sender << ", connection is "
                           << (sender ? NameLocked(sender) : std::string("not a node of the job"))
                           << "): " << why);
  };
  if (sender == 0) {
    // Before the node table exists only registration traffic can flow: to the
    // scheduler, kRegister (whose body must carry the connection's own token); from
    // it, the table, a refusal or "registration received".
    if (ready_ && !(sched && c == Control::kRegister)) return drop("unknown sender");
    if (sched) {
      if (c != Control::kRegister) return drop("not registered");
    } else {
      if (c != Control::kNodeTable && c != Control::kRefuse && c != Control::kHeartbeat &&
          c != Control::kAck)
        return drop("not registered yet");
      if (scheduler_token_ == 0) scheduler_token_ = token;
      if (token != scheduler_token_) return drop("not the scheduler");
      sender = kSchedulerId;
    }
  } else if (m.h.sender != sender && m.h.sender != 0) {
    // 0: the sender has not learned its id yet (its node table is in flight).
    return drop("header's sender differs from the connection's identity");
  }
  m.h.sender = sender;  // from here on, the bound identity is the sender
  if (departed_.count(sender)) {
    // A server the job went on without, yet still running (frozen and resumed, or cut
    // off from the scheduler only): nothing it sends counts any more — no data, no
    // barrier arrival, no ack. The scheduler tells it that it was removed.
    if (sched) TellRemovedLocked(sender);
    return drop("the sender was removed from the job");
  }
  // Control messages only from the node entitled to send them.
  switch (c) {
    case Control::kNodeTable:
    case Control::kBarrierDone:
    case Control::kNodeFailed:
    case Control::kRefuse:
    case Control::kRangeTable:
      if (sender != kSchedulerId) return drop("only the scheduler sends this");
      break;
    case Control::kRegister:
    case Control::kBarrier:
    case Control::kLeave:
      if (!sched) return drop("only the scheduler receives this");
      break;
    case Control::kRangeCopied:
      if (!sched || !IsServerId(sender)) return drop("only a server tells the scheduler this");
      break;
    case Control::kData:
    case Control::kCredit: {
      // Servers replicating their ranges also talk to each other.
      const bool ok = role() == Role::kServer
                          ? IsWorkerId(sender) || (replicated_ && IsServerId(sender))
                      : role() == Role::kWorker ? IsServerId(sender)
                                                : false;
      if (!ok) return drop("data between these roles is not part of the protocol");
      break;
    }
    default:
      break;
  }
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
    if (scheduled) SendCredit(sender);
    return Dispatch(std::move(m), sender, lk);
  }
  const uint64_t seq = m.h.seq;
  const auto arrival = resender_.Accept(sender, seq);
  if (arrival == Resender::Arrival::kFull) return;  // resent later
  SendControl(sender, Control::kAck, 0, {}, seq);
  if (arrival == Resender::Arrival::kDuplicate) return;
  if (scheduled) SendCredit(sender);
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
      if (role() == Role::kScheduler) HandleRegister(m);
      return;
    case Control::kNodeTable:
      if (role() != Role::kScheduler) HandleNodeTable(m);
      return;
    case Control::kRefuse:
      refused_ = m.body.empty() ? "no reason given" : m.body;
      cv_.notify_all();
      return;
    case Control::kBarrier:
      if (role() == Role::kScheduler) HandleBarrier(sender, m.h.head);
      return;
    case Control::kBarrierDone:
      barrier_gen_[m.h.head]++;
      cv_.notify_all();
      return;
    case Control::kHeartbeat:
      if (role() == Role::kScheduler && sender != kSchedulerId && ready_)
        SendControl(sender, Control::kHeartbeat);
      return;
    case Control::kNodeFailed: {
      std::string reason = m.body;
      if (m.h.head == id_ && replicated_)
        reason = Tag() + " was removed from the job by the scheduler (" + m.body +
                 "); the job goes on without this server, whose key ranges continue on their "
                 "replicas: this process stops";
      const int culprit = nodes_.count(m.h.head) ? m.h.head : 0;
      lk.unlock();
      Fail(std::make_exception_ptr(NodeFailure(reason)), culprit);
      return;
    }
    case Control::kAck:  // handled above
      return;
    case Control::kRangeTable:
      if (role() != Role::kScheduler) HandleRangeTable(m, lk);
      return;
    case Control::kRangeCopied:
      HandleRangeCopied(m, sender);
      return;
    case Control::kCredit:
      HandleCredit(sender, m.h.timestamp);
      return;
    case Control::kLeave:
      if (role() == Role::kScheduler && !finished_) {
        std::string who = NameLocked(sender);
        lk.unlock();
        FailNode(sender, who + " exited before the job finished: " + m.body);
      }
      return;
  }
}

}  // namespace pskv
