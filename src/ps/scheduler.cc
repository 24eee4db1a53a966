// Scheduler, part 2: barriers (distinct arrivals per group, released to every
// member; a departure can complete one; stall warnings name the missing nodes) and
// the verdicts on failures: a failure announced to every node, or — replicated
// servers — a dead server's ranges moved to their replicas, a spare joined, the range
// table published and the removed server told (ps/scheduler.h).
#include "ps/scheduler.h"

#include <algorithm>

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "common/stall.h"
#include "ps/node.h"
#include "ps/node_internal.h"
#include "pskv/error.h"

namespace pskv {

using node_internal::SecsStr;

// ------------------------------------------------------------------ barriers

bool BarrierBook::Arrive(int group, int id, int size) {
  auto& arrived = arrived_[group];
  arrived.insert(id);
  return static_cast<int>(arrived.size()) >= size;
}

void BarrierBook::Depart(int id) {
  for (auto& [group, arrived] : arrived_) arrived.erase(id);
}

void Scheduler::OnBarrier(int sender, int group, uint64_t passed) {
  if (group <= 0 || (group > kAllGroup && group != kEpochGroup))
    throw ProtocolError("bad barrier group " + std::to_string(group));
  // Count distinct nodes, not requests (a duplicated message must not count twice),
  // and only nodes still in the job: GroupSize no longer counts a departed server.
  if (node_->members_.departed_.count(sender)) return;
  if (state_.took_over && sender != kSchedulerId) {
    // After a takeover a node resends the barrier it waits at, with the releases of
    // that group it saw: one behind, it missed the dead scheduler's last release;
    // one ahead, that release happened, and those counted here at the old barrier
    // missed it (scheduler_standby.cc).
    uint64_t& released = state_.released[group];
    if (passed + 1 == released) {
      node_->SendControl(sender, Control::kBarrierDone, group, {}, released);
      return;
    }
    if (passed == released + 1) {
      released = passed;
      for (int id : state_.barriers.Arrived(group)) {
        if (id == kSchedulerId) {
          node_->barriers_.gen_[group] = released;
          node_->cv_.notify_all();
        } else {
          node_->SendControl(id, Control::kBarrierDone, group, {}, released);
        }
      }
      state_.barriers.Clear(group);
    } else if (passed != released) {
      throw ProtocolError("barrier of group " + std::to_string(group) + " after " +
                          std::to_string(passed) + " of its releases; there were " +
                          std::to_string(released));
    }
  }
  if (state_.barriers.Arrive(group, sender, node_->GroupSize(group))) return Release(group);
  // The barrier of all nodes is the final one: servers wait there from the start; it
  // stalls only once a worker has finished.
  if (group == kAllGroup && !IsWorkerId(sender)) return;
  if (!state_.barrier_stall.count(group))
    state_.barrier_stall[group] = StallSchedule(Clock::now(), node_->options_.stall_warning);
}

void Scheduler::Release(int group) {
  if (group == kEpochGroup && elastic_.HoldRelease()) return;  // workers join (elastic_workers.h)
  state_.barriers.Clear(group);
  // Released from the final barrier, every node closes its connections and exits: a
  // closed port or silence is the end of the job now, not a death.
  if (group == kAllGroup && node_->barriers_.at_final_) {
    node_->liveness_.Stop();
    elastic_.RefuseWaiting("the job ended before the workers' next epoch barrier");
  }
  if (obs::Enabled()) {  // [observe] the scheduler's view: first arrival until release
    const uint64_t now = obs::NowUs();
    auto it = state_.barrier_stall.find(group);
    const uint64_t waited =
        it == state_.barrier_stall.end()
            ? 0
            : static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                        Clock::now() - it->second.start())
                                        .count());
    obs::Span("barrier", "barrier",
              group == kAllGroup      ? "all nodes"
              : group == kWorkerGroup ? "workers"
              : group == kServerGroup ? "servers"
                                      : "group " + std::to_string(group),
              0, now - waited, now);
  }
  state_.barrier_stall.erase(group);
  node_->status_.Resumed("barrier/" + std::to_string(group));
  const uint64_t released = ++state_.released[group];
  // The standby first (scheduler_standby.cc), and whether this ends the job.
  if (node_->members_.nodes_.count(kStandbyId)) {
    try {
      node_->SendControl(kStandbyId, Control::kBarrierDone, group,
                         group == kAllGroup && node_->barriers_.at_final_ ? "final" : "", released);
    } catch (...) {
    }
  }
  for (int id : node_->GroupMembers(group)) {
    if (id == kSchedulerId) {
      node_->barriers_.gen_[group] = released;
      node_->cv_.notify_all();
    } else {
      node_->SendControl(id, Control::kBarrierDone, group, {}, released);
    }
  }
}

