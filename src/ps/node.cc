// Node: lifecycle (finalize, abort), failures and the timer thread. Start is in
// node_start.cc, receiving in node_receive.cc; its components own the rest (node.h):
// who is in the job (ps/membership.h), the standby's failover (ps/takeover.h), barrier
// waits (ps/barriers.h), sending (ps/send_path.h), the scheduler's decisions
// (ps/scheduler.h).
#include "ps/node.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "common/env_table.h"
#include "common/logging.h"
#include "common/net.h"
#include "ps/node_internal.h"
#include "ps/scheduler.h"
#include "pskv/error.h"
#include "transport/data_path_name.h"

namespace pskv {

namespace {
using namespace std::chrono_literals;
using node_internal::SecsStr;
constexpr auto kRegisterRetry = 500ms;
// A timer sleep overrun beyond this means the process was not scheduled (Liveness).
constexpr auto kStarvedAfter = 200ms;
// The least time between two heartbeats sent early with a moved link rate estimate.
constexpr auto kUrgentHeartbeat = 200ms;
}  // namespace

namespace {
Options Validated(Options o) {
  o.ValidateForDistributed();
  return o;
}
}  // namespace

Node::Node(Options options)
    : options_(Validated(std::move(options))),
      liveness_(options_.heartbeat_interval, options_.heartbeat_timeout),
      resender_(options_.resend_timeout,
                std::max<std::chrono::milliseconds>(options_.resend_timeout,
                                                    options_.heartbeat_interval * 2)) {
  fail_points_ = MakeFailPoints(*this);
  standby_ = options_.standby;
  if (options_.role == Role::kScheduler) scheduler_ = std::make_unique<Scheduler>(this);
  std::string job = options_.job_id.empty()
                        ? options_.root_uri + ":" + std::to_string(options_.root_port)
                        : options_.job_id;
  job +=
      "/" + std::to_string(options_.num_workers) + "w" + std::to_string(options_.num_servers) + "s";
  job_ = JobHash(job);
  std::random_device rd;
  token_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  if (token_ == 0) token_ = 1;
}

Node::~Node() {
  if (started_ && !stopped_) Abort("node destroyed without Finalize");
}

std::string Node::Tag() const {
  if (role() == Role::kScheduler) return standby_ ? "standby scheduler" : "scheduler";
  const int rank = rank_.load();
  return RoleName(role()) + "[" + (rank >= 0 ? std::to_string(rank) : "?") + "]";
}

std::exception_ptr Node::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

// ------------------------------------------------------------------ stop

void Node::StopThreads(std::chrono::milliseconds linger) {
  stop_ = true;
  cv_.notify_all();
  if (timer_thread_.joinable()) timer_thread_.join();
  if (recv_thread_.joinable()) recv_thread_.join();
  if (transport_) transport_->Close(linger);
}

void Node::Finalize(std::chrono::milliseconds timeout) {
  if (!started_ || stopped_) return;
  if (options_.standby && takeover_.Finalize()) return;  // the job ended (or failed) meanwhile
  std::exception_ptr err;
  // With failure detection on, a dead or unreachable node ends this wait; a
  // live one that is just slower (rank 0 evaluating, checkpointing) is waited for.
  const bool detecting = options_.heartbeat_timeout.count() > 0;
  try {
    barriers_.Wait(kAllGroup, detecting ? 0ms : timeout, /*final=*/true);
  } catch (const TimeoutError& e) {
    err = std::current_exception();
    std::lock_guard<std::mutex> lk(mu_);
    if (!IsScheduler() && ready_) {
      try {  // say why, instead of vanishing and being reported dead later
        SendControl(kSchedulerId, Control::kLeave, 0,
                    std::string("gave up waiting at the final barrier: ") + e.what());
      } catch (...) {
      }
    }
  } catch (...) {
    err = std::current_exception();
  }
  liveness_.Stop();
  // Keep resending until our last messages (the final barrier's releases) are
  // acknowledged, so no peer is left waiting for a message that was lost.
  // Bounded: a peer that already closed never acknowledges.
  if (!err && options_.resend)
    resender_.WaitAllAcked(std::min<std::chrono::milliseconds>(
        5000ms, options_.resend_timeout * 10 + options_.heartbeat_interval * 2));
  {
    std::lock_guard<std::mutex> lk(mu_);
    finished_ = true;
  }
  // Linger so that the last barrier releases reach every node before we close.
  if (err)
    status_.Failed(ErrorKindName(err), ErrorMessage(err));
  else
    status_.SetPhase(StatusPhase::kFinished);
  StopThreads(err ? 200ms : 2000ms);
  stopped_ = true;
  if (err) std::rethrow_exception(err);
}

void Node::Abort(const std::string& reason) {
  if (!started_ || stopped_) return;
  liveness_.Stop();
  {
    std::lock_guard<std::mutex> lk(mu_);
    finished_ = true;
    if (!IsScheduler() && ready_) {
      try {
        SendControl(kSchedulerId, Control::kLeave, 0, reason);
      } catch (...) {
      }
    } else if (IsScheduler() && ready_) {
      scheduler_->AnnounceFailure(kSchedulerId, "scheduler aborted: " + reason);
    }
  }
  StopThreads(500ms);
  stopped_ = true;
}

// ------------------------------------------------------------------ failures

void Node::Fail(std::exception_ptr e, int culprit) {
  liveness_.Stop();
  std::vector<FailureHandler> handlers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failure_ || finished_) return;
    failure_ = e;
    handlers = events_.failure;
    send_.DropQueues();  // queued sends fail with their requests (the failure handlers)
  }
  cv_.notify_all();
  status_.Failed(ErrorKindName(e), ErrorMessage(e),
                 culprit ? std::vector<NodeRef>{NodeRefOf(culprit)} : std::vector<NodeRef>{});
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    PSKV_ERROR(Tag() << ": " << ex.what());
  }
  for (auto& h : handlers) h(e);
}

