#include "transport/zmq/zmq_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "common/buffer_pool.h"
#include "common/logging.h"
#include "common/rate_limit.h"
#include "pskv/error.h"
#include "transport/admission.h"
#include "transport/auth.h"

// Threads of this backend:
//  * the Recv caller (the node's receive thread) owns the ROUTER socket;
//  * senders use a peer's DEALER under that peer's mutex;
//  * the guard thread owns the ZAP handler socket and the monitor sockets: it
//    authenticates every incoming connection during ZeroMQ's handshake (so a
//    stranger's bytes never become messages), counts connections that have not
//    finished the handshake (per source address) and closes the excess, and
//    notes which peers refused us and which connections are down.
// Each outgoing socket has its own monitor, tagged with a generation: when the
// socket is replaced or dropped, its monitor is closed by the guard thread and
// its late events are ignored.
// Lock order: peers_mu_ before a Peer's mu before guard_mu_.

namespace pskv {

namespace {

using namespace std::chrono_literals;

std::string ZmqErr() {
  return zmq_strerror(zmq_errno());
}

void SetInt(void* sock, int opt, int v) {
  zmq_setsockopt(sock, opt, &v, sizeof v);
}
void SetStr(void* sock, int opt, const std::string& v) {
  zmq_setsockopt(sock, opt, v.data(), v.size());
}

// ZeroMQ's free callback: drops our reference to the frame's owner.
void ReleaseOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

// A connecting socket's routing id: 0x01 (a routing id may not start with a
// zero byte), its node's 8-byte token, then 4 bytes numbering the connection
// (one per Connect: the receiver's Received::conn) and 4 numbering the socket (a
// connection's socket is replaced after a failed send). Unique per socket: with
// ROUTER_HANDOVER, a connection whose routing id is
// already in use takes it over and the older connection's later messages are
// dropped by the ROUTER without a word (ZeroMQ 4.3) — with the token alone, a
// node's second connection to one peer (the scheduler's temporary and final
// connections to a node, a lingering replaced socket) whose handshake finished
// last silenced the other for good (a server that never got its node table).
// Handover now only lets a socket's own reconnection replace its dead connection.
constexpr size_t kRoutingIdSize = 17;
std::string RoutingId(uint64_t token, uint32_t conn, uint32_t socket) {
  std::string s(kRoutingIdSize, '\1');
  std::memcpy(&s[1], &token, 8);
  std::memcpy(&s[9], &conn, 4);
  std::memcpy(&s[13], &socket, 4);
  return s;
}

std::string MsgString(zmq_msg_t* m) {
  return std::string(static_cast<const char*>(zmq_msg_data(m)), zmq_msg_size(m));
}

// Receives the remaining parts of a multipart message and drops them.
void Drain(void* sock) {
  int more = 1;
  size_t len = sizeof more;
  zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len);
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, 0) < 0 && zmq_errno() != EINTR) {
      zmq_msg_close(&m);
      return;
    }
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
}

class ZmqTransport final : public Transport {
 public:
  ZmqTransport(const TransportConfig& cfg, int wake_fd)
      : cfg_(cfg), keys_(cfg.secret, cfg.job), wake_fd_(wake_fd) {
    if (cfg_.encrypt && keys_.open())
      throw ConfigError("encryption (PSKV_ENCRYPT=1) needs a job secret (PSKV_JOB_SECRET)");
    if (cfg_.token == 0) throw UsageError("transport needs a non-zero identity token");
    ctx_ = zmq_ctx_new();
    if (!ctx_) throw IOError("zmq_ctx_new failed: " + ZmqErr());
    zmq_ctx_set(ctx_, ZMQ_MAX_SOCKETS, 65536);
    zmq_ctx_set(ctx_, ZMQ_IO_THREADS, 1);
    // The ZAP handler must exist before any socket starts a handshake.
    zap_ = zmq_socket(ctx_, ZMQ_REP);
    SetInt(zap_, ZMQ_LINGER, 0);
    if (zmq_bind(zap_, "inproc://zeromq.zap.01") != 0)
      throw IOError("cannot start the authentication handler: " + ZmqErr());
    guard_ = std::thread([this] { GuardLoop(); });
  }
  ~ZmqTransport() override { Close(0ms); }

