// One link rate for the whole job (PSKV_LINK_RATE=1; kvstore/distributed/link_pacing.h).
//
// Every node that learns its host link's rate paces its connections at a part of it;
// the parts are planned for one rate on every link, so nodes that pace at rates of
// their own (each its own max filter of noisy samples: measured 11.3-13.1 MB/s on links
// of 12.25 MB/s) offer a link flows out of proportion, and the most cautious node's
// connections finish last. So the nodes share their estimates through the heartbeats
// they already send: a node's heartbeat carries its estimate (kB/s in the header's
// head), the scheduler keeps each node's latest and answers every heartbeat with the
// job's rate, the median of those heard within `expiry` (one node's outlier, or a
// hostile value, does not move it beyond the others'), and every node paces at
// that. A new job's rate is sent to every learning node at once, and a node whose
// estimate moved sends it before its next heartbeat is due (Urgent), so that the
// nodes change rate together, within a window of a change. A node starting (its own
// estimate still growing) reports nothing and paces at its own, as does a node before
// the scheduler's first answer.
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
  /// The head of this node's next heartbeat (the timer thread, which sends it).
  int32_t Outgoing() {
    sent_.store(mine_.load());
    return sent_.load();
  }
  /// Whether the estimate moved so far since the last heartbeat that the scheduler
  /// should hear it before the next one is due (the start-up ended, or it moved by
  /// more than kUrgent): the job's rate follows within a window, not an interval.
  bool Urgent() const {
    const int64_t m = mine_.load(), s = sent_.load();
    return m >= kLeast &&
           (s < kLeast || m * kUrgent > s * (kUrgent + 1) || m * (kUrgent + 1) < s * kUrgent);
  }
  /// The head of the scheduler's answer to a heartbeat, or of its announcement of a
  /// new rate (below kLeast: none; a head of 1 from the scheduler means something else
  /// to a node not yet admitted).
  void Heard(int32_t head) {
    if (head >= kLeast) job_.store(head);
  }
  /// The job's rate (bytes/s) the scheduler last answered; 0 before its first answer.
  uint64_t Job() const { return static_cast<uint64_t>(job_.load()) * kUnit; }
  /// The link rate this node's connections are paced for now (bytes/s: the job's, or
  /// its own estimate while starting or before the scheduler's first answer; 0: not
  /// paced yet), as its pacer (kvstore/distributed/link_pacing.h) sets it every window;
  /// a worker sizes its messages by it (worker/wire_shape.h).
  void PacedFor(uint64_t bytes_per_s) { paced_for_.store(bytes_per_s); }
  uint64_t PacedFor() const { return paced_for_.load(); }

  // --- the scheduler (under its node's lock)
  struct Answer {
    int32_t head = 0;     // the job's rate (kB/s); 0: no node's heard within the expiry
    bool to_all = false;  // a new rate: tell every learner (Learners()), not only the sender
  };
  /// The least time between two new rates: a burst of reports (the nodes' start-ups
  /// ending together) makes one change, not one per report.
  static constexpr Clock::duration kSettle = std::chrono::milliseconds(200);
  /// Node `id`'s heartbeat carried `head` at `now`. The job's rate is the median of
  /// the estimates heard within `expiry`; it changes (to_all) where that
  /// moved by more than 1 % and kSettle passed since the last change (else the change
  /// waits: Pending), so that every node paces at the same rate from the same moment
  /// on (nodes pacing at rates they heard at different times offer a link flows out of
  /// proportion, as with rates of their own).
  Answer Record(int id, int32_t head, Clock::time_point now, Clock::duration expiry) {
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
    pending_ = 0;
    if (live.empty()) return {};
    // The median: each node's estimate is a max filter of its samples, so the
    // estimates sit above the link (measured at 100 Mbit/s: samples 11.4-11.6 MB/s,
    // estimates 11.6-12.2, their upper quartile 12.07: caps 9 % above what the link
    // delivered; k=2 23 MiB 1.11 x the bound, with the median 1.09-1.10, stated 1.05).
    const auto mid = live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2);
    std::nth_element(live.begin(), mid, live.end());
    const int64_t q = *mid, j = job_head_;
    if (j == 0 || q * 100 > j * 101 || q * 101 < j * 100) pending_ = *mid;
    return Pending(now);
  }
  /// A change of the job's rate that waited for kSettle, once it passed (the
  /// scheduler's timer asks): to_all with the new rate; else the current one.
  Answer Pending(Clock::time_point now) {
    if (pending_ == 0 || (job_head_ != 0 && now - changed_at_ < kSettle)) return {job_head_, false};
    job_head_ = pending_;
    pending_ = 0;
    changed_at_ = now;
    return {job_head_, true};
  }
  /// The nodes whose estimates count (those a new rate is sent to).
  std::vector<int> Learners() const {
    std::vector<int> ids;
    for (const auto& [id, e] : heard_) ids.push_back(id);
    return ids;
  }

 private:
  /// kUrgent: a change of more than 1/kUrgent of the estimate is sent at once.
  static constexpr int64_t kUrgent = 33;
  static int32_t ToHead(uint64_t bytes_per_s) {
    return static_cast<int32_t>(std::min<uint64_t>(bytes_per_s / kUnit, INT32_MAX));
  }
  struct Entry {
    int32_t head;
    Clock::time_point at;
  };
  std::atomic<int32_t> mine_{0}, sent_{0}, job_{0};
  std::atomic<uint64_t> paced_for_{0};
  std::map<int, Entry> heard_;
  int32_t job_head_ = 0;  // the scheduler's: the rate it last told
  int32_t pending_ = 0;   // ... and the one it will tell once kSettle passed (0: none)
  Clock::time_point changed_at_{};
};

}  // namespace pskv
