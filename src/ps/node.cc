#include "ps/node.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <random>

#include "common/logging.h"
#include "common/net.h"
#include "pskv/error.h"

namespace pskv {

namespace {
using namespace std::chrono_literals;
constexpr auto kRegisterRetry = 500ms;

double Secs(std::chrono::milliseconds d) {
  return static_cast<double>(d.count()) / 1000.0;
}
std::string SecsStr(std::chrono::milliseconds d) {
  char b[32];
  std::snprintf(b, sizeof b, "%g s", Secs(d));
  return b;
}
}  // namespace

Node::Node(Options options)
    : options_(std::move(options)),
      liveness_(options_.heartbeat_interval, options_.heartbeat_timeout),
      resender_(options_.resend_timeout,
                std::max<std::chrono::milliseconds>(options_.resend_timeout,
                                                    options_.heartbeat_interval * 2)) {
  options_.ValidateForDistributed();
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

std::string Node::PickHost() const {
  if (!options_.node_host.empty()) return options_.node_host;
  if (!options_.interface.empty()) return InterfaceAddress(options_.interface);
  if (IsLoopback(options_.root_uri)) return "127.0.0.1";
  return DefaultAddress();
}

std::string Node::Tag() const {
  if (role() == Role::kScheduler) return "scheduler";
  return RoleName(role()) + "[" + (rank_ >= 0 ? std::to_string(rank_) : "?") + "]";
}

std::string Node::NameLocked(int id) const {
  if (id == kSchedulerId)
    return "scheduler at " + options_.root_uri + ":" + std::to_string(options_.root_port);
  auto it = nodes_.find(id);
  std::string role = IsServerId(id) ? "server" : "worker";
  std::string n = role + "[" + std::to_string(RankOfId(id)) + "]";
  if (it != nodes_.end()) n += " at " + it->second.host + ":" + std::to_string(it->second.port);
  return n;
}

std::string Node::NodeName(int id) const {
  std::lock_guard<std::mutex> lk(mu_);
  return NameLocked(id);
}

std::vector<int> Node::ServerIds() const {
  std::vector<int> v;
  for (int r = 0; r < options_.num_servers; ++r) v.push_back(ServerId(r));
  return v;
}

std::vector<int> Node::WorkerIds() const {
  std::vector<int> v;
  for (int r = 0; r < options_.num_workers; ++r) v.push_back(WorkerId(r));
  return v;
}

int Node::GroupSize(int group) const {
  return ((group & kSchedulerGroup) ? 1 : 0) + ((group & kServerGroup) ? options_.num_servers : 0) +
         ((group & kWorkerGroup) ? options_.num_workers : 0);
}

std::vector<int> Node::GroupMembers(int group) const {
  std::vector<int> v;
  if (group & kSchedulerGroup) v.push_back(kSchedulerId);
  if (group & kServerGroup)
    for (int id : ServerIds()) v.push_back(id);
  if (group & kWorkerGroup)
    for (int id : WorkerIds()) v.push_back(id);
  return v;
}

std::exception_ptr Node::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

// ------------------------------------------------------------------ start

void Node::Start() {
  if (started_) throw UsageError("Node::Start called twice");
  started_ = true;
  TransportConfig tc;
  tc.secret = options_.job_secret;
  tc.encrypt = options_.encrypt;
  tc.job = job_;
  tc.token = token_;
  tc.handshake_timeout = options_.handshake_timeout;
  tc.keepalive_interval = options_.heartbeat_interval;
  tc.keepalive_timeout = options_.heartbeat_timeout / 2;
  // The largest frame the protocol can legally carry (message.h): a value chunk,
  // a command body, or a frame of kMaxKeys keys. Anything larger is hostile.
  tc.max_frame = std::max({kChunkBytes, uint64_t{kMaxBody}, uint64_t{kMaxKeys} * 8}) + kHeaderSize;
  tc.max_pending_connections = options_.max_pending_connections > 0
                                   ? options_.max_pending_connections
                                   : 4 * (options_.num_workers + options_.num_servers + 1) + 64;
  if (options_.job_secret.empty()) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      PSKV_WARN(
          "this job has no secret: it is OPEN to anyone who can reach its ports, who can join "
          "it, read its values and change its weights. Start it with pskv-launch (which sets "
          "a secret), or set PSKV_JOB_SECRET or PSKV_JOB_SECRET_FILE on every node "
          "(docs/security.md)");
  }
  transport_ = transport_factory_ ? transport_factory_(tc) : CreateTransport("zmq", tc);
  const bool sched = role() == Role::kScheduler;
  if (sched) {
    std::string host = IsIPv4Literal(options_.root_uri) ? options_.root_uri : "0.0.0.0";
    transport_->Bind(host, options_.root_port);
    host_ = options_.root_uri;
    port_ = options_.root_port;
    id_ = kSchedulerId;
    rank_ = 0;
  } else {
    host_ = PickHost();
    std::string ep = transport_->Bind(host_, options_.port);
    port_ = std::stoi(ep.substr(ep.rfind(':') + 1));
    transport_->Connect(kSchedulerId, options_.root_uri + ":" + std::to_string(options_.root_port));
  }
  start_time_ = Clock::now();
  if (options_.verbose >= 1)
    PSKV_INFO(Tag() << ": bound " << host_ << ":" << port_ << ", job " << std::hex << job_);
  recv_thread_ = std::thread([this] { ReceiveLoop(); });
  timer_thread_ = std::thread([this] { TimerLoop(); });

  // Wait for the node table (the scheduler waits for all registrations).
  // A node that reached the scheduler waits a little longer than the scheduler's
  // own registration timeout, so that the scheduler's explanation arrives first.
  const auto deadline = start_time_ + options_.register_timeout;
  const auto grace = deadline + (sched ? 0ms : 5s);
  {
    std::unique_lock<std::mutex> lk(mu_);
    auto settled = [&] {
      if (refused_.empty() && !sched) {
        std::string why = transport_->RefusedBy(kSchedulerId);
        if (!why.empty()) refused_ = why;
      }
      return ready_ || failure_ || !refused_.empty();
    };
    // Polls the transport's handshake outcome every 100 ms (bounded by deadline).
    while (!settled() && Clock::now() < deadline) cv_.wait_for(lk, 100ms);
    if (!settled() && scheduler_seen_) cv_.wait_until(lk, grace, settled);
    std::exception_ptr err;
    if (!refused_.empty()) {
      err = std::make_exception_ptr(
          ProtocolError(Tag() + " was refused by the scheduler at " + options_.root_uri + ":" +
                        std::to_string(options_.root_port) + ": " + refused_));
    } else if (failure_) {
      err = failure_;
    } else if (!ready_) {
      std::string msg;
      if (sched) {
        int s = 0, w = 0;
        for (auto& [t, d] : pending_) (d.role == static_cast<int>(Role::kServer) ? s : w)++;
        msg = "registration timed out: " + std::to_string(w) + " of " +
              std::to_string(options_.num_workers) + " workers and " + std::to_string(s) + " of " +
              std::to_string(options_.num_servers) + " servers registered after " +
              SecsStr(options_.register_timeout) + " (PSKV_REGISTER_TIMEOUT)";
      } else if (!scheduler_seen_) {
        msg = "scheduler at " + options_.root_uri + ":" + std::to_string(options_.root_port) +
              " not reachable after " + SecsStr(options_.register_timeout) +
              " (check DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT, and that the scheduler runs)";
      } else {
        msg = "registered with the scheduler, but the job did not finish registration within " +
              SecsStr(options_.register_timeout) + " (are all workers and servers started?)";
      }
      err = std::make_exception_ptr(TimeoutError(msg));
    }
    if (err) {
      lk.unlock();
      if (sched && !ready_) {
        // Tell the nodes that did register, so they fail now with the reason.
        std::string why;
        try {
          std::rethrow_exception(err);
        } catch (const std::exception& e) {
          why = e.what();
        }
        std::lock_guard<std::mutex> g(mu_);
        for (auto& [tok, tid] : temp_ids_) {
          try {
            SendControl(tid, Control::kRefuse, 0, why);
          } catch (...) {
          }
        }
      }
      StopThreads(200ms);
      stopped_ = true;
      std::rethrow_exception(err);
    }
    // Watch for silence what heartbeats cover (the scheduler: every node; a node:
    // the scheduler) and for lost connections every peer this node sends to.
    std::vector<int> silent, connected;
    for (auto& [id, d] : nodes_) {
      if (id == id_) continue;
      if (sched || id == kSchedulerId) silent.push_back(id);
      const bool talks = sched || id == kSchedulerId ||
                         (role() == Role::kWorker ? IsServerId(id) : IsWorkerId(id));
      if (talks) connected.push_back(id);
    }
    liveness_.Start(silent, connected);
  }
  if (options_.verbose >= 1) PSKV_INFO(Tag() << ": registered; id " << id_);
  try {
    Barrier(kAllGroup, options_.register_timeout);
  } catch (...) {
    StopThreads(200ms);
    stopped_ = true;
    throw;
  }
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
  std::exception_ptr err;
  // With failure detection on, a dead or unreachable node ends this wait; a
  // live one that is just slower (rank 0 evaluating, checkpointing) is waited for.
  const bool detecting = options_.heartbeat_timeout.count() > 0;
  try {
    BarrierImpl(kAllGroup, detecting ? 0ms : timeout, /*final=*/true);
  } catch (const TimeoutError& e) {
    err = std::current_exception();
    std::lock_guard<std::mutex> lk(mu_);
    if (role() != Role::kScheduler && ready_) {
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
    if (role() != Role::kScheduler && ready_) {
      try {
        SendControl(kSchedulerId, Control::kLeave, 0, reason);
      } catch (...) {
      }
    } else if (role() == Role::kScheduler && ready_) {
      for (auto& [id, d] : nodes_) {
        if (id == kSchedulerId) continue;
        try {
          SendControl(id, Control::kNodeFailed, kSchedulerId, "scheduler aborted: " + reason);
        } catch (...) {
        }
      }
    }
  }
  StopThreads(500ms);
  stopped_ = true;
}

// ------------------------------------------------------------------ sending

bool Node::IsResendable(Control c) const {
  return options_.resend && (c == Control::kData || c == Control::kBarrier ||
                             c == Control::kBarrierDone || c == Control::kNodeFailed);
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
  SendFrames(to, m);
}

// ------------------------------------------------------------------ receiving

void Node::ReceiveLoop() {
  Received in;
  while (!stop_) {
    bool got;
    try {
      got = transport_->Recv(&in, 100ms);
    } catch (const std::exception& e) {
      PSKV_LOG_LIMITED(limiter_, "recv", "ERROR", Tag() << ": " << e.what());
      continue;
    }
    if (!got) continue;
    Message m;
    try {
      m = Decode(std::move(in.frames));
    } catch (const std::exception& e) {
      PSKV_LOG_LIMITED(limiter_, in.peer_addr + "/decode", "WARN",
                       Tag() << ": dropped a malformed message from " << in.peer_addr << ": "
                             << std::string(e.what()).substr(0, 200));
      continue;
    }
    if (m.h.job != job_) {
      // Only an authenticated peer gets here; nothing is sent or connected back.
      PSKV_LOG_LIMITED(limiter_, in.peer_addr + "/job", "WARN",
                       Tag() << ": dropped a message from " << in.peer_addr
                             << ": it belongs to another job (PSKV_JOB_ID, DMLC_PS_ROOT_URI:PORT, "
                                "DMLC_NUM_WORKER or DMLC_NUM_SERVER differ)");
      continue;
    }
    if (options_.verbose >= 2) PSKV_INFO(Tag() << " recv " << Describe(m.h));
    try {
      Handle(std::move(m), in.peer);
    } catch (const std::exception& e) {
      PSKV_LOG_LIMITED(limiter_, in.peer_addr + "/handle", "WARN",
                       Tag() << ": error handling a message from " << in.peer_addr << ": "
                             << std::string(e.what()).substr(0, 200));
    }
  }
}

int Node::IdOfToken(uint64_t token) const {
  auto it = id_of_token_.find(token);
  return it == id_of_token_.end() ? 0 : it->second;
}

void Node::Handle(Message&& m, uint64_t token) {
  const auto c = static_cast<Control>(m.h.control);
  std::unique_lock<std::mutex> lk(mu_);
  // Who sent it: the node its connection's identity belongs to, never the header.
  int sender = IdOfToken(token);
  const bool sched = role() == Role::kScheduler;
  auto drop = [&](const char* why) {
    PSKV_LOG_LIMITED(limiter_, std::to_string(token) + why, "WARN",
                     Tag() << ": dropped a " << ControlName(c) << " message (header says node "
                           << m.h.sender << ", connection is "
                           << (sender ? NameLocked(sender) : std::string("not a node of the job"))
                           << "): " << why);
  };
  if (sender == 0) {
    // Before the node table exists only registration traffic can flow: to the
    // scheduler, kRegister (whose body must carry the connection's own token); from
    // it, the table, a refusal or "registration received".
    if (ready_ && !(sched && c == Control::kRegister)) return drop("unknown sender");
    if (sched) {
      if (c != Control::kRegister) return drop("not registered");
    } else {
      if (c != Control::kNodeTable && c != Control::kRefuse && c != Control::kHeartbeat &&
          c != Control::kAck)
        return drop("not registered yet");
      if (scheduler_token_ == 0) scheduler_token_ = token;
      if (token != scheduler_token_) return drop("not the scheduler");
      sender = kSchedulerId;
    }
  } else if (m.h.sender != sender && m.h.sender != 0) {
    // 0: the sender has not learned its id yet (its node table is in flight).
    return drop("header's sender differs from the connection's identity");
  }
  m.h.sender = sender;  // from here on, the bound identity is the sender
  // Control messages only from the node entitled to send them.
  switch (c) {
    case Control::kNodeTable:
    case Control::kBarrierDone:
    case Control::kNodeFailed:
    case Control::kRefuse:
      if (sender != kSchedulerId) return drop("only the scheduler sends this");
      break;
    case Control::kRegister:
    case Control::kBarrier:
    case Control::kLeave:
      if (!sched) return drop("only the scheduler receives this");
      break;
    case Control::kData: {
      const bool ok = role() == Role::kServer   ? IsWorkerId(sender)
                      : role() == Role::kWorker ? IsServerId(sender)
                                                : false;
      if (!ok) return drop("data between these roles is not part of the protocol");
      break;
    }
    default:
      break;
  }
  liveness_.Heard(sender);
  if (sender == kSchedulerId) scheduler_seen_ = true;

  if (c == Control::kAck) {
    resender_.Ack(sender, m.h.timestamp);
    return;
  }
  if (m.h.seq) {
    // Acknowledge, then drop duplicates (a resent message whose ack was lost).
    SendControl(sender, Control::kAck, 0, {}, m.h.seq);
    if (resender_.Duplicate(sender, m.h.seq)) return;
  }
  switch (c) {
    case Control::kData: {
      if (!ready_) return;
      if (options_.drop_percent > 0) {  // PS_DROP_MSG (tests only)
        drop_state_ ^= drop_state_ << 13;
        drop_state_ ^= drop_state_ >> 7;
        drop_state_ ^= drop_state_ << 17;
        if (static_cast<int>(drop_state_ % 100) < options_.drop_percent) return;
      }
      lk.unlock();
      // Run the handler right here: one hop less per message than a separate
      // customer thread, and messages are still handled one at a time, in order.
      if (data_handler_) {
        liveness_.BusyBegin();  // time spent here is not the peers' silence
        try {
          data_handler_(std::move(m));
        } catch (const std::exception& e) {
          PSKV_ERROR(Tag() << ": data handler failed: " << e.what());
        }
        liveness_.BusyEnd();
      }
      return;
    }
    case Control::kRegister:
      if (role() == Role::kScheduler) {
        auto ds = DecodeNodes(m.body);
        if (ds.size() != 1 || ds[0].token != token) return drop("registration for another identity");
        HandleRegister(m);
      }
      return;
    case Control::kNodeTable:
      if (role() != Role::kScheduler) HandleNodeTable(m);
      return;
    case Control::kRefuse:
      refused_ = m.body.empty() ? "no reason given" : m.body;
      cv_.notify_all();
      return;
    case Control::kBarrier:
      if (role() == Role::kScheduler) HandleBarrier(sender, m.h.head);
      return;
    case Control::kBarrierDone:
      barrier_gen_[m.h.head]++;
      cv_.notify_all();
      return;
    case Control::kHeartbeat:
      if (role() == Role::kScheduler && sender != kSchedulerId && ready_)
        SendControl(sender, Control::kHeartbeat);
      return;
    case Control::kNodeFailed: {
      std::string reason = m.body;
      lk.unlock();
      Fail(std::make_exception_ptr(NodeFailure(reason)));
      return;
    }
    case Control::kAck:  // handled above
      return;
    case Control::kLeave:
      if (role() == Role::kScheduler && !finished_) {
        std::string who = NameLocked(sender);
        lk.unlock();
        FailNode(sender, who + " exited before the job finished: " + m.body);
      }
      return;
  }
}

void Node::HandleRegister(const Message& m) {
  std::vector<NodeDesc> ds = DecodeNodes(m.body);
  if (ds.size() != 1) throw ProtocolError("registration must describe exactly one node");
  NodeDesc d = ds[0];
  if (d.role == static_cast<int>(Role::kScheduler))
    throw ProtocolError("a second scheduler tried to register");
  auto reply_to = [&](int tid) {
    if (!temp_ids_.count(d.token)) {
      transport_->Connect(tid, d.host + ":" + std::to_string(d.port));
      temp_ids_[d.token] = tid;
    }
  };
  if (ready_) {
    // Already complete: a retry of a registered node (its table was lost) gets the
    // table again; anyone else is refused.
    for (auto& [id, n] : nodes_) {
      if (n.token == d.token) {
        SendControl(id, Control::kNodeTable, 0, EncodeNodes([&] {
                      std::vector<NodeDesc> v;
                      for (auto& [i, x] : nodes_) v.push_back(x);
                      return v;
                    }()));
        return;
      }
    }
    int tid = next_temp_id_++;
    reply_to(tid);
    SendControl(tid, Control::kRefuse, 0,
                "the job already has all its " + std::to_string(options_.num_workers) +
                    " workers and " + std::to_string(options_.num_servers) +
                    " servers (is this node from another job? set PSKV_JOB_ID to tell jobs apart)");
    return;
  }
  if (!temp_ids_.count(d.token)) {
    int same_role = 0;
    for (auto& [t, x] : pending_) same_role += x.role == d.role;
    const int limit =
        d.role == static_cast<int>(Role::kServer) ? options_.num_servers : options_.num_workers;
    int tid = next_temp_id_++;
    reply_to(tid);
    if (same_role >= limit) {
      SendControl(tid, Control::kRefuse, 0,
                  "too many " + RoleName(static_cast<Role>(d.role)) + "s: the job expects " +
                      std::to_string(limit) + " (DMLC_NUM_" +
                      (d.role == static_cast<int>(Role::kServer) ? "SERVER" : "WORKER") + ")");
      return;
    }
    pending_[d.token] = d;
    if (options_.verbose >= 1)
      PSKV_INFO("scheduler: " << RoleName(static_cast<Role>(d.role)) << " at " << d.host << ":"
                              << d.port << " registered (" << pending_.size() << " of "
                              << options_.num_servers + options_.num_workers << ")");
  }
  SendControl(temp_ids_[d.token], Control::kHeartbeat);  // "registration received"
  if (static_cast<int>(pending_.size()) == options_.num_servers + options_.num_workers)
    SchedulerCompleteRegistration();
}

void Node::SchedulerCompleteRegistration() {
  std::vector<NodeDesc> servers, workers;
  for (auto& [t, d] : pending_)
    (d.role == static_cast<int>(Role::kServer) ? servers : workers).push_back(d);
  // Deterministic ranks: by the launcher's rank hint (DMLC_TASK_ID), then address.
  auto order = [](const NodeDesc& a, const NodeDesc& b) {
    auto ha = a.rank_hint < 0 ? INT64_MAX : a.rank_hint,
         hb = b.rank_hint < 0 ? INT64_MAX : b.rank_hint;
    return std::tie(ha, a.host, a.port, a.token) < std::tie(hb, b.host, b.port, b.token);
  };
  std::sort(servers.begin(), servers.end(), order);
  std::sort(workers.begin(), workers.end(), order);
  std::vector<NodeDesc> all;
  for (size_t r = 0; r < servers.size(); ++r) {
    servers[r].rank = static_cast<int>(r);
    servers[r].id = ServerId(static_cast<int>(r));
    all.push_back(servers[r]);
  }
  for (size_t r = 0; r < workers.size(); ++r) {
    workers[r].rank = static_cast<int>(r);
    workers[r].id = WorkerId(static_cast<int>(r));
    all.push_back(workers[r]);
  }
  NodeDesc me;
  me.id = kSchedulerId;
  me.role = static_cast<int>(Role::kScheduler);
  me.host = host_;
  me.port = port_;
  me.token = token_;
  all.push_back(me);
  for (auto& d : all) {
    nodes_[d.id] = d;
    id_of_token_[d.token] = d.id;
    if (d.id == kSchedulerId) continue;
    transport_->Disconnect(temp_ids_[d.token]);
    transport_->Connect(d.id, d.host + ":" + std::to_string(d.port));
  }
  temp_ids_.clear();
  std::string table = EncodeNodes(all);
  for (auto& d : all)
    if (d.id != kSchedulerId) SendControl(d.id, Control::kNodeTable, 0, table);
  ready_ = true;
  if (options_.verbose >= 1) PSKV_INFO("scheduler: all " << all.size() - 1 << " nodes registered");
  cv_.notify_all();
}

void Node::HandleNodeTable(const Message& m) {
  if (ready_) return;  // a resent table
  std::vector<NodeDesc> all = DecodeNodes(m.body);
  const NodeDesc* self = nullptr;
  for (auto& d : all)
    if (d.token == token_) self = &d;
  if (!self) throw ProtocolError("node table without this node");
  for (auto& d : all)
    if (d.id == kSchedulerId && d.token != scheduler_token_)
      throw ProtocolError("node table not sent by the scheduler it names");
  id_ = self->id;
  rank_ = self->rank;
  for (auto& d : all) {
    nodes_[d.id] = d;
    id_of_token_[d.token] = d.id;
    if (d.id == kSchedulerId || d.id == id_) continue;
    const bool talks = role() == Role::kWorker ? IsServerId(d.id) : IsWorkerId(d.id);
    if (talks) transport_->Connect(d.id, d.host + ":" + std::to_string(d.port));
  }
  ready_ = true;
  cv_.notify_all();
}

void Node::HandleBarrier(int sender, int group) {
  if (group <= 0 || group > kAllGroup)
    throw ProtocolError("bad barrier group " + std::to_string(group));
  // Count distinct nodes, not requests (a duplicated message must not count twice).
  auto& arrived = barrier_arrived_[group];
  arrived.insert(sender);
  if (static_cast<int>(arrived.size()) < GroupSize(group)) {
    // The barrier of all nodes is the final one: servers wait there from the
    // start; it stalls only once a worker has finished.
    if (group == kAllGroup && !IsWorkerId(sender)) return;
    if (!barrier_stall_.count(group)) {
      const auto now = Clock::now();
      barrier_stall_[group] = Stall{now, now + options_.stall_warning};
    }
    return;
  }
  arrived.clear();
  barrier_stall_.erase(group);
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
  if (role() == Role::kScheduler) {
    HandleBarrier(kSchedulerId, group);
  } else {
    SendControl(kSchedulerId, Control::kBarrier, group);
  }
  auto done = [&] { return barrier_gen_[group] != gen || failure_ != nullptr; };
  // Bounded by `timeout` (0: none — then by failure detection); says what it is
  // waiting for every PSKV_STALL_WARNING, backing off.
  const auto start = Clock::now();
  const auto deadline = timeout.count() > 0 ? start + timeout : Clock::time_point::max();
  // The scheduler and servers wait at the final barrier for the whole job: that
  // is no stall. A worker there has finished and waits for the others.
  const bool quiet = role() == Role::kScheduler || (final && role() != Role::kWorker);
  auto warn_at = options_.stall_warning.count() > 0 && !quiet ? start + options_.stall_warning
                                                              : Clock::time_point::max();
  while (!done()) {
    const auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError(Tag() + ": barrier timed out after " + SecsStr(timeout) +
                         " (some nodes did not reach it; the scheduler's log names them; raise "
                         "PSKV_TIMEOUT if they are just slow)");
    if (now >= warn_at) {
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start);
      if (final)
        PSKV_WARN(Tag() << ": finished; waiting for the rest of the job for " << SecsStr(waited)
                        << " (the scheduler's log names the workers still running)");
      else
        PSKV_WARN(Tag() << ": waiting at a barrier for " << SecsStr(waited)
                        << " (the scheduler's log names the nodes it waits for)");
      warn_at = now + waited;  // back off: 1x, 2x, 4x ...
    }
    cv_.wait_until(lk, std::min(deadline, warn_at));
  }
  if (barrier_gen_[group] == gen && failure_) std::rethrow_exception(failure_);
}

// ------------------------------------------------------------------ failures

void Node::Fail(std::exception_ptr e) {
  liveness_.Stop();
  std::vector<FailureHandler> handlers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failure_ || finished_) return;
    failure_ = e;
    handlers = failure_handlers_;
  }
  cv_.notify_all();
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    PSKV_ERROR(Tag() << ": " << ex.what());
  }
  for (auto& h : handlers) h(e);
}