  std::string Bind(const std::string& host, int port) override {
    if (router_) throw UsageError("transport already bound");
    router_ = zmq_socket(ctx_, ZMQ_ROUTER);
    SetInt(router_, ZMQ_RCVHWM, cfg_.max_queued_messages);
    SetInt(router_, ZMQ_LINGER, 0);
    SetInt(router_, ZMQ_ROUTER_HANDOVER, 1);  // a reconnecting peer takes its id back
    SetInt(router_, ZMQ_HANDSHAKE_IVL,
           static_cast<int>(std::clamp<int64_t>(cfg_.handshake_timeout.count(), 1, INT32_MAX)));
    int64_t maxmsg = static_cast<int64_t>(cfg_.max_frame);
    zmq_setsockopt(router_, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    SetStr(router_, ZMQ_ZAP_DOMAIN, "pskv");
    if (cfg_.encrypt) {
      SetInt(router_, ZMQ_CURVE_SERVER, 1);
      SetStr(router_, ZMQ_CURVE_SECRETKEY, keys_.curve_server_secret());
    } else {
      SetInt(router_, ZMQ_PLAIN_SERVER, 1);
    }
    // Count connections from their acceptance until they prove themselves.
    const std::string mon = "inproc://pskv-monitor-router";
    zmq_socket_monitor(router_, mon.c_str(),
                       ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED |
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL);
    AddMonitor(-1, 0, mon);
    std::string addr = "tcp://" + host + ":" + (port > 0 ? std::to_string(port) : "*");
    if (zmq_bind(router_, addr.c_str()) != 0) {
      std::string err = ZmqErr();
      zmq_close(router_);
      router_ = nullptr;
      throw IOError("cannot bind " + addr + ": " + err +
                    (port > 0 ? " (is another job using this port?)" : ""));
    }
    char buf[256];
    size_t len = sizeof buf;
    zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, buf, &len);
    std::string ep(buf);  // tcp://127.0.0.1:45678
    auto colon = ep.rfind(':');
    return host + ":" + ep.substr(colon + 1);
  }

  void Connect(int peer, const std::string& endpoint, uint64_t token) override {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    auto it = peers_.find(peer);
    if (it != peers_.end()) {
      if (it->second->endpoint == endpoint && it->second->token == token) return;
      CloseSocket(it->second->sock, 0);
      peers_.erase(it);
    }
    auto p = std::make_unique<Peer>();
    p->endpoint = endpoint;
    p->token = token;
    p->conn = ++next_conn_;
    p->sock = NewDealer(peer, endpoint, token, p->conn);
    if (cfg_.test.connect_pause.count() > 0) std::this_thread::sleep_for(cfg_.test.connect_pause);
    peers_.emplace(peer, std::move(p));
  }

  void Disconnect(int peer) override {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    CloseSocket(it->second->sock, kDisconnectLinger);  // what is queued may still go out
    peers_.erase(it);
    std::lock_guard<std::mutex> g(guard_mu_);
    down_since_.erase(peer);
    refused_.erase(peer);
    monitor_gen_.erase(peer);  // its monitor is closed by the guard thread
  }

