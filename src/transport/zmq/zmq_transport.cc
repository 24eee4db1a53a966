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
#include "transport/zmq/guard.h"
#include "transport/zmq/zmq_util.h"

// Threads of this backend:
//  * the Recv caller (the node's receive thread) owns the ROUTER socket;
//  * senders use a peer's DEALER under that peer's mutex;
//  * the guard thread (guard.h) authenticates connections (ZAP), caps those that
//    have not authenticated, and watches every socket's monitor (which peers are
//    down, which refused this node).
// Lock order: peers_mu_ before a Peer's mu before the guard's lock.

namespace pskv {

namespace {

using namespace std::chrono_literals;

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

class ZmqTransport final : public Transport {
 public:
  ZmqTransport(const TransportConfig& cfg, int wake_fd)
      : cfg_(cfg), keys_(cfg.secret, cfg.job), wake_fd_(wake_fd) {
    if (cfg_.encrypt && keys_.open())
      throw ConfigError("encryption (PSKV_ENCRYPT=1) needs a job secret (PSKV_JOB_SECRET)");
    if (cfg_.token == 0) throw UsageError("transport needs a non-zero identity token");
    ctx_ = zmq_ctx_new();
    if (!ctx_) throw IOError("zmq_ctx_new failed: " + zmqu::Err());
    zmq_ctx_set(ctx_, ZMQ_MAX_SOCKETS, 65536);
    zmq_ctx_set(ctx_, ZMQ_IO_THREADS, 1);
    // The ZAP handler must exist before any socket starts a handshake.
    try {
      guard_ = std::make_unique<ZmqGuard>(ctx_, cfg_, keys_);
    } catch (...) {
      zmq_ctx_term(ctx_);
      throw;
    }
  }
  ~ZmqTransport() override { Close(0ms); }