void Scheduler::ReleaseCompletedBarriers() {
  for (int group : state_.barriers.Completed([this](int g) { return node_->GroupSize(g); }))
    Release(group);
  elastic_.RecheckHeld();  // a server that was to take a joiner left
}

void Scheduler::WarnStalledBarriers(Clock::time_point now) {
  for (auto& [group, stall] : state_.barrier_stall) {
    if (!stall.Due(now)) continue;
    ReportList missing;
    std::vector<NodeRef> refs;
    for (int id : node_->GroupMembers(group)) {
      if (state_.barriers.HasArrived(group, id) || id == kSchedulerId) continue;
      if (group == kAllGroup && !IsWorkerId(id)) continue;
      if (missing.full()) {
        missing.Skip();
      } else {
        missing.Add(node_->NameLocked(id));
        refs.push_back(NodeRefOf(id));
      }
    }
    node_->status_.Waiting("barrier/" + std::to_string(group),
                           group == kAllGroup ? "end of the job" : "barrier", std::move(refs),
                           static_cast<int64_t>(missing.omitted()), stall.Waited(now));
    PSKV_WARN("scheduler: " << (group == kAllGroup ? std::string("end of the job")
                                                   : "barrier of group " + std::to_string(group))
                            << ": waiting for " << missing.Join() << " for "
                            << SecsStr(stall.Waited(now)) << " (PSKV_STALL_WARNING)");
  }
}

// ------------------------------------------------------------------ failures

void Scheduler::AnnounceFailure(int culprit, const std::string& why) {
  for (auto& [id, d] : node_->members_.nodes_) {
    if (id == kSchedulerId || id == culprit) continue;
    try {
      node_->SendControl(id, Control::kNodeFailed, culprit, why);
    } catch (...) {
    }
  }
}

bool Scheduler::SurviveServer(int dead_id, std::string* reason) {
  Node& n = *node_;
  std::vector<Node::RangeTableHandler> handlers;
  RangeTable table;
  {
    std::lock_guard<std::mutex> lk(n.mu_);
    if (n.failure_ || n.finished_) return false;
    if (n.members_.departed_.count(dead_id)) return true;  // handled already
    RangeTable next = n.members_.ranges_;
    const auto removal = next.Remove(dead_id);
    if (!removal.lost.empty()) {
      std::string lost;
      for (int r : removal.lost) lost += (lost.empty() ? "" : ", ") + std::to_string(r);
      *reason += " (no live copy left of key range" +
                 std::string(removal.lost.size() > 1 ? "s " : " ") + lost + ")";
      return false;
    }
    if (const int spare = next.AssignSpare(n.options_.replicas)) {
      state_.copy_lost_at = Clock::now();
      state_.copy_lost_what = n.NameLocked(dead_id) + " was lost";
      PSKV_WARN(n.Tag() << ": spare " << n.NameLocked(spare)
                        << " joins the key ranges left short of a copy; their primaries send it "
                           "their state");
    }
    n.members_.ranges_ = next;
    n.members_.departed_.insert(dead_id);
    Settled(dead_id);  // after a takeover: it will not rejoin
    state_.removal_reason[dead_id] = *reason;
    TellRemoved(dead_id);
    n.ForgetPeer(dead_id, Node::Forgotten::kGone);
    state_.barriers.Depart(dead_id);
    PSKV_WARN(n.Tag() << ": " << *reason << "; its key ranges continue on their replicas: "
                      << n.members_.ranges_.Describe());
    PublishRanges();
    ReleaseCompletedBarriers();
    handlers = n.events_.range_table;
    table = n.members_.ranges_;
  }
  n.status_.Departed(NodeRefOf(dead_id));  // the launcher lets the job go on without it
  for (auto& h : handlers) h(table);
  return true;
}

