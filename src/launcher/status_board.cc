#include "launcher/status_board.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>

namespace pskv::launcher {

namespace {

bool Points(const StatusRecord& r) {
  return r.phase == StatusPhase::kWaiting || r.phase == StatusPhase::kFailed;
}

std::string Secs(int64_t ms) {
  return std::to_string(ms / 1000) + " s";
}

}  // namespace

StatusBoard::StatusBoard(std::vector<std::string> children) : children_(std::move(children)) {}

std::string StatusBoard::NodeName(const NodeRef& ref) {
  return ref.role == "scheduler" ? ref.role : ref.role + " " + std::to_string(ref.rank);
}

void StatusBoard::Forget(size_t child) {
  std::erase_if(reporters_, [&](const Reporter& r) { return r.child == child; });
}

bool StatusBoard::Add(size_t child, std::string_view text) {
  auto rec = child < children_.size() ? DecodeStatus(text) : std::nullopt;
  if (!rec) {
    ++ignored_;
    return false;
  }
  // A node that got its rank: its records before (rank -1) were its own.
  if (rec->rank >= 0)
    std::erase_if(reporters_, [&](const Reporter& r) {
      return r.child == child && r.record.role == rec->role && r.record.rank < 0;
    });
  for (auto& r : reporters_)
    if (r.child == child && r.record.role == rec->role && r.record.rank == rec->rank) {
      r.record = std::move(*rec);
      return true;
    }
  reporters_.push_back({child, std::move(*rec)});
  return true;
}

const StatusRecord* StatusBoard::Latest(size_t child) const {
  // A child normally holds one node; of several, one waiting or failed says most.
  const StatusRecord* best = nullptr;
  for (auto& r : reporters_)
    if (r.child == child && (!best || (!Points(*best) && Points(r.record)))) best = &r.record;
  return best;
}

std::vector<NodeRef> StatusBoard::NodesOf(size_t child) const {
  std::vector<NodeRef> nodes;
  for (auto& r : reporters_)
    if (r.child == child && r.record.rank >= 0) nodes.push_back({r.record.role, r.record.rank});
  return nodes;
}

std::optional<std::pair<size_t, const StatusRecord*>> StatusBoard::Scheduler() const {
  // Where the plan started the scheduler as its own child, only that child speaks for
  // it: a record claiming role=scheduler from another child (a worker's output line in
  // ssh mode, say) must not decide whether the job survived a server.
  const auto own = std::find(children_.begin(), children_.end(), "scheduler");
  const std::optional<size_t> from = own == children_.end()
                                         ? std::nullopt
                                         : std::optional<size_t>(size_t(own - children_.begin()));
  for (auto& r : reporters_)
    if (r.record.role == "scheduler" && (!from || r.child == *from))
      return std::pair{r.child, &r.record};
  return std::nullopt;
}

std::string StatusBoard::Describe(size_t child) const {
  const StatusRecord* r = Latest(child);
  if (!r) return {};
  std::string refs;
  for (auto& m : r->missing) refs += (refs.empty() ? "" : ", ") + NodeName(m);
  if (r->more > 0) refs += " and " + std::to_string(r->more) + " more";
  switch (r->phase) {
    case StatusPhase::kWaiting:
      return "waiting" + (refs.empty() ? std::string() : " for " + refs) + " (" +
             (r->wait.empty() ? std::string() : r->wait + ", ") + Secs(r->waited_ms) + ")";
    case StatusPhase::kFailed:
      return "failed: " + r->kind + (r->message.empty() ? "" : ": " + r->message);
    default:
      return StatusPhaseName(r->phase);
  }
}

const StatusBoard::Reporter* StatusBoard::ReporterOf(const NodeRef& ref) const {
  for (auto& r : reporters_)
    if (r.record.role == ref.role && r.record.rank == ref.rank) return &r;
  return nullptr;
}

std::optional<size_t> StatusBoard::ChildOf(const NodeRef& ref) const {
  if (const Reporter* r = ReporterOf(ref)) return r->child;
  for (size_t i = 0; i < children_.size(); ++i)
    if (children_[i] == NodeName(ref)) return i;
  for (size_t i = 0; i < children_.size(); ++i)
    if (children_[i] == ref.role + "s") return i;
  return std::nullopt;
}

std::optional<StatusBoard::Blame> StatusBoard::Hung(const std::vector<bool>& alive,
                                                    std::optional<size_t> from) const {
  auto is_alive = [&](size_t c) { return c < alive.size() && alive[c]; };
  // What a waited-for node is: 2, the end of a chain (it waits for nobody: hung);
  // 1, it waits only for running processes (a cycle of waits, if nothing else); 0, it
  // waits for a process that exited or that no child is (that one is to blame, not
  // this one, nor the nodes waiting for it).
  auto rank_of = [&](const Reporter* r) {
    if (!r || !Points(r->record) || r->record.missing.empty()) return 2;
    for (auto& m : r->record.missing) {
      auto t = ChildOf(m);
      if (!t || (*t != r->child && !is_alive(*t))) return 0;
    }
    return 1;
  };
  std::deque<const Reporter*> queue;
  std::set<const Reporter*> seen;
  for (auto& r : reporters_)
    if ((!from || r.child == *from) && Points(r.record) && seen.insert(&r).second)
      queue.push_back(&r);
  struct Target {
    size_t child;
    int rank;
    size_t order;
    std::vector<const Reporter*> waiters;
  };
  std::map<NodeRef, Target> targets;
  while (!queue.empty()) {
    const Reporter* r = queue.front();
    queue.pop_front();
    for (auto& m : r->record.missing) {
      auto t = ChildOf(m);
      if (!t || *t == r->child || !is_alive(*t)) continue;
      const Reporter* next = ReporterOf(m);
      auto [it, fresh] = targets.try_emplace(m, Target{*t, rank_of(next), targets.size(), {}});
      auto& waiters = it->second.waiters;
      if (std::find(waiters.begin(), waiters.end(), r) == waiters.end()) waiters.push_back(r);
      if (fresh && next && seen.insert(next).second) queue.push_back(next);
    }
  }
  // The end of a chain first; in a cycle of waits, the node most others wait for.
  // Ties: the nearest to the start.
  const std::pair<const NodeRef, Target>* best = nullptr;
  for (auto& entry : targets) {
    const Target& t = entry.second;
    if (t.rank == 0) continue;
    if (best) {
      const Target& b = best->second;
      if (std::tuple(t.rank, t.waiters.size(), b.order) <=
          std::tuple(b.rank, b.waiters.size(), t.order))
        continue;
    }
    best = &entry;
  }
  if (!best) return std::nullopt;
  const Reporter* w = best->second.waiters.front();
  return Blame{best->second.child, NodeName(best->first), w->child,
               NodeName({w->record.role, std::max(w->record.rank, 0)})};
}

}  // namespace pskv::launcher
