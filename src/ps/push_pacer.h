// PushPacer: which messages of one push request go to the wire now, and which wait
// for the answers to earlier ones (PSKV_WIRE_AHEAD_BYTES).
//
// A sync server answers a piece of a key (a wire chunk, docs/design.md "Priorities
// on the wire") only when every worker's copy of it arrived. Handed to the
// transport all at once, a worker's pieces to the S servers share its uplink as
// TCP decides: one flow can lag the others by megabytes, and the server it feeds
// completes no round (its uplink idles) while the others race ahead, then finishes
// the step alone. Paced, a request keeps at most `ahead` bytes of its messages to
// each server sent and unanswered (at least one message), in the request's order:
// a worker runs at most that far ahead of the slowest worker on each server, the
// lagging flows get the capacity the others leave, and the answers to piece i
// flow while pieces i+1.. are still pushed.
//
// A request whose pieces are split unevenly over the servers (link-balanced shares,
// docs/design.md "Key placement") paces each server's pieces in proportion to its
// part: the server with the most bytes gets `ahead`, one with a third of that a third
// of it. Within a worker's uplink the flows then move at rates that follow the
// shares, so the flows to the big shares do not finish last (docs/performance.md,
// "Across hosts"). An even split paces every server alike.
//
// The messages that go at once leave in SendOrder: interleaved over the servers by
// how far into its server's part each one lies, not server by server. A worker's
// uplink queue is one FIFO for all its connections: server by server, the last
// server's first piece would wait behind every other server's first `ahead` bytes,
// and no round on that server could complete (and answer) before they went.
//
// Deadlock-free only for a request whose messages to a server are pieces of ONE
// key in ascending order, the same pieces every worker pushes (piece i's round
// needs every worker's piece i, which each sends once its pieces < i - ahead are
// answered): the dist store paces a single key's request, never a fused one (a
// worker may push keys in any order and grouping).
//
// Not thread-safe: KVWorker uses it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

namespace pskv {

class PushPacer {
 public:
  /// `ahead` > 0: unanswered bytes per server (at least one message always goes).
  explicit PushPacer(uint64_t ahead) : ahead_(ahead) {}

  /// `ahead` > 0 for the server with the most bytes in `plan` (each message's server
  /// and bytes, the request's order), in proportion for the others (at least one
  /// message always goes).
  PushPacer(uint64_t ahead, const std::vector<std::pair<int, uint64_t>>& plan);

  /// The order in which to send the messages that Add lets go at once (indices of
  /// the plan): by the middle of each message's bytes as a fraction of its server's
  /// part, ties in the request's order (empty without a plan: the request's order).
  const std::vector<size_t>& SendOrder() const { return order_; }

  /// Message `index` (the request's order, ascending) of `bytes` for `server`:
  /// true if it goes now, false if it waits for answers (Answered releases it).
  bool Add(size_t index, int server, uint64_t bytes);

  /// Message `index` was answered: the waiting messages that go now, in order.
  std::vector<size_t> Answered(size_t index);

  /// Messages waiting for answers, over all servers.
  size_t Held() const;

 private:
  struct Lane {
    uint64_t ahead = 0;                             // 0: the pacer's ahead_
    uint64_t in_flight = 0;                         // bytes sent, not answered
    std::deque<std::pair<size_t, uint64_t>> queue;  // (index, bytes) waiting, in order
  };
  bool Fits(const Lane& lane, uint64_t bytes) const {
    return lane.in_flight == 0 || lane.in_flight + bytes <= (lane.ahead ? lane.ahead : ahead_);
  }

  const uint64_t ahead_;
  std::vector<size_t> order_;
  std::map<int, Lane> lanes_;
  std::map<size_t, std::pair<int, uint64_t>> sent_;  // index -> (server, bytes)
};

}  // namespace pskv
