#include "transport/zmq/guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <optional>

#include "common/logging.h"
#include "pskv/error.h"
#include "transport/admission.h"
#include "transport/zmq/zmq_util.h"

namespace pskv {

ZmqGuard::ZmqGuard(void* ctx, const TransportConfig& cfg, const JobKeys& keys)
    : ctx_(ctx), cfg_(cfg), keys_(keys) {
  zap_ = zmq_socket(ctx_, ZMQ_REP);
  zmqu::SetInt(zap_, ZMQ_LINGER, 0);
  if (zmq_bind(zap_, "inproc://zeromq.zap.01") != 0) {
    const std::string err = zmqu::Err();
    zmq_close(zap_);
    throw IOError("cannot start the authentication handler: " + err);
  }
  thread_ = std::thread([this] { Loop(); });
}

void ZmqGuard::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

uint64_t ZmqGuard::NewSocket(int peer) {
  const uint64_t gen = ++next_gen_;
  std::lock_guard<std::mutex> g(mu_);
  monitor_gen_[peer] = gen;
  refused_.erase(peer);
  down_since_[peer] = Clock::now();
  lost_.erase(peer);
  gone_since_.erase(peer);
  return gen;
}

void ZmqGuard::Forget(int peer) {
  std::lock_guard<std::mutex> g(mu_);
  down_since_.erase(peer);
  refused_.erase(peer);
  lost_.erase(peer);
  gone_since_.erase(peer);
  monitor_gen_.erase(peer);  // its monitor is closed by the guard thread
}

ZmqGuard::Clock::time_point ZmqGuard::DownSince(int peer) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = down_since_.find(peer);
  return it == down_since_.end() ? Clock::time_point{} : it->second;
}

ZmqGuard::Clock::time_point ZmqGuard::GoneSince(int peer) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = gone_since_.find(peer);
  return it == gone_since_.end() ? Clock::time_point{} : it->second;
}

std::string ZmqGuard::RefusedBy(int peer) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = refused_.find(peer);
  return it == refused_.end() ? std::string() : it->second;
}

void ZmqGuard::Watch(int peer, uint64_t gen, const std::string& endpoint) {
  void* pair = zmq_socket(ctx_, ZMQ_PAIR);
  zmqu::SetInt(pair, ZMQ_LINGER, 0);
  if (zmq_connect(pair, endpoint.c_str()) != 0) {
    zmq_close(pair);
    return;  // monitoring is a diagnostic aid; the transport works without it
  }
  std::lock_guard<std::mutex> lk(mu_);
  new_monitors_.push_back({peer, gen, pair});
}

// mu_ held. A monitor of a socket that was replaced or dropped.
bool ZmqGuard::Retired(const Monitor& m) const {
  if (m.peer < 0) return false;
  auto it = monitor_gen_.find(m.peer);
  return it == monitor_gen_.end() || it->second != m.gen;
}

// The guard thread: ZAP requests and monitor events.
void ZmqGuard::Loop() {
  std::vector<Monitor> monitors;
  std::chrono::steady_clock::time_point router_events_since{};  // seams.monitor_lag
  while (!stop_) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& m : new_monitors_) monitors.push_back(m);
      new_monitors_.clear();
      std::erase_if(monitors, [&](const Monitor& m) {
        if (!Retired(m)) return false;
        zmq_close(m.sock);
        return true;
      });
    }
    std::vector<zmq_pollitem_t> items;
    items.push_back({zap_, 0, ZMQ_POLLIN, 0});
    for (auto& m : monitors) items.push_back({m.sock, 0, ZMQ_POLLIN, 0});
    const bool lagging = cfg_.seams.monitor_lag.count() > 0;
    if (zmq_poll(items.data(), static_cast<int>(items.size()), lagging ? 10 : 100) <= 0) continue;
    if (items[0].revents & ZMQ_POLLIN) HandleZap();
    for (size_t i = 1; i < items.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      if (lagging && monitors[i - 1].peer < 0) {
        const auto now = std::chrono::steady_clock::now();
        if (router_events_since == std::chrono::steady_clock::time_point{})
          router_events_since = now;
        if (now - router_events_since < cfg_.seams.monitor_lag) continue;
        router_events_since = {};
      }
      HandleEvents(monitors[i - 1]);
    }
  }
  for (auto& m : monitors) zmq_close(m.sock);
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& m : new_monitors_) zmq_close(m.sock);
    new_monitors_.clear();
  }
  zmq_close(zap_);
}

