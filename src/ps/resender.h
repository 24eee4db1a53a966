// Resender: retransmission and de-duplication of messages (PS_RESEND=1), kept
// apart from the rest of the node (ps-lite's Resender, with its faults fixed).
//
//  * Every resendable message to a peer gets the next sequence number; its frames
//    are kept (by reference, no copy) until the peer acknowledges it.
//  * The first retransmission is due `base` after the message could have left:
//    the transfer time of the bytes queued to that peer before it (at an assumed
//    floor bandwidth) counts as sending time, so a big message queued behind
//    others is not resent spuriously. Later retransmissions back off
//    exponentially up to `max_backoff`.
//  * It never gives up by counting: whether a peer is gone is the failure
//    detector's decision (heartbeats, connection state); Forget(peer) then drops
//    what was kept for it. So a partition shorter than the heartbeat timeout is
//    survived however long the backoff.
//  * Received sequence numbers are remembered per sender as "all <= low" plus the
//    set above it. Messages are delivered in sequence order: one that arrives
//    after a gap (its predecessor was lost and will be resent) is held by the
//    caller until the gap is filled, so a resend never reorders a push and the
//    pull behind it. At most kMaxHeld are held per sender; beyond that a message
//    is not acknowledged, and so is resent later.
// Thread-safe (own mutex; never calls out while holding it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "transport/transport.h"

namespace pskv {

class Resender {
 public:
  using Clock = std::chrono::steady_clock;
  Resender(std::chrono::milliseconds base, std::chrono::milliseconds max_backoff);

  /// The sequence number for the next message to `to`.
  uint64_t NextSeq(int to);
  /// Keeps `frames` of message (to, seq) until acknowledged.
  void Track(int to, uint64_t seq, const std::vector<Frame>& frames);
  /// `from` acknowledged `seq`.
  void Ack(int from, uint64_t seq);
  enum class Arrival {
    kNext,       ///< the next in order: deliver it (then the held ones TakeNext gives)
    kHold,       ///< after a gap: hold it until its predecessors arrive
    kDuplicate,  ///< received before (a resend whose ack was lost): drop it
    kFull,       ///< too many held: drop it unacknowledged (it will be resent)
  };
  static constexpr size_t kMaxHeld = 4096;
  /// Classifies message (from, seq) and records it as received (unless kFull).
  Arrival Accept(int from, uint64_t seq);
  /// If the message after the last delivered one from `from` is held, marks it
  /// delivered and returns its seq; else 0.
  uint64_t TakeNext(int from);
  /// Messages due for retransmission at `now` (their next deadline is moved on).
  std::vector<std::pair<int, std::vector<Frame>>> Due(Clock::time_point now);
  /// Drops everything kept for `peer` (it was declared dead), keeping the sequence
  /// numbers: they are still those of that process, should it still run.
  void Forget(int peer);
  /// Forget, and the sequence numbers too: `peer` is another process from now on (a
  /// standby scheduler that took over, a fresh standby, a worker joining in place of one
  /// that left), whose numbering starts afresh both ways.
  void Reset(int peer);
  /// Waits until every tracked message is acknowledged; false on timeout.
  bool WaitAllAcked(std::chrono::milliseconds timeout);
  size_t Pending() const;

 private:
  struct Unacked {
    std::vector<Frame> frames;
    size_t bytes = 0;
    Clock::time_point due;
    int retries = 0;
  };
  struct Seen {
    uint64_t low = 0;          // every seq <= low was delivered
    std::set<uint64_t> above;  // held (received after a gap)
  };
  std::chrono::milliseconds base_, max_backoff_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, uint64_t> next_seq_;
  std::map<std::pair<int, uint64_t>, Unacked> unacked_;
  std::map<int, size_t> queued_bytes_;  // unacknowledged bytes per peer
  std::map<int, Seen> seen_;
};

}  // namespace pskv
