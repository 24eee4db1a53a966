// Barriers: a node's waits at the job's barriers (barriers.h).
#include "ps/barriers.h"

#include <algorithm>

#include "common/logging.h"
#include "common/stall.h"
#include "ps/node.h"
#include "ps/node_internal.h"
#include "ps/scheduler.h"
#include "pskv/error.h"

namespace pskv {

using node_internal::SecsStr;

void Barriers::Wait(int group, std::chrono::milliseconds timeout, bool final) {
  std::unique_lock<std::mutex> lk(n_.mu_);
  if (n_.failure_) std::rethrow_exception(n_.failure_);
  // The epoch barrier goes to the scheduler even for a worker left alone: a worker
  // joins a running elastic job at its release.
  if (n_.GroupSize(group) <= 1 && group != kEpochGroup) return;
  const uint64_t gen = gen_[group];
  if (final) at_final_ = true;
  if (n_.IsScheduler()) {
    n_.scheduler_->OnBarrier(kSchedulerId, group);
  } else {
    // With the releases of this group seen so far: resent to a standby that takes
    // over (ps/takeover.cc), it tells a missed release from a new barrier.
    n_.SendControl(kSchedulerId, Control::kBarrier, group, {}, gen);
    waiting_group_ = group;
  }
  struct Left {  // whatever way the wait ends (lk is held then)
    int& group;
    ~Left() { group = 0; }
  } left{waiting_group_};
  auto done = [&] { return gen_[group] != gen || n_.failure_ != nullptr; };
  // Bounded by `timeout` (0: none — then by failure detection); says what it is
  // waiting for after PSKV_STALL_WARNING, backing off (common/stall.h).
  // The scheduler and servers wait at the final barrier for the whole job: that
  // is no stall. A worker there has finished and waits for the others.
  const bool quiet = n_.IsScheduler() || (final && n_.role() != Role::kWorker);
  const WaitPlan plan{timeout.count() > 0 ? timeout : WaitPlan::kForever,
                      quiet ? std::chrono::milliseconds(0) : n_.options_.stall_warning};
  // The record names no node: only the scheduler knows who is missing (its own
  // record names them).
  StatusWait stall_status(&n_.status_);
  const bool reached = WaitReporting(
      plan,
      [&](std::chrono::steady_clock::time_point until) {
        return n_.cv_.wait_until(lk, until, done);
      },
      [&](std::chrono::milliseconds waited) {
        stall_status.Report(final ? "final barrier" : "barrier", {}, 0, waited);
        if (final)
          PSKV_WARN(n_.Tag() << ": finished; waiting for the rest of the job for "
                             << SecsStr(waited)
                             << " (the scheduler's log names the workers still running)");
        else
          PSKV_WARN(n_.Tag() << ": waiting at a barrier for " << SecsStr(waited)
                             << " (the scheduler's log names the nodes it waits for)");
      });
  if (!reached) {
    const std::string why = n_.Tag() + ": barrier timed out after " + SecsStr(timeout) +
                            " (some nodes did not reach it; the scheduler's log names them; "
                            "raise PSKV_TIMEOUT if they are just slow)";
    stall_status.Fail("TimeoutError", why);
    throw TimeoutError(why);
  }
  if (gen_[group] == gen && n_.failure_) std::rethrow_exception(n_.failure_);
}

void Barriers::AwaitAdmission() {
  std::unique_lock<std::mutex> lk(n_.mu_);
  const bool released = n_.cv_.wait_for(lk, n_.options_.register_timeout, [&] {
    return gen_[kEpochGroup] > 0 || n_.failure_ != nullptr;
  });
  if (n_.failure_) std::rethrow_exception(n_.failure_);
  if (!released)
    throw TimeoutError(n_.Tag() +
                       ": joined the running job, but the epoch barrier that admitted it "
                       "was not released within " +
                       SecsStr(n_.options_.register_timeout) + " (PSKV_REGISTER_TIMEOUT)");
}

std::vector<int> Barriers::LiveWorkersAtRelease(int group) const {
  std::lock_guard<std::mutex> lk(n_.mu_);
  auto it = live_at_release_.find(group);
  return it == live_at_release_.end() ? std::vector<int>{} : it->second;
}

uint64_t Barriers::Released(int group) const {
  std::lock_guard<std::mutex> lk(n_.mu_);
  auto it = gen_.find(group);
  return it == gen_.end() ? 0 : it->second;
}

void Barriers::OnRelease(int group, uint64_t released) {
  if (n_.options_.elastic) {  // before the waiter wakes: the release's worker set
    live_at_release_[group] = n_.members_.LiveWorkerIds();
  }
  // The count of releases makes a repeated release (after a takeover) harmless.
  uint64_t& gen = gen_[group];
  gen = released ? std::max(gen, released) : gen + 1;
}

void Barriers::ResendWait() {
  if (waiting_group_)
    n_.SendControl(kSchedulerId, Control::kBarrier, waiting_group_, {}, gen_[waiting_group_]);
}

}  // namespace pskv
