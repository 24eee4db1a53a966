// SyncRound<Push>: the sync-round state machine of one key on a server, shared by
// dense keys (DistServer) and row_sparse keys (SparseServer).
//
// A round collects one push from every worker (by node id). A push joins the open
// round (the first one opens it, at `now`); the round is complete when every worker
// pushed. The caller then Take()s the pushes, applies their sum and, if that
// succeeded, Advance()s to the next round number; if merging or applying failed, it
// Take()s the pushes and answers them with the error (the round number stays, the
// workers push that round again).
//
// Summation order (docs/design.md, PSKV_SUM_ORDER): Merge() adds pushes either in
// worker-rank order, as early as possible (a push is added once the pushes of all
// lower ranks are in, so the sum is bit-identical from run to run), or each push on
// arrival. RankOrder() gives a taken round's pushes in rank order for callers that
// sum at the end.
//
// Refusal() says why a push may not join: a second push by one worker in a round, or
// a round that needs a push from a worker that already finished the job (it could
// never complete). NeedsPushFrom(id) says which open rounds a finishing worker
// breaks; the caller fails them with FinishedWithoutPushing().
//
// Stall reports follow pskv's one stall policy (common/stall.h): ReportDue(now,
// first) is true when the round has been open for `first`, then each time that time
// has doubled; a new round starts over.
//
// Not thread-safe: owned by its key's state (its shard's thread or an exclusive
// section; SparseServer: the key's mutex).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/stall.h"
#include "kvstore/worker_set.h"
#include "protocol/message.h"

namespace pskv {

/// "<key>: <worker> finished the job without pushing round <round> ...": why a
/// round fails (or a push is refused) once a worker that did not push it finished.
/// `key` names the key ("key 3", "row_sparse key 3").
std::string FinishedWithoutPushing(const std::string& key, const std::string& worker,
                                   int64_t round);
/// "<worker> pushed <key> twice in one sync round (round <round>)".
std::string PushedTwice(const std::string& key, const std::string& worker, int64_t round);

enum class SumOrder { kRank, kArrival };

template <typename Push>
class SyncRound {
 public:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    int sender;  // node id
    Push push;
  };

  /// The open round's number (1 for the first round of a key).
  int64_t round() const { return completed_ + 1; }
  /// True while some worker pushed in the open round.
  bool open() const { return !pushed_.empty(); }
  bool pushed(int id) const { return pushed_.count(id); }
  size_t num_pushed() const { return pushed_.size(); }
  bool complete(int num_workers) const { return static_cast<int>(pushed_.size()) >= num_workers; }
  Clock::time_point opened() const { return opened_; }
  const std::vector<Entry>& pushes() const { return waiting_; }

  /// Why `sender` may not push into the open round, or "" if it may. `done`: node
  /// ids of the workers that finished; `name(id)` names a worker.
  template <typename Name>
  std::string Refusal(int sender, const std::set<int>& done, const std::string& key,
                      Name&& name) const {
    if (pushed_.count(sender)) return PushedTwice(key, name(sender), round());
    for (int d : done)
      if (!pushed_.count(d)) return FinishedWithoutPushing(key, name(d), round());
    return {};
  }
  /// True if the open round needs a push from worker `id` (which finished: the round
  /// can never complete).
  bool NeedsPushFrom(int id) const { return open() && !pushed_.count(id); }

  /// Adds `push` of `sender` (Refusal() was empty); the first push opens the round.
  void Join(int sender, Push push, Clock::time_point now) {
    if (pushed_.empty()) {
      opened_ = now;
      stall_ = StallSchedule();  // scheduled by the first ReportDue of this round
    }
    pushed_.insert(sender);
    waiting_.push_back({sender, std::move(push)});
  }

  /// Adds the pushes that can be summed now: merge(push, first) for each, `first`
  /// for the one that starts the sum (see the header comment).
  template <typename F>
  void Merge(SumOrder order, int num_workers, F&& merge) {
    Merge(order, num_workers, std::forward<F>(merge), [](int) { return false; });
  }
  /// The same, where `skip(rank)` is true for a worker rank whose push this round
  /// will never have (elastic workers: it left the job without pushing); rank order
  /// then passes over it. Called again after a worker left, with kRank only (kArrival
  /// merges the last push joined).
  template <typename F, typename Skip>
  void Merge(SumOrder order, int num_workers, F&& merge, Skip&& skip) {
    if (order == SumOrder::kArrival) {
      merge(waiting_.back().push, pushed_.size() == 1);
      return;
    }
    for (bool found = true; found && merged_ < num_workers;) {
      found = false;
      for (auto& e : waiting_)
        if (RankOfId(e.sender) == merged_) {
          merge(e.push, summed_ == 0);
          ++merged_;
          ++summed_;
          found = true;
          break;
        }
      if (!found && !pushed_.count(WorkerId(merged_)) && skip(merged_)) {
        ++merged_;
        found = true;
      }
    }
  }

  /// Ends the open round: returns its pushes (in arrival order) and resets it.
  std::vector<Entry> Take() {
    std::vector<Entry> out;
    out.swap(waiting_);
    pushed_.clear();
    merged_ = 0;
    summed_ = 0;
    return out;
  }
  /// The taken round was applied: the next one has the next number.
  void Advance() { ++completed_; }
  /// A key installed from a copy of another server's (no round open): the open round
  /// is `round`.
  void StartAt(int64_t round) { completed_ = round - 1; }
  /// Gives a spent vector's capacity back for the next round (no allocation per round).
  void Recycle(std::vector<Entry>&& spent) {
    spent.clear();
    if (waiting_.empty()) waiting_.swap(spent);
  }

  /// True when a stall report is due at `now` for a round open since opened():
  /// after `first`, then each time the time open has doubled. Each true moves on.
  bool ReportDue(Clock::time_point now, std::chrono::milliseconds first) {
    if (!open()) return false;
    if (!stall_.enabled()) stall_ = StallSchedule(opened_, first);
    return stall_.Due(now);
  }

  /// The pushes of `entries` in worker-rank order.
  static std::vector<const Push*> RankOrder(const std::vector<Entry>& entries) {
    std::vector<const Entry*> sorted;
    for (auto& e : entries) sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
      return RankOfId(a->sender) < RankOfId(b->sender);
    });
    std::vector<const Push*> out;
    for (auto* e : sorted) out.push_back(&e->push);
    return out;
  }

 private:
  WorkerSet pushed_;
  std::vector<Entry> waiting_;  // the open round's pushes, in arrival order
  int64_t completed_ = 0;       // rounds applied
  int merged_ = 0;              // rank order: pushes of ranks [0, merged_) are summed
  int summed_ = 0;              // rank order: pushes summed so far (skipped ranks are not)
  Clock::time_point opened_;    // first push of the open round
  StallSchedule stall_;         // stall reports of the open round
};

}  // namespace pskv