void Node::FailNode(int dead_id, const std::string& reason) {
  // The scheduler is no single point of failure where a standby follows it
  // (ps/takeover.h): the standby takes over, a node waits for it to.
  if (dead_id == kSchedulerId && !IsScheduler()) {
    if (standby_) return takeover_.Seek(reason);
    if (takeover_.Await(reason)) return;
  }
  if (dead_id == kStandbyId && IsScheduler()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ForgetPeer(kStandbyId, Forgotten::kGone);  // a fresh one is Reset (AdmitStandby)
      if (!members_.DropStandby()) return;
    }
    PSKV_WARN(Tag() << ": " << reason
                    << "; the job goes on without a standby scheduler (the scheduler's death "
                       "would now end it)");
    return;
  }
  if (replicated() && IsServerId(dead_id) && !IsScheduler()) {
    // The scheduler decides whether the job survives a server (its range table);
    // this node stops watching it and waits for the verdict, for a bounded time
    // (CheckSuspects).
    liveness_.Forget(dead_id);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!members_.Suspect(dead_id, reason)) return;
    }
    PSKV_WARN(Tag() << ": " << reason << "; waiting for the scheduler's range table");
    return;
  }
  if (options_.elastic && IsWorkerId(dead_id) && role() != Role::kScheduler) {
    // Elastic workers: the scheduler decides (it drops the worker, or fails the job
    // below PSKV_MIN_WORKERS); this node stops watching it.
    liveness_.Forget(dead_id);
    return;
  }
  std::string why = reason;
  if (replicated() && IsServerId(dead_id) && scheduler_->SurviveServer(dead_id, &why)) return;
  if (options_.elastic && IsWorkerId(dead_id) && scheduler_->elastic().SurviveWorker(dead_id, &why))
    return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ForgetPeer(dead_id, Forgotten::kGone);
    if (IsScheduler()) scheduler_->DropArrivals(dead_id);  // its arrivals no longer count
  }
  // The scheduler's failed status record is written (Fail) before any node hears of
  // the failure: a launcher that sees a worker exit over it already has the verdict.
  Fail(std::make_exception_ptr(NodeFailure(why)), dead_id);
  if (IsScheduler()) {
    std::lock_guard<std::mutex> lk(mu_);
    scheduler_->AnnounceFailure(dead_id, why);
  }
}

