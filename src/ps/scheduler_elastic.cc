// Scheduler, part 3: elastic workers (PSKV_ELASTIC; docs/fault-tolerance.md, "Elastic
// workers"). A worker that dies, is silent or leaves before the end is dropped from the
// job: every node hears kWorkerLeft (servers close the rounds it did not push with the
// pushes that arrived), barriers count it out, the launcher lets the job go on
// (status: departed) — unless fewer than PSKV_MIN_WORKERS would be left.
#include "common/logging.h"
#include "ps/node.h"
#include "ps/scheduler.h"

namespace pskv {

bool Scheduler::SurviveWorker(int dead_id, std::string* reason) {
  Node& n = *node_;
  {
    std::lock_guard<std::mutex> lk(n.mu_);
    if (n.failure_ || n.finished_) return false;
    if (RankOfId(dead_id) >= n.options_.num_workers) return false;
    if (n.departed_workers_.count(dead_id)) return true;  // handled already
    const int left = n.options_.num_workers - static_cast<int>(n.departed_workers_.size()) - 1;
    if (left < n.options_.min_workers) {
      *reason +=
          "; " + std::to_string(left) + " worker" + (left == 1 ? "" : "s") +
          " would be left, fewer than PSKV_MIN_WORKERS=" + std::to_string(n.options_.min_workers);
      return false;
    }
    n.departed_workers_.insert(dead_id);
    state_.removal_reason[dead_id] = *reason;
    TellRemoved(dead_id);  // in case it still runs (frozen, cut off)
    n.held_.erase(dead_id);
    n.schedule_.Forget(dead_id);
    state_.barriers.Depart(dead_id);
    PSKV_WARN(n.Tag() << ": " << *reason << "; the job goes on with " << left << " of "
                      << n.options_.num_workers << " workers (PSKV_ELASTIC)");
    for (auto& [id, d] : n.nodes_) {
      if (id == kSchedulerId || id == dead_id || n.departed_.count(id) ||
          n.departed_workers_.count(id))
        continue;
      try {
        n.SendControl(id, Control::kWorkerLeft, dead_id, *reason);
      } catch (...) {
      }
    }
    ReleaseCompletedBarriers();
  }
  n.liveness_.Forget(dead_id);
  n.resender_.Forget(dead_id);
  n.status_.Departed(NodeRefOf(dead_id));  // the launcher lets the job go on without it
  return true;
}

}  // namespace pskv
