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
#include <vector>

namespace pskv {

class PushPacer {
 public:
  /// `ahead` > 0: unanswered bytes per server (at least one message always goes).
  explicit PushPacer(uint64_t ahead) : ahead_(ahead) {}

  /// Message `index` (the request's order, ascending) of `bytes` for `server`:
  /// true if it goes now, false if it waits for answers (Answered releases it).
  bool Add(size_t index, int server, uint64_t bytes);

  /// Message `index` was answered: the waiting messages that go now, in order.
  std::vector<size_t> Answered(size_t index);

  /// Messages waiting for answers, over all servers.
  size_t Held() const;

 private:
  struct Lane {
    uint64_t in_flight = 0;                         // bytes sent, not answered
    std::deque<std::pair<size_t, uint64_t>> queue;  // (index, bytes) waiting, in order
  };
  bool Fits(const Lane& lane, uint64_t bytes) const {
    return lane.in_flight == 0 || lane.in_flight + bytes <= ahead_;
  }

  const uint64_t ahead_;
  std::map<int, Lane> lanes_;
  std::map<size_t, std::pair<int, uint64_t>> sent_;  // index -> (server, bytes)
};

}  // namespace pskv