void Node::TimerLoop() {
  LogScope named([this] { return Tag(); });  // lines of this thread carry the node's name
  auto next_hb = Clock::now();
  auto last_hb = Clock::time_point{};
  auto next_reg = Clock::now();
  auto nap = std::min<std::chrono::milliseconds>(50ms, options_.resend_timeout);
  while (!stop_) {
    const auto slept_from = Clock::now();
    std::this_thread::sleep_for(nap);
    const auto now = Clock::now();
    // An overrun far beyond scheduling jitter: this process was not running (an
    // overloaded host, SIGSTOP, a paused VM) — not its peers' silence.
    if (now - slept_from > nap + kStarvedAfter) liveness_.Starved(now, now - slept_from - nap);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) break;
      try {
        if (!IsScheduler() && !ready_ && refused_.empty() && now >= next_reg) {
          NodeDesc d;
          d.role = static_cast<int>(role());
          d.host = host_;
          d.port = port_;
          d.token = token_;
          d.rank_hint = options_.rank_hint;
          if (role() == Role::kWorker) d.layout = WorkerLayoutSettings(options_);
          // The header's head carries this node's PSKV_REPLICAS and PSKV_SPARE_SERVERS
          // (every node of a job must set the same: Scheduler::CheckSettings) and whether it is
          // a spare server.
          const RegisterHead head{options_.replicas, options_.spare_servers, options_.spare,
                                  options_.elastic};
          SendControl(kSchedulerId, Control::kRegister, head.Encode(), EncodeNodes({d}));
          // With a standby, to it too: it answers once it took over (a node that never
          // reached the scheduler, started after it died: ps/takeover.cc).
          takeover_.RegisterWithStandby(head.Encode(), EncodeNodes({d}));
          next_reg = now + kRegisterRetry;
        }
        if (!IsScheduler() && ready_ && !finished_ && options_.heartbeat_interval.count() > 0 &&
            (now >= next_hb || (link_rates_.Urgent() && now >= last_hb + kUrgentHeartbeat))) {
          // Its head: the link rate this node learned (0: none; ps/link_rate_share.h),
          // sent early where it moved (the job's rate follows it).
          SendControl(kSchedulerId, Control::kHeartbeat, link_rates_.Outgoing());
          next_hb = now + options_.heartbeat_interval;
          last_hb = now;
        }
      } catch (const std::exception& e) {
        PSKV_LOG_LIMITED(limiter_, "timer", "WARN", Tag() << ": " << e.what());
      }
      if (IsScheduler() && ready_ && !finished_) {
        scheduler_->WarnStalledBarriers(now);
        TellLinkRate(0, link_rates_.Pending(now));  // a change of the job's link rate that waited
      }
    }
    CheckSuspects(now);
    takeover_.Tick(now);
    // Failure detection: silence (heartbeats) and lost connections.
    auto [dead, why] = liveness_.Check(now, *transport_, [this](int id) { return NodeName(id); });
    if (dead) {
      FailNode(dead, IsScheduler() || dead == kSchedulerId ? why : Tag() + " " + why);
      continue;
    }
    // Retransmission; giving up is the failure detector's decision, not a count.
    if (options_.resend) {
      for (auto& [to, frames] : resender_.Due(now)) {
        try {
          transport_->Send(to, frames);
        } catch (const std::exception& e) {
          PSKV_LOG_LIMITED(limiter_, "resend", "WARN", Tag() << ": resend failed: " << e.what());
        }
      }
    }
  }
}

// ------------------------------------------------------------------ membership

NodeRef NodeRefOf(int id) {
  if (id == kSchedulerId) return {"scheduler", 0};
  return {IsServerId(id) ? "server" : "worker", RankOfId(id)};
}

void Node::ReportRangeCopied(int range, int from, uint64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  if (failure_ || finished_) return;
  SendControl(kSchedulerId, Control::kRangeCopied, range, std::to_string(bytes),
              static_cast<uint64_t>(from));
  copies_reported_[range] = {static_cast<uint64_t>(from), bytes};  // resent after a takeover
}

void Node::CheckSuspects(Clock::time_point now) {
  // A server this node lost that the scheduler keeps (it still hears from it): a
  // partition between the two. Waiting for a table that never comes would end only
  // at PSKV_TIMEOUT; after as long again as this node's own detection took, fail.
  const auto grace = options_.heartbeat_timeout + options_.heartbeat_interval;
  std::pair<int, std::string> lost;
  {
    std::lock_guard<std::mutex> lk(mu_);
    lost = members_.OverdueSuspect(now, grace);
  }
  if (!lost.first) return;
  const std::string why = lost.second + ", yet the scheduler still counts " + NodeName(lost.first) +
                          " in the job " + node_internal::SecsStr(grace) +
                          " later: a network partition between this node and that server "
                          "(check the network between the two hosts)";
  Fail(std::make_exception_ptr(NodeFailure(why)), lost.first);
}

void Node::SetPacingRate(int id, uint64_t bytes_per_s) {
  transport_->SetPacingRate(id, bytes_per_s);
}

bool Node::SendStats(int id, TcpSendStats* out) {
  return transport_->SendStats(id, out);
}

std::string Node::DataPathTo(int id) {
  return transport_ ? DataPath(*transport_, id) : "zmq";
}

}  // namespace pskv