void Node::FailNode(int dead_id, const std::string& reason) {
  resender_.Forget(dead_id);
  if (role() == Role::kScheduler) {
    std::lock_guard<std::mutex> lk(mu_);
    // A departed node's barrier arrivals no longer count.
    for (auto& [group, arrived] : barrier_arrived_) arrived.erase(dead_id);
    for (auto& [id, d] : nodes_) {
      if (id == kSchedulerId || id == dead_id) continue;
      try {
        SendControl(id, Control::kNodeFailed, dead_id, reason);
      } catch (...) {
      }
    }
  }
  Fail(std::make_exception_ptr(NodeFailure(reason)));
}

void Node::TimerLoop() {
  auto next_hb = Clock::now();
  auto next_reg = Clock::now();
  auto nap = std::min<std::chrono::milliseconds>(50ms, options_.resend_timeout);
  while (!stop_) {
    std::this_thread::sleep_for(nap);
    const auto now = Clock::now();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) break;
      try {
        if (role() != Role::kScheduler && !ready_ && refused_.empty() && now >= next_reg) {
          NodeDesc d;
          d.role = static_cast<int>(role());
          d.host = host_;
          d.port = port_;
          d.token = token_;
          d.rank_hint = options_.rank_hint;
          SendControl(kSchedulerId, Control::kRegister, 0, EncodeNodes({d}));
          next_reg = now + kRegisterRetry;
        }
        if (role() != Role::kScheduler && ready_ && !finished_ &&
            options_.heartbeat_interval.count() > 0 && now >= next_hb) {
          SendControl(kSchedulerId, Control::kHeartbeat);
          next_hb = now + options_.heartbeat_interval;
        }
      } catch (const std::exception& e) {
        PSKV_LOG_LIMITED(limiter_, "timer", "WARN", Tag() << ": " << e.what());
      }
      if (role() == Role::kScheduler && ready_ && !finished_) WarnStalledBarriers(now);
    }
    // Failure detection: silence (heartbeats) and lost connections.
    auto [dead, why] = liveness_.Check(now, *transport_, [this](int id) { return NodeName(id); });
    if (dead) {
      FailNode(dead, role() == Role::kScheduler || dead == kSchedulerId ? why : Tag() + " " + why);
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

void Node::WarnStalledBarriers(Clock::time_point now) {
  if (options_.stall_warning.count() <= 0) return;
  for (auto& [group, st] : barrier_stall_) {
    if (now < st.next_warning) continue;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - st.since);
    st.next_warning = now + std::max(waited, options_.stall_warning);  // back off: x2
    const auto& arrived = barrier_arrived_[group];
    std::string missing;
    int n = 0;
    for (int id : GroupMembers(group)) {
      if (arrived.count(id) || id == kSchedulerId) continue;
      if (group == kAllGroup && !IsWorkerId(id)) continue;
      if (n++ < 8) missing += (missing.empty() ? "" : ", ") + NameLocked(id);
    }
    if (n > 8) missing += " and " + std::to_string(n - 8) + " more";
    PSKV_WARN("scheduler: " << (group == kAllGroup ? std::string("end of the job")
                                                    : "barrier of group " + std::to_string(group))
                                       << ": waiting for " << missing << " for "
                                       << SecsStr(waited) << " (PSKV_STALL_WARNING)");
  }
}

}  // namespace pskv
