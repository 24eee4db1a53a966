// SendPath: a node's sending side and send scheduling (send_path.h).
#include "ps/send_path.h"

#include "common/logging.h"
#include "ps/node.h"
#include "pskv/error.h"

namespace pskv {

bool SendPath::Resendable(Control c) const {
  return n_.options_.resend &&
         (c == Control::kData || c == Control::kBarrier || c == Control::kBarrierDone ||
          c == Control::kNodeFailed || c == Control::kCredit || c == Control::kRangeTable ||
          c == Control::kRangeCopied || c == Control::kWorkerLeft || c == Control::kWorkerJoined ||
          c == Control::kJoinReady);
}

void SendPath::SendFrames(int to, Message& m) {
  m.h.sender = n_.id_;
  m.h.recver = to;
  m.h.job = n_.job_;
  const auto c = static_cast<Control>(m.h.control);
  if (Resendable(c) && to < 1000000) m.h.seq = n_.resender_.NextSeq(to);
  std::vector<Frame> frames = Encode(m);
  if (n_.options_.verbose >= 2) PSKV_INFO(n_.Tag() << " send " << Describe(m.h));
  if (m.h.seq) n_.resender_.Track(to, m.h.seq, frames);
  n_.transport_->Send(to, std::move(frames));
}

void SendPath::SendControl(int to, Control c, int head, std::string body, uint64_t ts) {
  Message m;
  m.h.control = static_cast<uint8_t>(c);
  m.h.head = head;
  m.h.timestamp = ts;
  m.body = std::move(body);
  SendFrames(to, m);
}

void SendPath::Data(int to, Message m) {
  std::lock_guard<std::mutex> lk(n_.mu_);
  if (n_.failure_) std::rethrow_exception(n_.failure_);
  if (!n_.ready_) throw UsageError("Node::Send before the node is registered");
  m.h.control = static_cast<uint8_t>(Control::kData);
  m.h.flags &= static_cast<uint8_t>(~kScheduled);
  if (!schedule_.Schedules(m.h.vals_len) || to >= 1000000) return SendFrames(to, m);
  m.h.flags |= kScheduled;
  if (!schedule_.Enqueue(to, m)) {
    // Bounded: an overfull queue degrades to sending at once (never blocks, never fails).
    PSKV_LOG_LIMITED(n_.limiter_, "sendqueue", "WARN",
                     n_.Tag() << ": more than " << SendSchedule::kMaxQueued
                              << " big messages wait for " << n_.NameLocked(to)
                              << "; sending without priority order");
    const uint64_t bytes = m.h.vals_len;
    SendFrames(to, m);
    schedule_.Sent(to, bytes);
    return;
  }
  schedule_.Pump(to, [&](Message& q) { SendFrames(to, q); });
}

void SendPath::OnCredit(int sender, uint64_t count) {
  if (!schedule_.Credit(sender, count)) {
    PSKV_LOG_LIMITED(n_.limiter_, std::to_string(sender) + "/credit", "WARN",
                     n_.Tag() << ": dropped a credit from " << n_.NameLocked(sender) << " for "
                              << count << " messages: fewer were sent to it");
    return;
  }
  try {
    schedule_.Pump(sender, [&](Message& q) { SendFrames(sender, q); });
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(n_.limiter_, "pump", "WARN",
                     n_.Tag() << ": cannot send to " << n_.NameLocked(sender) << ": " << e.what());
  }
}

void SendPath::Credit(int sender) {
  SendControl(sender, Control::kCredit, 0, {}, schedule_.Received(sender));
}

}  // namespace pskv
