// Node, part 1: lifecycle (start, finalize, abort), sending, failures and the timer
// thread. The node table, groups, barrier waits and the range table are in
// membership.cc, receiving in node_receive.cc; the scheduler's decisions in its
// component (ps/scheduler.h).
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
#include "common/observe.h"  // [observe]
#include "ps/node_internal.h"
#include "ps/scheduler.h"
#include "ps/test_disturbance.h"
#include "pskv/error.h"

namespace pskv {

namespace {
using namespace std::chrono_literals;
using node_internal::SecsStr;
constexpr auto kRegisterRetry = 500ms;
// A timer sleep overrun beyond this means the process was not scheduled (Liveness).
constexpr auto kStarvedAfter = 200ms;
}  // namespace

Node::Node(Options options)
    : options_(std::move(options)),
      liveness_(options_.heartbeat_interval, options_.heartbeat_timeout),
      resender_(options_.resend_timeout,
                std::max<std::chrono::milliseconds>(options_.resend_timeout,
                                                    options_.heartbeat_interval * 2)) {
  options_.ValidateForDistributed();
  fail_points_ = MakeFailPoints(*this);
  replicated_ = options_.replicas > 0 && options_.num_servers >= 2;
  standby_ = options_.standby;
  if (options_.role == Role::kScheduler) scheduler_ = std::make_unique<Scheduler>(this);
  if (replicated_)
    ranges_ = RangeTable::Initial(options_.num_servers, options_.replicas, options_.spare_servers);
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

void Node::AddFailureHandler(FailureHandler h) {
  std::lock_guard<std::mutex> lk(mu_);
  failure_handlers_.push_back(std::move(h));
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

// ------------------------------------------------------------------ start

// Start runs its phases in order: the transport (config, bind, connect), the status
// channel, the receive and timer threads, the wait for the node table (the
// scheduler: for every registration), liveness, and the start barrier. A phase that
// fails stops the threads and throws (AbandonStart).
void Node::Start() {
  if (started_) throw UsageError("Node::Start called twice");
  started_ = true;
  WarnIfOpen();
  BindAndConnect(MakeTransportConfig());
  OpenStatusChannel();
  start_time_ = Clock::now();
  if (options_.verbose >= 1)
    PSKV_INFO(Tag() << ": bound " << host_ << ":" << port_ << ", job " << std::hex << job_);
  recv_thread_ = std::thread([this] { ReceiveLoop(); });
  timer_thread_ = std::thread([this] { TimerLoop(); });
  {
    std::unique_lock<std::mutex> lk(mu_);
    std::exception_ptr err = AwaitNodeTable(lk);
    if (err && join_pending_ && !ready_ && !failure_ && refused_.empty()) {
      // Elastic workers: the scheduler took this registration as a join of the running
      // job, which admits it at the workers' next epoch barrier (EpochPartition).
      cv_.wait_for(lk, options_.op_timeout,
                   [&] { return ready_ || failure_ || !refused_.empty(); });
      err =
          ready_ || failure_ || !refused_.empty()
              ? StartFailureLocked()
              : std::make_exception_ptr(TimeoutError(
                    Tag() + ": the running job did not admit this worker within " +
                    SecsStr(options_.register_timeout + options_.op_timeout) +
                    " (PSKV_REGISTER_TIMEOUT + PSKV_TIMEOUT): a worker joins an elastic job at "
                    "the workers' next epoch barrier (KVStore::EpochPartition); do they call it?"));
    }
    if (err) {
      lk.unlock();
      AbandonStart(err, IsScheduler() && !ready_);
    }
    StartWatching();
  }
  AdoptNodeLogName(Tag());  // only if the program asked (pskv/process.h)
  obs::NameNode(Tag());     // [observe] the lane's name in a merged timeline
  if (options_.verbose >= 1) PSKV_INFO(Tag() << ": registered; id " << id_);
  fail_points_->Registered();
  if (standby_) {  // a standby follows: it is in no group until it takes over
    status_.SetPhase(StatusPhase::kRunning);
    return;
  }
  try {
    if (joined_)  // joined a running job: admitted at an epoch barrier's release
      AwaitAdmission();
    else
      Barrier(kAllGroup, options_.register_timeout);
  } catch (...) {
    AbandonStart(std::current_exception(), false);
  }
  status_.SetPhase(StatusPhase::kRunning);
}

TransportConfig Node::MakeTransportConfig() const {
  TransportConfig tc;
  tc.secret = options_.job_secret;
  tc.encrypt = options_.encrypt;
  tc.job = job_;
  tc.token = token_;
  // A standby too: nodes address it as "the scheduler" once it took over.
  tc.scheduler = role() == Role::kScheduler;
  tc.handshake_timeout = options_.handshake_timeout;
  tc.keepalive_interval = options_.heartbeat_interval;
  // As long as the heartbeat timeout: a peer whose receive queue is full (slow
  // handler, TCP back-pressure) must not look like a dead connection sooner.
  tc.keepalive_timeout = options_.heartbeat_timeout;
  tc.shm = options_.shm == "0"   ? TransportConfig::Shm::kOff
           : options_.shm == "1" ? TransportConfig::Shm::kOn
                                 : TransportConfig::Shm::kAuto;
  tc.shm_ring_bytes = static_cast<uint64_t>(options_.shm_ring_bytes);
  tc.tcp_direct = options_.tcp_direct;
  tc.spin = std::chrono::microseconds(options_.spin_us);
  // The largest frame the protocol can legally carry (message.h): a value chunk,
  // a command body, or a frame of kMaxKeys keys. Anything larger is hostile.
  tc.max_frame = std::max({kChunkBytes, uint64_t{kMaxBody}, uint64_t{kMaxKeys} * 8}) + kHeaderSize;
  tc.max_pending_connections = options_.max_pending_connections > 0
                                   ? options_.max_pending_connections
                                   : 4 * (options_.num_workers + options_.num_servers + 1) + 64;
  return tc;
}

void Node::WarnIfOpen() const {
  if (!options_.job_secret.empty()) return;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    PSKV_WARN(
        "this job has no secret: it is OPEN to anyone who can reach its ports, who can join "
        "it, read its values and change its weights. Start it with pskv-launch (which sets "
        "a secret), or set PSKV_JOB_SECRET or PSKV_JOB_SECRET_FILE on every node "
        "(docs/security.md)");
}

void Node::BindAndConnect(const TransportConfig& tc) {
  transport_ = DisturbForTests(
      transport_factory_ ? transport_factory_(tc) : CreateTransport(kNodeTransport, tc),
      fail_points_->Wire());
  if (IsScheduler()) {
    std::string host = IsIPv4Literal(options_.root_uri) ? options_.root_uri : "0.0.0.0";
    transport_->Bind(host, options_.root_port);
    host_ = options_.root_uri;
    port_ = options_.root_port;
    id_ = kSchedulerId;
    rank_ = 0;
  } else if (standby_) {
    // The standby binds its own address and follows the scheduler like a node.
    const std::string& at = options_.standby_scheduler;
    host_ = at.substr(0, at.rfind(':'));
    port_ = std::stoi(at.substr(at.rfind(':') + 1));
    transport_->Bind(IsIPv4Literal(host_) ? host_ : "0.0.0.0", port_);
    transport_->Connect(kSchedulerId, options_.root_uri + ":" + std::to_string(options_.root_port),
                        kSchedulerToken);
  } else {
    host_ = PickHost();
    std::string ep = transport_->Bind(host_, options_.port);
    port_ = std::stoi(ep.substr(ep.rfind(':') + 1));
    transport_->Connect(kSchedulerId, options_.root_uri + ":" + std::to_string(options_.root_port),
                        kSchedulerToken);
  }
}

void Node::OpenStatusChannel() {
  std::string why;
  status_.Configure(StatusChannel::Open(options_.status_channel, &why), RoleName(role()), host_);
  if (!why.empty()) PSKV_WARN(Tag() << ": " << why);
  if (role() == Role::kScheduler) {
    status_.SetRank(standby_ ? 1 : 0);
    // What the launcher needs to wait for this scheduler's verdict on a dead server.
    const auto detect = options_.heartbeat_timeout.count() > 0
                            ? options_.heartbeat_timeout + options_.heartbeat_interval
                            : std::chrono::milliseconds(0);
    status_.SetJob(replicated_ ? options_.replicas : 0, detect.count());
  }
  status_.SetPhase(StatusPhase::kRegistering);
}

std::exception_ptr Node::AwaitNodeTable(std::unique_lock<std::mutex>& lk) {
  // Wait for the node table (the scheduler waits for all registrations).
  // A node that reached the scheduler waits a little longer than the scheduler's
  // own registration timeout, so that the scheduler's explanation arrives first.
  const bool sched = IsScheduler();
  const auto deadline = start_time_ + options_.register_timeout;
  const auto grace = deadline + (sched ? 0ms : 5s);
  auto settled = [&] {
    if (refused_.empty() && !sched) {
      std::string why = transport_->RefusedBy(kSchedulerId);
      if (!why.empty()) refused_ = why;
    }
    return ready_ || failure_ || !refused_.empty();
  };
  // The transport's handshake outcome is polled, not signalled: re-check every
  // 100 ms until the deadline. The scheduler explains a timeout (StartFailureLocked);
  // a node that has not heard from the scheduler says every 10 s that it is still
  // waiting (a worker started by hand before, or without, its scheduler).
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  auto next_note = start_time_ + 10s;
  WaitReporting(
      WaitPlan{left, std::chrono::milliseconds(0), 100ms},
      [&](Clock::time_point until) {
        if (cv_.wait_until(lk, until, settled)) return true;
        const auto now = Clock::now();
        if (!sched && !scheduler_seen_ && now >= next_note && now < deadline) {
          next_note += 10s;
          const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - start_time_);
          lk.unlock();
          PSKV_INFO(Tag() << ": waiting for the scheduler at " << options_.root_uri << ":"
                          << options_.root_port << " (" << waited.count() << " s of "
                          << SecsStr(options_.register_timeout)
                          << ", PSKV_REGISTER_TIMEOUT); is it started? (pskv-launch starts it)");
          lk.lock();
        }
        return false;
      },
      [](std::chrono::milliseconds) {});
  if (!settled() && scheduler_seen_) cv_.wait_until(lk, grace, settled);
  return StartFailureLocked();
}

std::exception_ptr Node::StartFailureLocked() const {
  const bool sched = IsScheduler();
  if (sched && !ready_ && !scheduler_->mismatch().empty())
    return std::make_exception_ptr(ConfigError(scheduler_->mismatch()));
  if (!refused_.empty())
    return std::make_exception_ptr(
        ProtocolError(Tag() + " was refused by the scheduler at " + options_.root_uri + ":" +
                      std::to_string(options_.root_port) + ": " + refused_));
  if (failure_) return failure_;
  if (ready_) return nullptr;
  std::string msg;
  if (sched) {
    msg = scheduler_->RegistrationTimeout();
  } else if (!scheduler_seen_) {
    msg = "scheduler at " + options_.root_uri + ":" + std::to_string(options_.root_port) +
          " not reachable after " + SecsStr(options_.register_timeout) +
          " (check DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT, and that the scheduler runs)";
  } else {
    msg = "registered with the scheduler, but the job did not finish registration within " +
          SecsStr(options_.register_timeout) + " (are all workers and servers started?)";
  }
  return std::make_exception_ptr(TimeoutError(msg));
}

void Node::AbandonStart(std::exception_ptr err, bool refuse_registered) {
  status_.Failed(ErrorKindName(err), ErrorMessage(err));
  if (refuse_registered) {
    // Tell the nodes that did register, so they fail now with the reason.
    std::string why;
    try {
      std::rethrow_exception(err);
    } catch (const std::exception& e) {
      why = e.what();
    }
    std::lock_guard<std::mutex> g(mu_);
    scheduler_->RefuseRegistered(why);
  }
  StopThreads(200ms);
  stopped_ = true;
  std::rethrow_exception(err);
}

void Node::StartWatching() {
  // Watch for silence what heartbeats cover (the scheduler: every node; a node:
  // the scheduler) and for lost connections every peer this node sends to.
  const bool sched = IsScheduler();
  std::vector<int> silent, connected;
  if (standby_) {  // the standby watches the scheduler as the scheduler watches nodes
    liveness_.Start({kSchedulerId}, {kSchedulerId}, true);
    return;
  }
  for (auto& [id, d] : nodes_) {
    if (id == id_) continue;
    if (sched || id == kSchedulerId) silent.push_back(id);
    const bool talks =
        sched || id == kSchedulerId || (role() == Role::kWorker ? IsServerId(id) : IsWorkerId(id));
    if (talks) connected.push_back(id);
  }
  // The scheduler, whose verdict the others wait for, also trusts a peer's closed
  // port (Liveness, "Gone"): a killed process is known dead at once.
  liveness_.Start(silent, connected, sched);
}

void Node::AwaitAdmission() {
  std::unique_lock<std::mutex> lk(mu_);
  const bool released = cv_.wait_for(lk, options_.register_timeout, [&] {
    return barrier_gen_[kEpochGroup] > 0 || failure_ != nullptr;
  });
  if (failure_) std::rethrow_exception(failure_);
  if (!released)
    throw TimeoutError(Tag() +
                       ": joined the running job, but the epoch barrier that admitted it "
                       "was not released within " +
                       SecsStr(options_.register_timeout) + " (PSKV_REGISTER_TIMEOUT)");
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
  if (options_.standby && StandbyFinalize()) return;  // the job ended (or failed) meanwhile
  std::exception_ptr err;
  // With failure detection on, a dead or unreachable node ends this wait; a
  // live one that is just slower (rank 0 evaluating, checkpointing) is waited for.
  const bool detecting = options_.heartbeat_timeout.count() > 0;
  try {
    BarrierImpl(kAllGroup, detecting ? 0ms : timeout, /*final=*/true);
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

// ------------------------------------------------------------------ sending

bool Node::IsResendable(Control c) const {
  return options_.resend &&
         (c == Control::kData || c == Control::kBarrier || c == Control::kBarrierDone ||
          c == Control::kNodeFailed || c == Control::kCredit || c == Control::kRangeTable ||
          c == Control::kRangeCopied || c == Control::kWorkerLeft || c == Control::kWorkerJoined ||
          c == Control::kJoinReady);
}

// Called with mu_ held.
void Node::SendFrames(int to, Message& m) {
  m.h.sender = id_;
  m.h.recver = to;
  m.h.job = job_;
  const auto c = static_cast<Control>(m.h.control);
  if (IsResendable(c) && to < 1000000) m.h.seq = resender_.NextSeq(to);
  std::vector<Frame> frames = Encode(m);
  if (options_.verbose >= 2) PSKV_INFO(Tag() << " send " << Describe(m.h));
  if (m.h.seq) resender_.Track(to, m.h.seq, frames);
  transport_->Send(to, std::move(frames));
}

void Node::SendControl(int to, Control c, int head, std::string body, uint64_t ts) {
  Message m;
  m.h.control = static_cast<uint8_t>(c);
  m.h.head = head;
  m.h.timestamp = ts;
  m.body = std::move(body);
  SendFrames(to, m);
}

void Node::Send(int to, Message m) {
  std::lock_guard<std::mutex> lk(mu_);
  if (failure_) std::rethrow_exception(failure_);
  if (!ready_) throw UsageError("Node::Send before the node is registered");
  m.h.control = static_cast<uint8_t>(Control::kData);
  m.h.flags &= static_cast<uint8_t>(~kScheduled);
  if (!schedule_.Schedules(m.h.vals_len) || to >= 1000000) return SendFrames(to, m);
  m.h.flags |= kScheduled;
  if (!schedule_.Enqueue(to, m)) {
    // Bounded: an overfull queue degrades to sending at once (never blocks, never fails).
    PSKV_LOG_LIMITED(limiter_, "sendqueue", "WARN",
                     Tag() << ": more than " << SendSchedule::kMaxQueued
                           << " big messages wait for " << NameLocked(to)
                           << "; sending without priority order");
    const uint64_t bytes = m.h.vals_len;
    SendFrames(to, m);
    schedule_.Sent(to, bytes);
    return;
  }
  schedule_.Pump(to, [&](Message& q) { SendFrames(to, q); });
}

void Node::HandleCredit(int sender, uint64_t count) {
  if (!schedule_.Credit(sender, count)) {
    PSKV_LOG_LIMITED(limiter_, std::to_string(sender) + "/credit", "WARN",
                     Tag() << ": dropped a credit from " << NameLocked(sender) << " for " << count
                           << " messages: fewer were sent to it");
    return;
  }
  try {
    schedule_.Pump(sender, [&](Message& q) { SendFrames(sender, q); });
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(limiter_, "pump", "WARN",
                     Tag() << ": cannot send to " << NameLocked(sender) << ": " << e.what());
  }
}

void Node::SendCredit(int sender) {
  SendControl(sender, Control::kCredit, 0, {}, schedule_.Received(sender));
}

// ------------------------------------------------------------------ failures

void Node::Fail(std::exception_ptr e, int culprit) {
  liveness_.Stop();
  std::vector<FailureHandler> handlers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failure_ || finished_) return;
    failure_ = e;
    handlers = failure_handlers_;
    schedule_.DropQueues();  // queued sends fail with their requests (the failure handlers)
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
  // (scheduler_standby.cc): the standby takes over, a node waits for it to.
  if (dead_id == kSchedulerId && !IsScheduler()) {
    if (standby_) return SeekTakeover(reason);
    if (AwaitTakeover(reason)) return;
  }
  if (dead_id == kStandbyId && IsScheduler()) {
    liveness_.Forget(kStandbyId);
    resender_.Forget(kStandbyId);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!nodes_.count(kStandbyId)) return;
      id_of_token_.erase(nodes_[kStandbyId].token);
      nodes_.erase(kStandbyId);
    }
    PSKV_WARN(Tag() << ": " << reason
                    << "; the job goes on without a standby scheduler (the scheduler's death "
                       "would now end it)");
    return;
  }
  if (replicated_ && IsServerId(dead_id) && !IsScheduler()) {
    // The scheduler decides whether the job survives a server (its range table);
    // this node stops watching it and waits for the verdict, for a bounded time
    // (CheckSuspects).
    liveness_.Forget(dead_id);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (departed_.count(dead_id)) return;
      suspects_.emplace(dead_id, Suspect{Clock::now(), reason});
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
  if (replicated_ && IsServerId(dead_id) && scheduler_->SurviveServer(dead_id, &why)) return;
  if (options_.elastic && IsWorkerId(dead_id) && scheduler_->SurviveWorker(dead_id, &why)) return;
  resender_.Forget(dead_id);
  {
    std::lock_guard<std::mutex> lk(mu_);
    held_.erase(dead_id);
    schedule_.Forget(dead_id);
  }
  if (IsScheduler()) {
    std::lock_guard<std::mutex> lk(mu_);
    scheduler_->DropArrivals(dead_id);  // a departed node's arrivals no longer count
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
          // reached the scheduler, started after it died: scheduler_standby.cc).
          if (!options_.standby_scheduler.empty() && !standby_ && !registration_moved_) {
            if (!standby_linked_)
              transport_->Connect(kStandbyId, options_.standby_scheduler, kSchedulerToken);
            standby_linked_ = true;
            SendControl(kStandbyId, Control::kRegister, head.Encode(), EncodeNodes({d}));
          }
          next_reg = now + kRegisterRetry;
        }
        if (!IsScheduler() && ready_ && !finished_ && options_.heartbeat_interval.count() > 0 &&
            now >= next_hb) {
          SendControl(kSchedulerId, Control::kHeartbeat);
          next_hb = now + options_.heartbeat_interval;
        }
      } catch (const std::exception& e) {
        PSKV_LOG_LIMITED(limiter_, "timer", "WARN", Tag() << ": " << e.what());
      }
      if (IsScheduler() && ready_ && !finished_) scheduler_->WarnStalledBarriers(now);
    }
    CheckSuspects(now);
    StandbyTick(now);
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

}  // namespace pskv
