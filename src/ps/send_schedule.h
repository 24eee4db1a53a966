// SendSchedule: the send window and priority queues of a node's big data messages.
//
// With PSKV_WIRE_WINDOW_BYTES > 0 (P3 / ByteScheduler style), a data message of at
// least kMinBytes value bytes is "scheduled": per destination, at most the
// window's bytes of scheduled messages are in the transport unacknowledged (at
// least one); the others wait in a queue ordered by header priority (higher
// first, then in the order queued). Smaller messages go at once, so a small urgent
// request overtakes a big transfer, and a big urgent one waits for at most a window.
//
// The receiver acknowledges scheduled messages as soon as they arrive, before any
// handler runs (a cumulative count per sender: Received), never when they are
// answered: a sync server answers a push only when every worker pushed, so
// reply-released credit could deadlock two workers whose windows hold pushes the
// other's round needs. A credit for more messages than were sent is refused; a
// stale or repeated one changes nothing. Queues are bounded (kMaxQueued; beyond it
// the caller sends at once, outside the priority order).
//
// Not thread-safe: the node calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>

#include "protocol/message.h"

namespace pskv {

class SendSchedule {
 public:
  /// Data messages with at least this many value bytes are scheduled.
  static constexpr uint64_t kMinBytes = uint64_t{64} << 10;
  /// Scheduled messages queued per destination, at most.
  static constexpr size_t kMaxQueued = size_t{1} << 16;

  /// `window_bytes` <= 0: nothing is scheduled.
  explicit SendSchedule(int64_t window_bytes) : window_(window_bytes) {}

  /// Whether a data message with `vals_len` value bytes is scheduled.
  bool Schedules(uint64_t vals_len) const { return window_ > 0 && vals_len >= kMinBytes; }

  /// Queues `m` for `to` (moved from) and returns true; false when the queue is
  /// full (`m` untouched): the caller sends it at once and calls Sent.
  bool Enqueue(int to, Message& m);

  /// Sends, through `send(Message&)`, the queued messages for `to` while the window
  /// has room, in priority order. A message is counted in the window only once
  /// `send` returned: a send that throws takes the message with it and holds no
  /// window credit; the exception propagates.
  template <class SendFn>
  void Pump(int to, SendFn&& send) {
    auto l = lanes_.find(to);
    if (l == lanes_.end()) return;
    Lane& lane = l->second;
    while (!lane.queue.empty()) {
      auto it = lane.queue.begin();
      const uint64_t bytes = it->second.h.vals_len;
      if (lane.in_flight > 0 && lane.in_flight + bytes > static_cast<uint64_t>(window_)) return;
      Message m = std::move(it->second);
      lane.queue.erase(it);
      send(m);
      Count(lane, bytes);
    }
  }

  /// A scheduled message of `vals_len` bytes went to `to` outside the queue.
  void Sent(int to, uint64_t vals_len) { Count(lanes_[to], vals_len); }

  /// A credit from `from` saying it received `count` scheduled messages in all.
  /// False (and nothing changes) if fewer were sent to it.
  bool Credit(int from, uint64_t count);

  /// Receiver side: one more scheduled message arrived from `from`; returns the
  /// cumulative count to acknowledge.
  uint64_t Received(int from) { return ++received_[from]; }

  /// Value bytes in flight to `to` (sent, not yet credited).
  uint64_t InFlight(int to) const;
  /// Messages waiting in `to`'s queue.
  size_t Queued(int to) const;

  /// Forgets a peer (it is gone): its queue, window and received count.
  void Forget(int peer) {
    lanes_.erase(peer);
    received_.erase(peer);
  }
  /// Drops every queue (the job failed: the queued requests fail with it).
  void DropQueues() { lanes_.clear(); }

 private:
  struct Lane {
    uint64_t in_flight = 0;        // value bytes of scheduled messages not yet credited
    std::deque<uint64_t> unacked;  // their sizes, oldest first
    uint64_t sent = 0;             // scheduled messages sent to the peer so far
    uint64_t credited = 0;         // of which the peer acknowledged receiving
    std::map<std::pair<int64_t, uint64_t>, Message> queue;  // by (-priority, order)
  };
  static void Count(Lane& lane, uint64_t bytes) {
    lane.in_flight += bytes;
    lane.unacked.push_back(bytes);
    ++lane.sent;
  }

  const int64_t window_;
  std::map<int, Lane> lanes_;
  std::map<int, uint64_t> received_;  // per sender: what Received reports
  uint64_t order_ = 0;
};

}  // namespace pskv