  void Send(int peer, std::vector<Frame> frames) override {
    std::shared_lock<std::shared_mutex> lk(peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) throw IOError("no connection to node " + std::to_string(peer));
    Peer& p = *it->second;
    std::lock_guard<std::mutex> plk(p.mu);
    for (size_t i = 0; i < frames.size(); ++i) {
      Frame& f = frames[i];
      zmq_msg_t msg;
      if (f.gathered() && f.size >= 256) {
        // ZeroMQ sends contiguous messages: the pieces are packed into a pooled buffer
        // here (the one copy the shared-memory ring and direct TCP avoid), sent without
        // another copy.
        std::shared_ptr<char> buf = gather_pool_.Get(f.size);
        char* data = buf.get();
        f.CopyTo(data);
        auto* hint = new std::shared_ptr<const void>(std::move(buf));
        zmq_msg_init_data(&msg, data, f.size, ReleaseOwner, hint);
        f = Frame{};  // the pieces' owner is released now
      } else if (f.owner && f.size >= 256) {
        auto* hint = new std::shared_ptr<const void>(std::move(f.owner));
        zmq_msg_init_data(&msg, const_cast<char*>(f.data), f.size, ReleaseOwner, hint);
      } else {
        zmq_msg_init_size(&msg, f.size);
        if (f.size) f.CopyTo(static_cast<char*>(zmq_msg_data(&msg)));
      }
      int flags = (i + 1 < frames.size() ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT;
      while (zmq_msg_send(&msg, p.sock, flags) < 0) {
        if (zmq_errno() == EINTR) continue;
        std::string err = ZmqErr();
        zmq_msg_close(&msg);
        if (i > 0) {
          // Part of this message is queued: the next message would be glued to
          // it. A fresh socket (same peer, same credentials) starts clean.
          CloseSocket(p.sock, 0);
          p.sock = NewDealer(peer, p.endpoint, p.token, p.conn);
        }
        throw IOError("send to node " + std::to_string(peer) + " at " + p.endpoint +
                      " failed: " + err);
      }
    }
  }

  bool Recv(Received* in, std::chrono::milliseconds timeout) override {
    in->frames.clear();
    in->peer = 0;
    in->conn = 0;
    in->peer_addr.clear();
    if (!router_) {  // not bound: nothing can arrive
      std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds(100)));
      return false;
    }
    if (timeout.count() > 0) {
      zmq_pollitem_t items[2] = {{router_, 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
      int rc = zmq_poll(items, wake_fd_ >= 0 ? 2 : 1, static_cast<long>(timeout.count()));
      if (rc <= 0 || !(items[0].revents & ZMQ_POLLIN)) return false;
      return RecvOne(in);
    }
    // A look without a poll (a syscall): ZMQ_EVENTS processes ZeroMQ's pending
    // commands and says whether a message waits. A message dropped (malformed,
    // identity mismatch) does not end the look: the caller may sleep on ZMQ_FD
    // next, which would not wake it for messages already queued behind it.
    for (int i = 0; i < 256; ++i) {
      int ev = 0;
      size_t len = sizeof ev;
      if (zmq_getsockopt(router_, ZMQ_EVENTS, &ev, &len) != 0 || !(ev & ZMQ_POLLIN)) return false;
      if (RecvOne(in)) return true;
    }
    return false;
  }

  // Receives the message that waits; false if it was dropped.
  bool RecvOne(Received* in) {
    in->frames.clear();
    // The ROUTER's first part is the routing id: the connecting node's token,
    // fixed for the connection at its handshake.
    zmq_msg_t rid;
    zmq_msg_init(&rid);
    while (zmq_msg_recv(&rid, router_, 0) < 0) {
      if (zmq_errno() == EINTR) continue;
      std::string err = ZmqErr();
      zmq_msg_close(&rid);
      throw IOError("receive failed: " + err);
    }
    std::string id = MsgString(&rid);
    const bool more = zmq_msg_more(&rid);
    zmq_msg_close(&rid);
    if (!more) return false;
    for (;;) {
      auto* msg = new zmq_msg_t;
      zmq_msg_init(msg);
      while (zmq_msg_recv(msg, router_, 0) < 0) {
        if (zmq_errno() == EINTR) continue;
        std::string err = ZmqErr();
        zmq_msg_close(msg);
        delete msg;
        throw IOError("receive failed: " + err);
      }
      const bool last = !zmq_msg_more(msg);
      if (in->frames.empty() && !Identify(msg, id, in)) {
        zmq_msg_close(msg);
        delete msg;
        if (!last) Drain(router_);
        return false;
      }
      in->frames.push_back(Frame::Of(zmq_msg_data(msg), zmq_msg_size(msg),
                                     std::shared_ptr<const void>(msg, [](const void* m) {
                                       auto* zm = static_cast<zmq_msg_t*>(const_cast<void*>(m));
                                       zmq_msg_close(zm);
                                       delete zm;
                                     })));
      if (last) break;
    }
    return true;
  }

  std::chrono::steady_clock::time_point DownSince(int peer) override {
    std::lock_guard<std::mutex> lk(guard_mu_);
    auto it = down_since_.find(peer);
    return it == down_since_.end() ? std::chrono::steady_clock::time_point{} : it->second;
  }

  std::string RefusedBy(int peer) override {
    std::lock_guard<std::mutex> lk(guard_mu_);
    auto it = refused_.find(peer);
    return it == refused_.end() ? std::string() : it->second;
  }

  void Close(std::chrono::milliseconds linger) override {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    if (!ctx_) return;
    for (auto& [id, p] : peers_) CloseSocket(p->sock, static_cast<int>(linger.count()));
    peers_.clear();
    if (router_) CloseSocket(router_, 0);
    router_ = nullptr;
    stop_guard_ = true;
    if (guard_.joinable()) guard_.join();
    zmq_ctx_term(ctx_);
    ctx_ = nullptr;
  }

  std::string Name() const override { return cfg_.encrypt ? "zmq+curve" : "zmq"; }

  int ReceiveFd() {
    if (!router_) return -1;
    int fd = -1;
    size_t len = sizeof fd;
    return zmq_getsockopt(router_, ZMQ_FD, &fd, &len) == 0 ? fd : -1;
  }

 private:
  static constexpr int kDisconnectLinger = 1000;  // ms

  struct Peer {
    void* sock = nullptr;
    std::string endpoint;
    uint64_t token = 0;  // the identity the peer must prove
    uint64_t conn = 0;   // numbers this connection (RoutingId), kept when sock is replaced
    std::mutex mu;
  };
  struct Monitor {
    int peer;      // -1: the ROUTER
    uint64_t gen;  // of the socket it watches (monitor_gen_)
    void* sock;
  };
  // A connection accepted by the ROUTER that has not finished the handshake.
  struct Pending {
    std::string ip;
    ino_t ino = 0;          // the socket's inode: tells it from a later file with its fd number
    bool verified = false;  // seen at a drained queue: describes that connection (EnforceCap)
    std::chrono::steady_clock::time_point since;
  };

  // A DEALER to `endpoint` presenting this node's credentials for `to`, with a
  // monitor of its own. Caller holds peers_mu_ (shared suffices) or the peer's mu.
  void* NewDealer(int peer, const std::string& endpoint, uint64_t to, uint64_t conn) {
    void* s = zmq_socket(ctx_, ZMQ_DEALER);
    if (!s) throw IOError("cannot create a socket: " + ZmqErr());
    SetInt(s, ZMQ_SNDHWM, 0);  // never block: a dead peer is detected by heartbeats
    SetInt(s, ZMQ_LINGER, 0);
    SetInt(s, ZMQ_RECONNECT_IVL, 100);
    SetInt(s, ZMQ_RECONNECT_IVL_MAX, 2000);
    SetStr(
        s, ZMQ_ROUTING_ID,
        RoutingId(cfg_.token, static_cast<uint32_t>(conn), static_cast<uint32_t>(++next_socket_)));
    if (cfg_.keepalive_interval.count() > 0) {  // ZMTP PING/PONG: half-open connections
      SetInt(s, ZMQ_HEARTBEAT_IVL, static_cast<int>(cfg_.keepalive_interval.count()));
      SetInt(s, ZMQ_HEARTBEAT_TIMEOUT, static_cast<int>(cfg_.keepalive_timeout.count()));
      SetInt(s, ZMQ_HEARTBEAT_TTL, static_cast<int>(cfg_.keepalive_timeout.count()));
    }
    if (cfg_.encrypt) {
      SetStr(s, ZMQ_CURVE_SERVERKEY, keys_.curve_server_public());
      SetStr(s, ZMQ_CURVE_PUBLICKEY, keys_.curve_client_public());
      SetStr(s, ZMQ_CURVE_SECRETKEY, keys_.curve_client_secret());
    } else {
      const std::string user = keys_.Username(cfg_.token, to);
      SetStr(s, ZMQ_PLAIN_USERNAME, user);
      SetStr(s, ZMQ_PLAIN_PASSWORD, keys_.Password(user));
    }
    // Watch the handshake so that a refusal is reported instead of retried forever.
    const uint64_t gen = ++next_gen_;
    const std::string mon = "inproc://pskv-monitor-" + std::to_string(gen);
    zmq_socket_monitor(s, mon.c_str(),
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED);
    {
      std::lock_guard<std::mutex> g(guard_mu_);
      monitor_gen_[peer] = gen;
      refused_.erase(peer);
      // Down until this socket's handshake succeeds — set before it can start: set
      // after, it could overwrite the guard thread's "up" (the handshake on
      // 127.0.0.1 takes under a millisecond) and stay down forever.
      down_since_[peer] = std::chrono::steady_clock::now();
    }
    AddMonitor(peer, gen, mon);
    std::string addr = "tcp://" + endpoint;
    if (zmq_connect(s, addr.c_str()) != 0) {
      std::string err = ZmqErr();
      zmq_close(s);
      throw IOError("cannot connect to " + addr + ": " + err);
    }
    return s;
  }
  // Stops the socket's monitor first: ZeroMQ's I/O thread sends monitor events
  // with a blocking send, so events of a closing (lingering) socket whose monitor
  // reader is gone would block that thread — and with it every connection.
  static void CloseSocket(void* s, int linger) {
    zmq_socket_monitor(s, nullptr, 0);
    SetInt(s, ZMQ_LINGER, linger);
    zmq_close(s);
  }

  // Binds the message to the token of its connection. The routing id is the
  // connecting node's token; with PLAIN, ZAP also vouched for that token
  // ("User-Id"), and the two must agree. CURVE connections passed the handshake
  // only with keys derived from the secret, so their routing ids are trusted.
  bool Identify(zmq_msg_t* first, const std::string& id, Received* in) {
    const char* addr = zmq_msg_gets(first, "Peer-Address");
    in->peer_addr = addr ? addr : "?";
    uint64_t token = 0;
    bool ok = id.size() == kRoutingIdSize && id[0] == '\1';
    if (ok) {
      std::memcpy(&token, id.data() + 1, 8);
      uint32_t conn = 0;
      std::memcpy(&conn, id.data() + 9, 4);
      in->conn = conn;
    }
    if (ok && !cfg_.encrypt) {
      const char* user = zmq_msg_gets(first, "User-Id");
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016" PRIx64, token);
      ok = user && std::strcmp(user, hex) == 0;
    }
    if (!ok || token == 0) {
      PSKV_LOG_LIMITED(limiter_, in->peer_addr + "/identity", "WARN",
                       "dropped a message from " << in->peer_addr
                                                 << ": its connection's identity does not match "
                                                    "its credentials (or it runs another pskv "
                                                    "version: every node must run the same one)");
      return false;
    }
    in->peer = token;
    return true;
  }

  void AddMonitor(int peer, uint64_t gen, const std::string& endpoint) {
    void* pair = zmq_socket(ctx_, ZMQ_PAIR);
    SetInt(pair, ZMQ_LINGER, 0);
    if (zmq_connect(pair, endpoint.c_str()) != 0) {
      zmq_close(pair);
      return;  // monitoring is a diagnostic aid; the transport works without it
    }
    std::lock_guard<std::mutex> lk(guard_mu_);
    new_monitors_.push_back({peer, gen, pair});
  }

  // guard_mu_ held. A monitor of a socket that was replaced or dropped.
  bool Retired(const Monitor& m) const {
    if (m.peer < 0) return false;
    auto it = monitor_gen_.find(m.peer);
    return it == monitor_gen_.end() || it->second != m.gen;
  }

  // The guard thread: ZAP requests and monitor events (see the top of the file).
  void GuardLoop() {
    std::vector<Monitor> monitors;
    std::chrono::steady_clock::time_point router_events_since{};  // test.monitor_lag
    while (!stop_guard_) {
      {
        std::lock_guard<std::mutex> lk(guard_mu_);
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
      const bool lagging = cfg_.test.monitor_lag.count() > 0;
      if (zmq_poll(items.data(), static_cast<int>(items.size()), lagging ? 10 : 100) <= 0) continue;
      if (items[0].revents & ZMQ_POLLIN) HandleZap();
      for (size_t i = 1; i < items.size(); ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        if (lagging && monitors[i - 1].peer < 0) {
          const auto now = std::chrono::steady_clock::now();
          if (router_events_since == std::chrono::steady_clock::time_point{})
            router_events_since = now;
          if (now - router_events_since < cfg_.test.monitor_lag) continue;
          router_events_since = {};
        }
        HandleEvents(monitors[i - 1]);
      }
    }
    for (auto& m : monitors) zmq_close(m.sock);
    {
      std::lock_guard<std::mutex> lk(guard_mu_);
      for (auto& m : new_monitors_) zmq_close(m.sock);
      new_monitors_.clear();
    }
    zmq_close(zap_);
  }

  // ZAP (ZeroMQ RFC 27): version, request id, domain, address, identity,
  // mechanism, credentials... -> version, request id, status, text, user, metadata.
  void HandleZap() {
    std::vector<std::string> req;
    bool more = true;
    while (more && req.size() < 8) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, zap_, 0) < 0) {
        zmq_msg_close(&m);
        return;
      }
      req.push_back(MsgString(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    if (more) Drain(zap_);
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

  // guard_mu_ held. A connection was accepted: count it against its source
  // address (EnforceCap acts on the counts once the monitor's queue is drained).
  void Admit(int fd) {
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

  // guard_mu_ held; only right after the ROUTER's monitor queue was drained.
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
  void EnforceCap(bool drained) {
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
  int OldestOf(const std::string& ip) const {
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
  void Evict(int fd, const std::string& scope) {
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
  void HandleEvents(const Monitor& mon) {
    int i = 0;
    while (i < 256 && HandleEvent(mon)) ++i;
    if (mon.peer < 0) {
      std::lock_guard<std::mutex> lk(guard_mu_);
      EnforceCap(/*drained=*/i < 256);
    }
  }

  bool HandleEvent(const Monitor& mon) {
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
    if (more) Drain(mon.sock);
    const int fd = static_cast<int>(value);
    std::lock_guard<std::mutex> lk(guard_mu_);
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
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      down_since_.emplace(mon.peer, std::chrono::steady_clock::now());
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      refused_[mon.peer] =
          keys_.open()
              ? "it refused this node's credentials: it runs another job (compare "
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

  TransportConfig cfg_;
  BufferPool gather_pool_;  // gathered frames, packed for ZeroMQ (Send)
  JobKeys keys_;
  int wake_fd_ = -1;  // not owned
  void* ctx_ = nullptr;
  void* router_ = nullptr;
  void* zap_ = nullptr;
  std::shared_mutex peers_mu_;
  std::map<int, std::unique_ptr<Peer>> peers_;
  std::atomic<uint64_t> next_gen_{0};
  std::atomic<uint64_t> next_conn_{0}, next_socket_{0};  // RoutingId
  RateLimiter limiter_;

  std::thread guard_;
  std::atomic<bool> stop_guard_{false};
  std::mutex guard_mu_;
  std::vector<Monitor> new_monitors_;
  std::map<int, Pending> pending_;       // by fd: accepted, handshake not finished
  std::map<int, uint64_t> monitor_gen_;  // peer -> generation of its current socket
  std::map<int, std::string> refused_;
  std::map<int, std::chrono::steady_clock::time_point> down_since_;  // by peer
};

}  // namespace

std::unique_ptr<Transport> CreateZmqTransport(const TransportConfig& cfg, int wake_fd) {
  return std::make_unique<ZmqTransport>(cfg, wake_fd);
}

namespace {
const bool registered =
    RegisterTransport("zmq", [](const TransportConfig& cfg) { return CreateZmqTransport(cfg); });
}  // namespace

int ZmqReceiveFd(Transport& zmq) {
  auto* z = dynamic_cast<ZmqTransport*>(&zmq);
  return z ? z->ReceiveFd() : -1;
}

}  // namespace pskv
