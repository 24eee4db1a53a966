// StallInspector: stalled sync rounds (stall_inspector.h). The timer thread logs them
// (with back-off); kRoundStatus describes them to a stalled worker, with the
// deadlocks it is part of.
#include <algorithm>
#include <set>

#include "common/logging.h"
#include "common/stall.h"
#include "kvstore/distributed/server/stall_inspector.h"
#include "kvstore/distributed/wire/kv_payload.h"

namespace pskv {

namespace {
int64_t Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}
}  // namespace

std::string StallInspector::MissingWorkers(const KeyState& st) const {
  std::string out;
  for (int id : node_->LiveWorkerIds())
    if (!st.round.pushed(id)) out += (out.empty() ? "" : ", ") + node_->NodeName(id);
  return out;
}

void StallInspector::Start() {
  if (node_->options().stall_warning.count() > 0) thread_ = std::thread([this] { Loop(); });
}

void StallInspector::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StallInspector::Loop() {
  using namespace std::chrono;
  const auto tick = std::clamp<milliseconds>(node_->options().stall_warning / 4, 50ms, 1000ms);
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, tick, [&] { return stop_; })) {
    lk.unlock();
    try {
      pool_->Exclusive([&] { Inspect(Clock::now()); });
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": stall inspector: " << e.what());
    }
    lk.lock();
  }
}

// In an exclusive section. Logs stalled rounds, with back-off, naming the workers they
// wait for (and whether those are in Barrier(); the waiting workers detect that
// deadlock themselves, see RoundStatus, since only they know that they are blocked).
//
// The status record (common/status_reporter.h) says the same: while a round has been
// open longer than PSKV_STALL_WARNING, this server is waiting for the workers that
// have not pushed it (reported when a log line is due); once none is, it no longer is.
void StallInspector::Inspect(Clock::time_point now) {
  const auto first = node_->options().stall_warning;
  const auto in_barrier = barriers_->Snapshot();
  bool stalled = false, due = false;
  std::set<int> missing;
  std::string what;
  Clock::time_point oldest = now;
  store_->ForEachKey([&](int64_t key, KeyState& st) {
    if (first.count() > 0 && st.round.open() && now - st.round.opened() >= first) {
      stalled = true;
      for (int id : node_->LiveWorkerIds())
        if (!st.round.pushed(id)) missing.insert(id);
      if (st.round.opened() <= oldest) {
        oldest = st.round.opened();
        what = "sync round of key " + std::to_string(key);
      }
    }
    if (!st.round.ReportDue(now, first)) return;
    due = true;
    std::string barrier;
    for (auto& [w, since] : in_barrier)
      if (!st.round.pushed(w))
        barrier += "; " + node_->NodeName(w) + " is in Barrier() for " +
                   std::to_string(Seconds(now - since)) + " s";
    PSKV_WARN(node_->Tag() << ": key " << key << " round " << st.round.round() << ": waiting for "
                           << MissingWorkers(st) << " for " << Seconds(now - st.round.opened())
                           << " s" << barrier);
  });
  if (due && stalled) {
    std::vector<NodeRef> refs;
    for (int id : missing) refs.push_back(NodeRefOf(id));
    node_->status().Waiting("rounds", what, std::move(refs), 0,
                            std::chrono::duration_cast<std::chrono::milliseconds>(now - oldest));
  } else if (!stalled) {
    node_->status().Resumed("rounds");
  }
}

// Lines describing open rounds; for a round the asking worker has pushed (it waits for
// it) and that waits for a worker in Barrier(), a deadlock entry (key, message).
std::string StallInspector::RoundStatus(int sender) {
  payload::RoundStatus out;
  int n = 0;
  const auto now = Clock::now();
  // A replicated server's ranges each answer (ReplicaHost): the line names the range.
  const std::string range =
      replicated_ ? " (key range " + std::to_string(store_->range().index()) + ")" : std::string();
  const auto in_barrier = barriers_->Snapshot();
  store_->ForEachKey([&](int64_t key, KeyState& st) {
    if (!st.round.open()) return;
    const std::string round =
        "key " + std::to_string(key) + range + " round " + std::to_string(st.round.round());
    if (st.round.pushed(sender))
      for (auto& [w, since] : in_barrier)
        if (!st.round.pushed(w))
          out.deadlocks.push_back(
              {key, round + " (on " + node_->Tag() + "): " + node_->NodeName(sender) +
                        " waits for this sync round, which needs a push from " +
                        node_->NodeName(w) + "; but " + node_->NodeName(w) +
                        " has been in Barrier() for " + std::to_string(Seconds(now - since)) +
                        " s, and that barrier waits for " + node_->NodeName(sender) +
                        ". Push every key on every worker before a Barrier (or WaitAll on every "
                        "worker before it)"});
    if (++n > static_cast<int>(kReportItems)) return;  // a report, not a dump
    out.lines.push_back(round + " on " + node_->Tag() + ": waiting for " + MissingWorkers(st) +
                        " for " + std::to_string(Seconds(now - st.round.opened())) + " s");
  });
  return payload::EncodeRoundStatus(out);
}

}  // namespace pskv
