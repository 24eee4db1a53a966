// Waiting with a timeout and stall reports, written once.
//
// Every blocking wait in pskv (a worker's request, a barrier, a store's Wait, the
// start-up wait for the node table) and every inspector that watches open work (the
// scheduler's barriers, a server's sync rounds) follows one policy:
//
//   - a deadline bounds the wait (none when the timeout is 0);
//   - the first stall report comes after PSKV_STALL_WARNING (Options::stall_warning),
//     the next ones each time the time waited has doubled (1x, 2x, 4x, ...), so a long
//     wait says what it waits for without flooding the log; 0 disables reports;
//   - a report names at most kReportItems items (nodes, requests, rounds) and counts
//     the rest: it is a report, not a dump.
//
// StallSchedule is the schedule alone (pure: the caller passes the time), for
// inspectors that keep one per watched item. WaitReporting is the wait loop built on
// it. ReportList caps the items of one report. None of them lock or log by themselves.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pskv {

/// The most items one stall report names; the others are only counted.
inline constexpr size_t kReportItems = 16;

/// When a wait that began at `start` reports its stall: first after `first`, then each
/// time the time waited has doubled. `first` <= 0 disables reports (never due).
class StallSchedule {
 public:
  using Clock = std::chrono::steady_clock;

  StallSchedule() = default;
  StallSchedule(Clock::time_point start, std::chrono::milliseconds first)
      : start_(start), next_(first.count() > 0 ? start + first : Clock::time_point::max()) {}

  Clock::time_point start() const { return start_; }
  /// The time of the next report (time_point::max() when disabled).
  Clock::time_point next() const { return next_; }
  bool enabled() const { return next_ != Clock::time_point::max(); }

  /// Whether a report is due at `now`. If so, schedules the next one for when the
  /// time waited will have doubled (at least one `first` later than now).
  bool Due(Clock::time_point now) {
    if (now < next_) return false;
    const auto waited = now - start_;
    const auto step = next_ - start_;  // > 0: the first interval or a multiple of it
    next_ = now + std::max(waited, step);
    return true;
  }

  std::chrono::milliseconds Waited(Clock::time_point now) const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - start_);
  }

 private:
  Clock::time_point start_{};
  Clock::time_point next_ = Clock::time_point::max();
};

/// How long WaitReporting waits and how it reports.
struct WaitPlan {
  /// No deadline (a wait bounded only by its condition, e.g. failure detection).
  static constexpr std::chrono::milliseconds kForever = std::chrono::milliseconds::max();
  /// The wait gives up this long after it began (<= 0: at once, without waiting).
  std::chrono::milliseconds timeout = kForever;
  std::chrono::milliseconds stall{0};  ///< first stall report after this; <= 0: none
  /// > 0: re-check the condition at least this often, for conditions that are polled
  /// rather than signalled (e.g. a transport's handshake outcome).
  std::chrono::milliseconds poll{0};
};

/// The steady clock, as WaitReporting's default time source (tests pass a fake one).
struct SteadyNow {
  StallSchedule::Clock::time_point operator()() const { return StallSchedule::Clock::now(); }
};

/// Waits until a condition holds, at most `plan.timeout`, reporting stalls.
///   wait_until(time_point) -> bool : blocks until the condition holds (true) or the
///                                    time point has passed (false); may return early.
///   report(milliseconds waited)    : called when a stall report is due; may throw to
///                                    end the wait (the exception propagates).
/// Returns true once the condition holds, false at the deadline (the caller reports
/// the timeout: only it knows what the wait was for).
template <class WaitUntil, class Report, class Now = SteadyNow>
bool WaitReporting(const WaitPlan& plan, WaitUntil&& wait_until, Report&& report, Now now = {}) {
  using TP = StallSchedule::Clock::time_point;
  const TP start = now();
  const TP deadline = plan.timeout == WaitPlan::kForever ? TP::max()
                      : plan.timeout.count() > 0         ? start + plan.timeout
                                                         : start;
  StallSchedule stalls(start, plan.stall);
  for (;;) {
    const TP t = now();
    if (t >= deadline) return false;
    TP until = std::min(deadline, stalls.next());
    if (plan.poll.count() > 0) until = std::min(until, t + plan.poll);
    if (wait_until(until)) return true;
    const TP after = now();
    if (stalls.Due(after)) report(stalls.Waited(after));
  }
}

/// The items of one report, up to a cap; the rest are counted ("a, b and 3 more").
class ReportList {
 public:
  explicit ReportList(size_t cap = kReportItems) : cap_(cap) {}

  /// Keeps `item` if there is room; returns false (counting it) once full.
  bool Add(std::string item) {
    ++total_;
    if (items_.size() >= cap_) return false;
    items_.push_back(std::move(item));
    return true;
  }
  /// Counts an item without building it (for callers that stop building once full).
  void Skip() { ++total_; }
  bool full() const { return items_.size() >= cap_; }
  size_t total() const { return total_; }
  size_t omitted() const { return total_ - items_.size(); }
  const std::vector<std::string>& items() const { return items_; }

  /// The kept items joined by `sep`, followed by " and N more" when some were omitted.
  std::string Join(std::string_view sep = ", ") const {
    std::string out;
    for (size_t i = 0; i < items_.size(); ++i) {
      if (i) out += sep;
      out += items_[i];
    }
    if (omitted() > 0) out += " and " + std::to_string(omitted()) + " more";
    return out;
  }

 private:
  size_t cap_;
  size_t total_ = 0;
  std::vector<std::string> items_;
};

}  // namespace pskv
