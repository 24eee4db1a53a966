// Node, start: the phases of Start, in order — the transport (config, bind,
// connect), the status channel, the receive and timer threads, the wait for the node
// table (the scheduler: for every registration), liveness, and the start barrier (a
// worker that joins a running elastic job: the epoch barrier that admits it). A phase
// that fails stops the threads and throws (AbandonStart).
#include <algorithm>
#include <atomic>

#include "common/logging.h"
#include "common/net.h"
#include "common/observe.h"  // [observe]
#include "ps/node.h"
#include "ps/node_internal.h"
#include "ps/scheduler.h"
#include "ps/test_disturbance.h"
#include "pskv/error.h"

namespace pskv {

using namespace std::chrono_literals;
using node_internal::SecsStr;

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
    status_.SetJob(replicated() ? options_.replicas : 0, detect.count());
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
  for (auto& [id, d] : members_.nodes()) {
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

std::string Node::PickHost() const {
  if (!options_.node_host.empty()) return options_.node_host;
  if (!options_.interface.empty()) return InterfaceAddress(options_.interface);
  if (IsLoopback(options_.root_uri)) return "127.0.0.1";
  return DefaultAddress();
}

}  // namespace pskv
