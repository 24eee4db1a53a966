#include "launcher/server_loss.h"

#include <algorithm>

namespace pskv::launcher {

namespace {

bool Listed(const std::vector<NodeRef>& nodes, const std::vector<NodeRef>& in) {
  for (auto& n : nodes)
    if (std::find(in.begin(), in.end(), n) == in.end()) return false;
  return !nodes.empty();
}

std::string Secs(std::chrono::milliseconds ms) {
  return std::to_string((ms.count() + 999) / 1000) + " s";
}

}  // namespace

bool ServerLosses::AfterEnd(size_t child, const StatusBoard& board) {
  const auto sched = board.Scheduler();
  if (!sched || sched->second->phase != StatusPhase::kFinished) return false;
  const std::vector<NodeRef> nodes = board.NodesOf(child);
  for (auto& n : nodes)
    if (n.role != "server" && n.role != "scheduler") return false;
  return !nodes.empty();
}

bool ServerLosses::IsWorker(size_t child, const StatusBoard& board) {
  const std::vector<NodeRef> nodes = board.NodesOf(child);
  for (auto& n : nodes)
    if (n.role != "worker") return false;
  return !nodes.empty();
}

bool ServerLosses::Died(size_t child, std::string how, int status, const StatusBoard& board,
                        const std::vector<bool>& alive, Clock::time_point now) {
  const auto sched = board.Scheduler();
  if (!sched) return false;
  const auto [sched_child, rec] = *sched;
  const bool worker = elastic_workers_ && IsWorker(child, board);
  if ((rec->replicas <= 0 && !worker) || rec->detect_ms <= 0 ||
      rec->phase == StatusPhase::kFailed || sched_child == child || sched_child >= alive.size() ||
      !alive[sched_child])
    return false;
  std::vector<NodeRef> nodes = board.NodesOf(child);
  if (nodes.empty()) return false;
  for (auto& n : nodes)
    if (n.role != (worker ? "worker" : "server")) return false;
  const auto waited = std::chrono::milliseconds(rec->detect_ms) + kVerdictSlack;
  pending_.push_back({child, std::move(nodes), std::move(how), status, now + waited, waited});
  return true;
}

std::vector<ServerLosses::Verdict> ServerLosses::Decide(const StatusBoard& board,
                                                        const std::vector<bool>& alive,
                                                        Clock::time_point now) {
  std::vector<Verdict> out;
  const auto sched = board.Scheduler();
  for (auto it = pending_.begin(); it != pending_.end();) {
    const StatusRecord* rec = sched ? sched->second : nullptr;
    const bool sched_alive = sched && sched->first < alive.size() && alive[sched->first];
    Verdict v{false, false, it->child, it->status, {}};
    if (rec && Listed(it->nodes, rec->departed)) {
      v.survived = true;
      v.message = it->how + (it->nodes.front().role == "worker"
                                 ? "; the job goes on without it: the scheduler dropped it "
                                   "(PSKV_ELASTIC)"
                                 : "; the job goes on without it: the scheduler moved its key "
                                   "ranges to their replicas (PSKV_REPLICAS)");
    } else if (rec && rec->phase == StatusPhase::kFinished) {
      // Not declared dead, yet the final barrier passed: the job did not need it.
      v.survived = v.after_end = true;
      v.message = it->how +
                  "; the job finished without it (the scheduler released every node from "
                  "the final barrier): not a failure";
    } else if (rec && rec->phase == StatusPhase::kFailed) {
      v.message = it->how + ", and the scheduler failed the job: " + rec->kind +
                  (rec->message.empty() ? "" : ": " + rec->message);
    } else if (!sched_alive) {
      v.message = it->how +
                  ", and the scheduler exited before it said whether the job "
                  "survives it";
    } else if (now >= it->deadline) {
      v.message = it->how + ", and the scheduler did not say within " + Secs(it->waited) +
                  " whether the job survives it (PSKV_REPLICAS)";
    } else {
      ++it;
      continue;
    }
    out.push_back(std::move(v));
    it = pending_.erase(it);
  }
  return out;
}

std::vector<size_t> ServerLosses::Departed(const StatusBoard& board,
                                           const std::vector<bool>& alive) const {
  std::vector<size_t> out;
  const auto sched = board.Scheduler();
  if (!sched || sched->second->departed.empty()) return out;
  for (size_t c = 0; c < alive.size(); ++c)
    if (alive[c] && c != sched->first && Listed(board.NodesOf(c), sched->second->departed))
      out.push_back(c);
  return out;
}

}  // namespace pskv::launcher