  std::string Bind(const std::string& host, int port) override {
    if (router_) throw UsageError("transport already bound");
    router_ = zmq_socket(ctx_, ZMQ_ROUTER);
    zmqu::SetInt(router_, ZMQ_RCVHWM, cfg_.max_queued_messages);
    zmqu::SetInt(router_, ZMQ_LINGER, 0);
    zmqu::SetInt(router_, ZMQ_ROUTER_HANDOVER, 1);  // a reconnecting peer takes its id back
    zmqu::SetInt(
        router_, ZMQ_HANDSHAKE_IVL,
        static_cast<int>(std::clamp<int64_t>(cfg_.handshake_timeout.count(), 1, INT32_MAX)));
    int64_t maxmsg = static_cast<int64_t>(cfg_.max_frame);
    zmq_setsockopt(router_, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmqu::SetStr(router_, ZMQ_ZAP_DOMAIN, "pskv");
    if (cfg_.encrypt) {
      zmqu::SetInt(router_, ZMQ_CURVE_SERVER, 1);
      zmqu::SetStr(router_, ZMQ_CURVE_SECRETKEY, keys_.curve_server_secret());
    } else {
      zmqu::SetInt(router_, ZMQ_PLAIN_SERVER, 1);
    }
    // Count connections from their acceptance until they prove themselves.
    const std::string mon = "inproc://pskv-monitor-router";
    zmq_socket_monitor(router_, mon.c_str(),
                       ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED |
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL);
    guard_->Watch(-1, 0, mon);
    std::string addr = "tcp://" + host + ":" + (port > 0 ? std::to_string(port) : "*");
    if (zmq_bind(router_, addr.c_str()) != 0) {
      std::string err = zmqu::Err();
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
    if (cfg_.seams.connect_pause.count() > 0) std::this_thread::sleep_for(cfg_.seams.connect_pause);
    peers_.emplace(peer, std::move(p));
  }

  void Disconnect(int peer) override {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    CloseSocket(it->second->sock, kDisconnectLinger);  // what is queued may still go out
    peers_.erase(it);
    guard_->Forget(peer);
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
        std::string err = zmqu::Err();
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
      std::string err = zmqu::Err();
      zmq_msg_close(&rid);
      throw IOError("receive failed: " + err);
    }
    std::string id = zmqu::MsgString(&rid);
    const bool more = zmq_msg_more(&rid);
    zmq_msg_close(&rid);
    if (!more) return false;
    for (;;) {
      auto* msg = new zmq_msg_t;
      zmq_msg_init(msg);
      while (zmq_msg_recv(msg, router_, 0) < 0) {
        if (zmq_errno() == EINTR) continue;
        std::string err = zmqu::Err();
        zmq_msg_close(msg);
        delete msg;
        throw IOError("receive failed: " + err);
      }
      const bool last = !zmq_msg_more(msg);
      if (in->frames.empty() && !Identify(msg, id, in)) {
        zmq_msg_close(msg);
        delete msg;
        if (!last) zmqu::Drain(router_);
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
    return guard_->DownSince(peer);
  }
  std::chrono::steady_clock::time_point GoneSince(int peer) override {
    return guard_->GoneSince(peer);
  }
  std::string RefusedBy(int peer) override { return guard_->RefusedBy(peer); }

  void Close(std::chrono::milliseconds linger) override {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    if (!ctx_) return;
    for (auto& [id, p] : peers_) CloseSocket(p->sock, static_cast<int>(linger.count()));
    peers_.clear();
    if (router_) CloseSocket(router_, 0);
    router_ = nullptr;
    guard_->Stop();
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
  // A DEALER to `endpoint` presenting this node's credentials for `to`, with a
  // monitor of its own. Caller holds peers_mu_ (shared suffices) or the peer's mu.
  void* NewDealer(int peer, const std::string& endpoint, uint64_t to, uint64_t conn) {
    void* s = zmq_socket(ctx_, ZMQ_DEALER);
    if (!s) throw IOError("cannot create a socket: " + zmqu::Err());
    zmqu::SetInt(s, ZMQ_SNDHWM, 0);  // never block: a dead peer is detected by heartbeats
    zmqu::SetInt(s, ZMQ_LINGER, 0);
    zmqu::SetInt(s, ZMQ_RECONNECT_IVL, 100);
    zmqu::SetInt(s, ZMQ_RECONNECT_IVL_MAX, 2000);
    zmqu::SetStr(
        s, ZMQ_ROUTING_ID,
        RoutingId(cfg_.token, static_cast<uint32_t>(conn), static_cast<uint32_t>(++next_socket_)));
    if (cfg_.keepalive_interval.count() > 0) {  // ZMTP PING/PONG: half-open connections
      zmqu::SetInt(s, ZMQ_HEARTBEAT_IVL, static_cast<int>(cfg_.keepalive_interval.count()));
      zmqu::SetInt(s, ZMQ_HEARTBEAT_TIMEOUT, static_cast<int>(cfg_.keepalive_timeout.count()));
      zmqu::SetInt(s, ZMQ_HEARTBEAT_TTL, static_cast<int>(cfg_.keepalive_timeout.count()));
    }
    if (cfg_.encrypt) {
      zmqu::SetStr(s, ZMQ_CURVE_SERVERKEY, keys_.curve_server_public());
      zmqu::SetStr(s, ZMQ_CURVE_PUBLICKEY, keys_.curve_client_public());
      zmqu::SetStr(s, ZMQ_CURVE_SECRETKEY, keys_.curve_client_secret());
    } else {
      const std::string user = keys_.Username(cfg_.token, to);
      zmqu::SetStr(s, ZMQ_PLAIN_USERNAME, user);
      zmqu::SetStr(s, ZMQ_PLAIN_PASSWORD, keys_.Password(user));
    }
    // Watch the handshake so that a refusal is reported instead of retried forever.
    const uint64_t gen = guard_->NewSocket(peer);  // down until its handshake succeeds
    const std::string mon = "inproc://pskv-monitor-" + std::to_string(gen);
    zmq_socket_monitor(s, mon.c_str(),
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CLOSED);
    guard_->Watch(peer, gen, mon);
    std::string addr = "tcp://" + endpoint;
    if (zmq_connect(s, addr.c_str()) != 0) {
      std::string err = zmqu::Err();
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
    zmqu::SetInt(s, ZMQ_LINGER, linger);
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

  TransportConfig cfg_;
  BufferPool gather_pool_;  // gathered frames, packed for ZeroMQ (Send)
  JobKeys keys_;
  int wake_fd_ = -1;  // not owned
  void* ctx_ = nullptr;
  void* router_ = nullptr;
  std::shared_mutex peers_mu_;
  std::map<int, std::unique_ptr<Peer>> peers_;
  std::atomic<uint64_t> next_conn_{0}, next_socket_{0};  // RoutingId
  RateLimiter limiter_;

  std::unique_ptr<ZmqGuard> guard_;  // after keys_ and cfg_, which it uses
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