void Scheduler::OnRangeCopied(const Message& m, int sender) {
  Node& n = *node_;
  const RangeTable& ranges = n.members_.ranges_;
  const int range = m.h.head;
  const int from = static_cast<int>(m.h.timestamp);
  if (!n.members_.replicated_ || range < 0 || range >= ranges.num_ranges()) return;
  // Only a copy sent by the range's current primary counts: one sent by a primary
  // that died since is replaced by the new primary's (it sends its own).
  if (ranges.Primary(range) != from) {
    PSKV_WARN(n.Tag() << ": " << n.NameLocked(sender) << " installed key range " << range
                      << " from " << n.NameLocked(from) << ", which is not its primary any more; "
                      << "waiting for the copy of " << n.NameLocked(ranges.Primary(range)));
    return;
  }
  if (!n.members_.ranges_.Joined(range, sender)) return;  // repeated, or it left
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - state_.copy_lost_at)
          .count();
  bool copying = false;
  for (int r = 0; r < ranges.num_ranges(); ++r) copying |= !ranges.Joining(r).empty();
  PSKV_WARN(n.Tag() << ": " << n.NameLocked(sender) << " installed its copy of key range " << range
                    << " (" << m.body << " bytes from " << n.NameLocked(from)
                    << ") and is now its replica, " << ms << " ms after " << state_.copy_lost_what
                    << (copying ? "; range table " : "; back to full strength: ")
                    << ranges.Describe());
  PublishRanges();
  bool still = false;  // joining another range
  for (int r = 0; r < ranges.num_ranges(); ++r) {
    const auto& j = ranges.Joining(r);
    still |= std::find(j.begin(), j.end(), sender) != j.end();
  }
  if (!still) n.status_.Joined(NodeRefOf(sender));  // the launcher reports it
}

void Scheduler::PublishRanges() {
  const std::string body = payload::EncodeRangeTable(node_->members_.ranges_.ToData());
  for (auto& [id, d] : node_->members_.nodes_) {
    if (id == kSchedulerId || node_->members_.departed_.count(id)) continue;
    try {
      node_->SendControl(id, Control::kRangeTable, 0, body);
    } catch (...) {
    }
  }
}

void Scheduler::TellRemoved(int id) {
  // Repeated for what the removed node sends later (it may have missed the first
  // notice: a partition), at most once a second. Unsequenced, so that it is never
  // held back behind messages the resender forgot when the node was removed.
  const auto now = Clock::now();
  auto& last = state_.removed_told[id];
  if (last != Clock::time_point{} && now - last < std::chrono::seconds(1)) return;
  last = now;
  Message m;
  m.h.control = static_cast<uint8_t>(Control::kNodeFailed);
  m.h.head = id;
  m.h.sender = node_->id_;
  m.h.recver = id;
  m.h.job = node_->job_;
  m.body = state_.removal_reason[id];
  try {
    node_->transport_->Send(id, Encode(m));
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(node_->limiter_, "removed", "WARN",
                     node_->Tag() << ": could not tell " << node_->NameLocked(id)
                                  << " that it was removed from the job: " << e.what());
  }
}

}  // namespace pskv