// ZAP (ZeroMQ RFC 27): version, request id, domain, address, identity,
// mechanism, credentials... -> version, request id, status, text, user, metadata.
void ZmqGuard::HandleZap() {
  std::vector<std::string> req;
  bool more = true;
  while (more && req.size() < 8) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, zap_, 0) < 0) {
      zmq_msg_close(&m);
      return;
    }
    req.push_back(zmqu::MsgString(&m));
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  if (more) zmqu::Drain(zap_);
  std::string status = "400", text = "not a pskv node", user;
  const std::string addr = req.size() > 3 ? req[3] : "?";
  if (req.size() >= 6) {
    const std::string& mech = req[5];
    if (mech == "PLAIN" && !cfg_.encrypt && req.size() >= 8) {
      uint64_t token = 0;
      std::string why;
      if (keys_.Verify(req[6], req[7], cfg_.token, cfg_.scheduler, &token, &why)) {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016" PRIx64, token);
        status = "200";
        text = "OK";
        user = hex;
      } else {
        text = why;
      }
    } else if (mech == "CURVE" && cfg_.encrypt && req.size() >= 7) {
      uint8_t want[32];
      zmq_z85_decode(want, keys_.curve_client_public().c_str());
      if (req[6].size() == 32 && std::memcmp(req[6].data(), want, 32) == 0) {
        status = "200";
        text = "OK";
        user = "member";
      } else {
        text = "wrong job secret (PSKV_JOB_SECRET / PSKV_JOB_SECRET_FILE differ)";
      }
    } else {
      text = mech == "NULL" ? "no credentials (not a pskv node of this job)"
                            : "security mechanism " + mech.substr(0, 16) +
                                  " differs (PSKV_ENCRYPT must be the same on every node)";
    }
  }
  if (status != "200")
    PSKV_LOG_LIMITED(limiter_, addr + "/" + text, "WARN",
                     "refused a connection from " << addr.substr(0, 64) << ": " << text);
  const std::string version = "1.0", request_id = req.size() > 1 ? req[1] : "";
  const std::string* parts[] = {&version, &request_id, &status, &text, &user};
  for (const std::string* p : parts) zmq_send(zap_, p->data(), p->size(), ZMQ_SNDMORE);
  zmq_send(zap_, "", 0, 0);  // metadata: none
}

// mu_ held. A connection was accepted: count it against its source
// address (EnforceCap acts on the counts once the monitor's queue is drained).
void ZmqGuard::Admit(int fd) {
  Pending p;
  p.since = std::chrono::steady_clock::now();
  struct stat st {};
  if (::fstat(fd, &st) == 0) p.ino = st.st_ino;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  char buf[INET6_ADDRSTRLEN] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
    else if (ss.ss_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
  }
  p.ip = buf;
  pending_[fd] = p;
}

// mu_ held; only right after the ROUTER's monitor queue was drained.
// Applies the node's AdmissionPolicy (transport/admission.h) to the pending
// connections: over a source's share or the cap, the oldest of the address that
// holds the most is closed.
// Why only then: Admit reads the socket behind an event's fd number when it
// handles the event, which may be long after ZeroMQ accepted it (this thread
// lags under load). If that connection was closed meanwhile, the number may
// already belong to a newer connection — a node's, past its handshake — and the
// entry describes that one. ZeroMQ queues a connection's "disconnected" event
// before it closes the descriptor, so once the queue is drained every such stale
// entry has been erased by its own later event; deciding earlier (in Admit, as
// before) could shut a legitimate connection down.
// `drained`: the queue is empty now, so every entry is what it says (verified);
// otherwise (a flood: 256 events in a row) only entries verified by an earlier
// drain, or admitted over a second ago, may be closed — the new ones count, but
// may be stale (a flood that never lets the queue drain is still bounded).
void ZmqGuard::EnforceCap(bool drained) {
  const auto old = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  for (auto& [f, q] : pending_) q.verified |= drained || q.since < old;
  const AdmissionPolicy policy(static_cast<size_t>(std::max(1, cfg_.max_pending_connections)));
  for (int round = 0; round < 4096 && !pending_.empty(); ++round) {  // bounded
    std::map<std::string, size_t> count;
    for (auto& [f, q] : pending_) count[q.ip]++;
    const std::optional<std::string> source = policy.Victim(count);
    if (!source) return;
    const bool alone = count[*source] > policy.per_source();
    const int victim = OldestOf(*source);
    if (victim < 0) return;  // none verified yet: after the next drain
    Evict(victim, alone ? "from " + *source + " alone" : "in all");
  }
}

