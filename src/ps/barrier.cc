// Node, part 3: barriers — the scheduler counts distinct arrivals per group and
// releases them; a waiting node is bounded by its timeout or the failure detector,
// and barriers that wait too long say so, naming the missing nodes.
#include "ps/node.h"

#include <algorithm>

#include "common/logging.h"
#include "common/net.h"
#include "common/observe.h"  // [observe]
#include "common/stall.h"
#include "ps/node_internal.h"
#include "pskv/error.h"

namespace pskv {

using node_internal::SecsStr;

void Node::HandleBarrier(int sender, int group) {
  if (group <= 0 || group > kAllGroup)
    throw ProtocolError("bad barrier group " + std::to_string(group));
  // Count distinct nodes, not requests (a duplicated message must not count twice),
  // and only nodes still in the job: GroupSize no longer counts a departed server.
  if (departed_.count(sender)) return;
  auto& arrived = barrier_arrived_[group];
  arrived.insert(sender);
  if (static_cast<int>(arrived.size()) < GroupSize(group)) {
    // The barrier of all nodes is the final one: servers wait there from the
    // start; it stalls only once a worker has finished.
    if (group == kAllGroup && !IsWorkerId(sender)) return;
    if (!barrier_stall_.count(group)) {
      const auto now = Clock::now();
      barrier_stall_[group] = StallSchedule(now, options_.stall_warning);
    }
    return;
  }
  arrived.clear();
  // Released from the final barrier, every node closes its connections and exits:
  // a closed port or silence is the end of the job now, not a death.
  if (group == kAllGroup && at_final_barrier_) liveness_.Stop();
  if (obs::Enabled()) {  // [observe] the scheduler's view: first arrival until release
    const uint64_t now = obs::NowUs();
    auto it = barrier_stall_.find(group);
    const uint64_t waited =
        it == barrier_stall_.end()
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
  barrier_stall_.erase(group);
  status_.Resumed("barrier/" + std::to_string(group));
  for (int id : GroupMembers(group)) {
    if (id == kSchedulerId) {
      barrier_gen_[group]++;
      cv_.notify_all();
    } else {
      SendControl(id, Control::kBarrierDone, group);
    }
  }
}

void Node::Barrier(int group, std::chrono::milliseconds timeout) {
  BarrierImpl(group, timeout, false);
}

void Node::BarrierImpl(int group, std::chrono::milliseconds timeout, bool final) {
  std::unique_lock<std::mutex> lk(mu_);
  if (failure_) std::rethrow_exception(failure_);
  if (GroupSize(group) <= 1) return;
  const uint64_t gen = barrier_gen_[group];
  if (final) at_final_barrier_ = true;
  if (role() == Role::kScheduler) {
    HandleBarrier(kSchedulerId, group);
  } else {
    SendControl(kSchedulerId, Control::kBarrier, group);
  }
  auto done = [&] { return barrier_gen_[group] != gen || failure_ != nullptr; };
  // Bounded by `timeout` (0: none — then by failure detection); says what it is
  // waiting for after PSKV_STALL_WARNING, backing off (common/stall.h).
  // The scheduler and servers wait at the final barrier for the whole job: that
  // is no stall. A worker there has finished and waits for the others.
  const bool quiet = role() == Role::kScheduler || (final && role() != Role::kWorker);
  const WaitPlan plan{timeout.count() > 0 ? timeout : WaitPlan::kForever,
                      quiet ? std::chrono::milliseconds(0) : options_.stall_warning};
  // The record names no node: only the scheduler knows who is missing (its own
  // record names them).
  StatusWait stall_status(&status_);
  const bool reached = WaitReporting(
      plan, [&](Clock::time_point until) { return cv_.wait_until(lk, until, done); },
      [&](std::chrono::milliseconds waited) {
        stall_status.Report(final ? "final barrier" : "barrier", {}, 0, waited);
        if (final)
          PSKV_WARN(Tag() << ": finished; waiting for the rest of the job for " << SecsStr(waited)
                          << " (the scheduler's log names the workers still running)");
        else
          PSKV_WARN(Tag() << ": waiting at a barrier for " << SecsStr(waited)
                          << " (the scheduler's log names the nodes it waits for)");
      });
  if (!reached) {
    const std::string why = Tag() + ": barrier timed out after " + SecsStr(timeout) +
                            " (some nodes did not reach it; the scheduler's log names them; "
                            "raise PSKV_TIMEOUT if they are just slow)";
    stall_status.Fail("TimeoutError", why);
    throw TimeoutError(why);
  }
  if (barrier_gen_[group] == gen && failure_) std::rethrow_exception(failure_);
}

void Node::WarnStalledBarriers(Clock::time_point now) {
  for (auto& [group, stall] : barrier_stall_) {
    if (!stall.Due(now)) continue;
    const auto& arrived = barrier_arrived_[group];
    ReportList missing;
    std::vector<NodeRef> refs;
    for (int id : GroupMembers(group)) {
      if (arrived.count(id) || id == kSchedulerId) continue;
      if (group == kAllGroup && !IsWorkerId(id)) continue;
      if (missing.full()) {
        missing.Skip();
      } else {
        missing.Add(NameLocked(id));
        refs.push_back(NodeRefOf(id));
      }
    }
    status_.Waiting("barrier/" + std::to_string(group),
                    group == kAllGroup ? "end of the job" : "barrier", std::move(refs),
                    static_cast<int64_t>(missing.omitted()), stall.Waited(now));
    PSKV_WARN("scheduler: " << (group == kAllGroup ? std::string("end of the job")
                                                   : "barrier of group " + std::to_string(group))
                            << ": waiting for " << missing.Join() << " for "
                            << SecsStr(stall.Waited(now)) << " (PSKV_STALL_WARNING)");
  }
}

}  // namespace pskv
