// One link rate for the whole job (PSKV_LINK_RATE=1; kvstore/distributed/link_pacing.h).
//
// Every node that learns its host link's rate paces its connections at a part of it;
// the parts are planned for one rate on every link, so nodes that pace at rates of
// their own (each its own max filter of noisy samples: measured 11.3-13.1 MB/s on links
// of 12.25 MB/s) offer a link flows out of proportion, and the most cautious node's
// connections finish last. So the nodes share their estimates through the heartbeats
// they already send: a node's heartbeat carries its estimate (kB/s in the header's
// head), the scheduler keeps each node's latest and answers every heartbeat with the
// upper quartile of those heard within `expiry` (one node's outlier, or a hostile
// value, does not move it beyond the others'), and every node paces at that. A node
// starting (its own estimate still growing) reports nothing and paces at its own, as
// does a node before the scheduler's first answer.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

namespace pskv {

class LinkRateShare {
 public:
  using Clock = std::chrono::steady_clock;
  /// The heartbeat head's unit (bytes/s per unit): up to 2^31 kB/s, 2 TB/s.
  static constexpr uint64_t kUnit = 1000;
  /// The least rate shared (heads, kB/s): the estimator's floor (1 Mbit/s).
  static constexpr int32_t kLeast = 125;

  // --- a node (any thread)
  /// This node's own estimate (bytes/s; 0: none yet), sent with its next heartbeat.
  void Report(uint64_t bytes_per_s) { mine_.store(ToHead(bytes_per_s)); }
  /// The head of this node's next heartbeat.
  int32_t Outgoing() const { return mine_.load(); }
  /// The head of the scheduler's answer to a heartbeat (below kLeast: none; a head of
  /// 1 from the scheduler means something else to a node not yet admitted).
  void Heard(int32_t head) {
    if (head >= kLeast) job_.store(head);
  }
  /// The job's rate (bytes/s) the scheduler last answered; 0 before its first answer.
  uint64_t Job() const { return static_cast<uint64_t>(job_.load()) * kUnit; }

  // --- the scheduler (under its node's lock)
  /// Node `id`'s heartbeat carried `head` at `now`: returns the head of the answer,
  /// the upper quartile of the estimates heard within `expiry` (0: none).
  int32_t Record(int id, int32_t head, Clock::time_point now, Clock::duration expiry) {
    if (head >= kLeast) heard_[id] = {head, now};
    std::vector<int32_t> live;
    for (auto it = heard_.begin(); it != heard_.end();) {
      if (now - it->second.at > expiry) {
        it = heard_.erase(it);  // a node that left, or stopped learning
      } else {
        live.push_back(it->second.head);
        ++it;
      }
    }
    if (live.empty()) return 0;
    // The upper quartile: each node's estimate is a max filter of samples that are
    // mostly below the link's rate (windows partly idle, flows held by other hosts).
    const auto mid = live.begin() + static_cast<std::ptrdiff_t>(live.size() * 3 / 4);
    std::nth_element(live.begin(), mid, live.end());
    return *mid;
  }

 private:
  static int32_t ToHead(uint64_t bytes_per_s) {
    return static_cast<int32_t>(std::min<uint64_t>(bytes_per_s / kUnit, INT32_MAX));
  }
  struct Entry {
    int32_t head;
    Clock::time_point at;
  };
  std::atomic<int32_t> mine_{0}, job_{0};
  std::map<int, Entry> heard_;
};

}  // namespace pskv
