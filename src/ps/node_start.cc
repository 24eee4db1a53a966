// Node, start: the phases of Start, in order — the transport (config, bind,
// connect), the status channel, the receive and timer threads, the wait for the node
// table (the scheduler: for every registration), liveness, and the start barrier (a
// worker that joins a running elastic job: the epoch barrier that admits it). A phase
// that fails stops the threads and throws (NodeStart::Abandon). The phases that act on
// the node are NodeStart's (node_start.h); those that need only the options are the
// free functions below.
#include <algorithm>
#include <atomic>

#include "common/logging.h"
#include "common/net.h"
#include "common/observe.h"  // [observe]
#include "ps/node.h"
#include "ps/node_internal.h"
#include "ps/node_start.h"
#include "ps/scheduler.h"
#include "ps/test_disturbance.h"
#include "pskv/error.h"

namespace pskv {

using namespace std::chrono_literals;
using node_internal::SecsStr;

namespace {

/// The transport's configuration for a node of job `job` with identity `token`.
TransportConfig MakeTransportConfig(const Options& o, uint64_t job, uint64_t token) {
  TransportConfig tc;
  tc.secret = o.job_secret;
  tc.encrypt = o.encrypt;
  tc.job = job;
  tc.token = token;
  // A standby too: nodes address it as "the scheduler" once it took over.
  tc.scheduler = o.role == Role::kScheduler;
  tc.handshake_timeout = o.handshake_timeout;
  tc.keepalive_interval = o.heartbeat_interval;
  // As long as the heartbeat timeout: a peer whose receive queue is full (slow
  // handler, TCP back-pressure) must not look like a dead connection sooner.
  tc.keepalive_timeout = o.heartbeat_timeout;
  tc.shm = o.shm == "0"   ? TransportConfig::Shm::kOff
           : o.shm == "1" ? TransportConfig::Shm::kOn
                          : TransportConfig::Shm::kAuto;
  tc.shm_ring_bytes = static_cast<uint64_t>(o.shm_ring_bytes);
  tc.tcp_direct = o.tcp_direct;
  tc.spin = std::chrono::microseconds(o.spin_us);
  // The largest frame the protocol can legally carry (message.h): a value chunk,
  // a command body, or a frame of kMaxKeys keys. Anything larger is hostile.
  tc.max_frame = std::max({kChunkBytes, uint64_t{kMaxBody}, uint64_t{kMaxKeys} * 8}) + kHeaderSize;
  tc.max_pending_connections = o.max_pending_connections > 0
                                   ? o.max_pending_connections
                                   : 4 * (o.num_workers + o.num_servers + 1) + 64;
  return tc;
}

/// Once per process: a job without a secret is open to anyone who reaches its ports.
void WarnIfOpen(const Options& o) {
  if (!o.job_secret.empty()) return;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    PSKV_WARN(
        "this job has no secret: it is OPEN to anyone who can reach its ports, who can join "
        "it, read its values and change its weights. Start it with pskv-launch (which sets "
        "a secret), or set PSKV_JOB_SECRET or PSKV_JOB_SECRET_FILE on every node "
        "(docs/security.md)");
}

/// The address a worker or server binds and advertises.
std::string PickHost(const Options& o) {
  if (!o.node_host.empty()) return o.node_host;
  if (!o.interface.empty()) return InterfaceAddress(o.interface);
  if (IsLoopback(o.root_uri)) return "127.0.0.1";
  return DefaultAddress();
}

}  // namespace

void Node::Start() {
  if (started_) throw UsageError("Node::Start called twice");
  started_ = true;
  WarnIfOpen(options_);
  NodeStart phases(*this);
  phases.BindAndConnect(MakeTransportConfig(options_, job_, token_));
  phases.OpenStatusChannel();
  start_time_ = Clock::now();
  if (options_.verbose >= 1)
    PSKV_INFO(Tag() << ": bound " << host_ << ":" << port_ << ", job " << std::hex << job_);
  recv_thread_ = std::thread([this] { ReceiveLoop(); });
  timer_thread_ = std::thread([this] { TimerLoop(); });
  {
    std::unique_lock<std::mutex> lk(mu_);
    std::exception_ptr err = phases.AwaitNodeTable(lk);
    if (err && join_pending_ && !ready_ && !failure_ && refused_.empty()) {
      // Elastic workers: the scheduler took this registration as a join of the running
      // job, which admits it at the workers' next epoch barrier (EpochPartition).
      cv_.wait_for(lk, options_.op_timeout,
                   [&] { return ready_ || failure_ || !refused_.empty(); });
      err =
          ready_ || failure_ || !refused_.empty()
              ? phases.FailureLocked()
              : std::make_exception_ptr(TimeoutError(
                    Tag() + ": the running job did not admit this worker within " +
                    SecsStr(options_.register_timeout + options_.op_timeout) +
                    " (PSKV_REGISTER_TIMEOUT + PSKV_TIMEOUT): a worker joins an elastic job at "
                    "the workers' next epoch barrier (KVStore::EpochPartition); do they call it?"));
    }
    if (err) {
      lk.unlock();
      phases.Abandon(err, IsScheduler() && !ready_);
    }
    phases.StartWatching();
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
      barriers_.AwaitAdmission();
    else
      Barrier(kAllGroup, options_.register_timeout);
  } catch (...) {
    phases.Abandon(std::current_exception(), false);
  }
  status_.SetPhase(StatusPhase::kRunning);
}

void NodeStart::BindAndConnect(const TransportConfig& tc) {
  n_.transport_ = DisturbForTests(
      n_.transport_factory_ ? n_.transport_factory_(tc) : CreateTransport(kNodeTransport, tc),
      n_.fail_points_->Wire());
  if (n_.IsScheduler()) {
    std::string host = IsIPv4Literal(n_.options_.root_uri) ? n_.options_.root_uri : "0.0.0.0";
    n_.transport_->Bind(host, n_.options_.root_port);
    n_.host_ = n_.options_.root_uri;
    n_.port_ = n_.options_.root_port;
    n_.id_ = kSchedulerId;
    n_.rank_ = 0;
  } else if (n_.standby_) {
    // The standby binds its own address and follows the scheduler like a node.
    const std::string& at = n_.options_.standby_scheduler;
    n_.host_ = at.substr(0, at.rfind(':'));
    n_.port_ = std::stoi(at.substr(at.rfind(':') + 1));
    n_.transport_->Bind(IsIPv4Literal(n_.host_) ? n_.host_ : "0.0.0.0", n_.port_);
    n_.transport_->Connect(kSchedulerId,
                           n_.options_.root_uri + ":" + std::to_string(n_.options_.root_port),
                           kSchedulerToken);
  } else {
    n_.host_ = PickHost(n_.options_);
    std::string ep = n_.transport_->Bind(n_.host_, n_.options_.port);
    n_.port_ = std::stoi(ep.substr(ep.rfind(':') + 1));
    n_.transport_->Connect(kSchedulerId,
                           n_.options_.root_uri + ":" + std::to_string(n_.options_.root_port),
                           kSchedulerToken);
  }
}

void NodeStart::OpenStatusChannel() {
  std::string why;
  n_.status_.Configure(StatusChannel::Open(n_.options_.status_channel, &why), RoleName(n_.role()),
                       n_.host_);
  if (!why.empty()) PSKV_WARN(n_.Tag() << ": " << why);
  if (n_.role() == Role::kScheduler) {
    n_.status_.SetRank(n_.standby_ ? 1 : 0);
    // What the launcher needs to wait for this scheduler's verdict on a dead server.
    const auto detect = n_.options_.heartbeat_timeout.count() > 0
                            ? n_.options_.heartbeat_timeout + n_.options_.heartbeat_interval
                            : std::chrono::milliseconds(0);
    n_.status_.SetJob(n_.replicated() ? n_.options_.replicas : 0, detect.count());
  }
  n_.status_.SetPhase(StatusPhase::kRegistering);
}

std::exception_ptr NodeStart::AwaitNodeTable(std::unique_lock<std::mutex>& lk) {
  // Wait for the node table (the scheduler waits for all registrations).
  // A node that reached the scheduler waits a little longer than the scheduler's
  // own registration timeout, so that the scheduler's explanation arrives first.
  const bool sched = n_.IsScheduler();
  const auto deadline = n_.start_time_ + n_.options_.register_timeout;
  const auto grace = deadline + (sched ? 0ms : 5s);
  auto settled = [&] {
    if (n_.refused_.empty() && !sched) {
      std::string why = n_.transport_->RefusedBy(kSchedulerId);
      if (!why.empty()) n_.refused_ = why;
    }
    return n_.ready_ || n_.failure_ || !n_.refused_.empty();
  };
  // The transport's handshake outcome is polled, not signalled: re-check every
  // 100 ms until the deadline. The scheduler explains a timeout (FailureLocked);
  // a node that has not heard from the scheduler says every 10 s that it is still
  // waiting (a worker started by hand before, or without, its scheduler).
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  auto next_note = n_.start_time_ + 10s;
  WaitReporting(
      WaitPlan{left, std::chrono::milliseconds(0), 100ms},
      [&](Clock::time_point until) {
        if (n_.cv_.wait_until(lk, until, settled)) return true;
        const auto now = Clock::now();
        if (!sched && !n_.scheduler_seen_ && now >= next_note && now < deadline) {
          next_note += 10s;
          const auto waited =
              std::chrono::duration_cast<std::chrono::seconds>(now - n_.start_time_);
          lk.unlock();
          PSKV_INFO(n_.Tag() << ": waiting for the scheduler at " << n_.options_.root_uri << ":"
                             << n_.options_.root_port << " (" << waited.count() << " s of "
                             << SecsStr(n_.options_.register_timeout)
                             << ", PSKV_REGISTER_TIMEOUT); is it started? (pskv-launch starts it)");
          lk.lock();
        }
        return false;
      },
      [](std::chrono::milliseconds) {});
  if (!settled() && n_.scheduler_seen_) n_.cv_.wait_until(lk, grace, settled);
  return FailureLocked();
}

std::exception_ptr NodeStart::FailureLocked() const {
  const bool sched = n_.IsScheduler();
  if (sched && !n_.ready_ && !n_.scheduler_->mismatch().empty())
    return std::make_exception_ptr(ConfigError(n_.scheduler_->mismatch()));
  if (!n_.refused_.empty())
    return std::make_exception_ptr(
        ProtocolError(n_.Tag() + " was refused by the scheduler at " + n_.options_.root_uri + ":" +
                      std::to_string(n_.options_.root_port) + ": " + n_.refused_));
  if (n_.failure_) return n_.failure_;
  if (n_.ready_) return nullptr;
  std::string msg;
  if (sched) {
    msg = n_.scheduler_->RegistrationTimeout();
  } else if (!n_.scheduler_seen_) {
    msg = "scheduler at " + n_.options_.root_uri + ":" + std::to_string(n_.options_.root_port) +
          " not reachable after " + SecsStr(n_.options_.register_timeout) +
          " (check DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT, and that the scheduler runs)";
  } else {
    msg = "registered with the scheduler, but the job did not finish registration within " +
          SecsStr(n_.options_.register_timeout) + " (are all workers and servers started?)";
  }
  return std::make_exception_ptr(TimeoutError(msg));
}

void NodeStart::Abandon(std::exception_ptr err, bool refuse_registered) {
  n_.status_.Failed(ErrorKindName(err), ErrorMessage(err));
  if (refuse_registered) {
    // Tell the nodes that did register, so they fail now with the reason.
    std::string why;
    try {
      std::rethrow_exception(err);
    } catch (const std::exception& e) {
      why = e.what();
    }
    std::lock_guard<std::mutex> g(n_.mu_);
    n_.scheduler_->RefuseRegistered(why);
  }
  n_.StopThreads(200ms);
  n_.stopped_ = true;
  std::rethrow_exception(err);
}

void NodeStart::StartWatching() {
  // Watch for silence what heartbeats cover (the scheduler: every node; a node:
  // the scheduler) and for lost connections every peer this node sends to.
  const bool sched = n_.IsScheduler();
  std::vector<int> silent, connected;
  if (n_.standby_) {  // the standby watches the scheduler as the scheduler watches nodes
    n_.liveness_.Start({kSchedulerId}, {kSchedulerId}, true);
    return;
  }
  for (auto& [id, d] : n_.members_.nodes()) {
    if (id == n_.id_) continue;
    if (sched || id == kSchedulerId) silent.push_back(id);
    const bool talks = sched || id == kSchedulerId ||
                       (n_.role() == Role::kWorker ? IsServerId(id) : IsWorkerId(id));
    if (talks) connected.push_back(id);
  }
  // The scheduler, whose verdict the others wait for, also trusts a peer's closed
  // port (Liveness, "Gone"): a killed process is known dead at once.
  n_.liveness_.Start(silent, connected, sched);
}

}  // namespace pskv