// The oldest verified pending connection from `ip`; -1 if none.
int ZmqGuard::OldestOf(const std::string& ip) const {
  int fd = -1;
  auto t = std::chrono::steady_clock::time_point::max();
  for (auto& [f, q] : pending_)
    if (q.ip == ip && q.verified && q.since < t) {
      t = q.since;
      fd = f;
    }
  return fd;
}

// Closes a pending connection — only if its fd still is that socket (ZeroMQ
// may have closed it, and the number been reused, since the event was queued).
void ZmqGuard::Evict(int fd, const std::string& scope) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == it->second.ino)
    ::shutdown(fd, SHUT_RDWR);
  PSKV_LOG_LIMITED(limiter_, "connection-cap/" + it->second.ip, "WARN",
                   "closed a connection from "
                       << it->second.ip << " that had not authenticated: too many such "
                       << "connections " << scope
                       << " (PSKV_MAX_CONNECTIONS=" << cfg_.max_pending_connections << ")");
  pending_.erase(it);
}

// Handles the events queued on a monitor (at most 256 per call, so that the
// ZAP handler is never starved; ZeroMQ blocks its I/O thread while a
// monitor's queue is full, so these must be drained promptly). The ROUTER's
// connection cap is enforced once its queue is empty (EnforceCap says why), or
// after 256 events without an end (a flood of connections: bounding them then
// comes first).
void ZmqGuard::HandleEvents(const Monitor& mon) {
  int i = 0;
  while (i < 256 && HandleEvent(mon)) ++i;
  if (mon.peer < 0) {
    std::lock_guard<std::mutex> lk(mu_);
    EnforceCap(/*drained=*/i < 256);
  }
}

bool ZmqGuard::HandleEvent(const Monitor& mon) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, mon.sock, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&m);
    return false;
  }
  uint16_t event = 0;
  uint32_t value = 0;
  if (zmq_msg_size(&m) >= 6) {
    std::memcpy(&event, zmq_msg_data(&m), 2);
    std::memcpy(&value, static_cast<char*>(zmq_msg_data(&m)) + 2, 4);
  }
  const bool more = zmq_msg_more(&m);
  zmq_msg_close(&m);
  if (more) zmqu::Drain(mon.sock);
  const int fd = static_cast<int>(value);
  std::lock_guard<std::mutex> lk(mu_);
  if (mon.peer < 0) {
    if (event == ZMQ_EVENT_ACCEPTED)
      Admit(fd);
    else  // handshake done (either way), disconnected or closed: no longer pending
      pending_.erase(fd);
    return true;
  }
  if (Retired(mon)) return true;  // an event of a socket that was replaced
  if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
    refused_.erase(mon.peer);
    down_since_.erase(mon.peer);
  } else if (event == ZMQ_EVENT_CONNECTED) {  // its port accepted: something listens
    lost_.erase(mon.peer);
    gone_since_.erase(mon.peer);
  } else if (event == ZMQ_EVENT_CLOSED) {  // an attempt to (re)connect failed
    if (lost_.count(mon.peer)) gone_since_.emplace(mon.peer, std::chrono::steady_clock::now());
  } else if (event == ZMQ_EVENT_DISCONNECTED) {
    down_since_.emplace(mon.peer, std::chrono::steady_clock::now());
    lost_.insert(mon.peer);
  } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
    refused_[mon.peer] =
        keys_.open() ? "it refused this node's credentials: it runs another job (compare "
                       "PSKV_JOB_ID, DMLC_PS_ROOT_URI:PORT, DMLC_NUM_WORKER, DMLC_NUM_SERVER), or "
                       "it has a job secret and this node has none (PSKV_JOB_SECRET)"
                     : "it refused this node's credentials: its job secret differs "
                       "(PSKV_JOB_SECRET / PSKV_JOB_SECRET_FILE) or it runs another job";
  } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    refused_[mon.peer] =
        "the handshake failed: PSKV_ENCRYPT or the job secret's presence differs between "
        "the nodes, or it is not a pskv node";
  }
  return true;
}

}  // namespace pskv
