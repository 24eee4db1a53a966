// ZmqGuard: the thread that polices the ZeroMQ backend's context
// (zmq_transport.h). It owns the ZAP handler socket and the monitor sockets:
// it authenticates every incoming connection during ZeroMQ's handshake (so a
// stranger's bytes never become messages; transport/auth.h), counts connections
// that have not finished the handshake per source address and closes the excess
// (transport/admission.h), and notes which peers refused this node, which
// outgoing connections are down, and which peers are gone: a connection that was
// up was lost (ZMQ_EVENT_DISCONNECTED) and ZeroMQ's next attempt to reconnect
// failed (ZMQ_EVENT_CLOSED before any ZMQ_EVENT_CONNECTED: refused or unreachable).
// A live peer's port accepts the reconnection (its process listens until it exits),
// so a peer that only lost a connection is never gone.
//
// Each outgoing socket has its own monitor, tagged with a generation
// (NewSocket): when the socket is replaced or dropped, its monitor is closed by
// the guard thread and its late events are ignored. Thread-safe; its lock is
// taken after the transport's (peers_mu_, then a peer's mutex, then the guard's).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/rate_limit.h"
#include "transport/auth.h"
#include "transport/transport.h"

namespace pskv {

class ZmqGuard {
 public:
  using Clock = std::chrono::steady_clock;
  /// Binds the ZAP handler in `ctx` (before any socket starts a handshake) and
  /// starts the thread. `cfg` and `keys` outlive the guard.
  ZmqGuard(void* ctx, const TransportConfig& cfg, const JobKeys& keys);
  ~ZmqGuard() { Stop(); }
  ZmqGuard(const ZmqGuard&) = delete;
  ZmqGuard& operator=(const ZmqGuard&) = delete;

  /// An outgoing socket for `peer` is about to connect: returns its generation.
  /// The peer counts as down until that socket's handshake succeeds (set now,
  /// before the handshake can start: set later, it could overwrite the guard's
  /// "up" and stay down for good), and an earlier refusal is forgotten.
  uint64_t NewSocket(int peer);
  /// Watches the monitor at inproc `endpoint` of `peer`'s socket of generation
  /// `gen` (peer -1: the bound ROUTER, whose events drive the connection cap).
  void Watch(int peer, uint64_t gen, const std::string& endpoint);
  /// `peer` is disconnected: its state goes; its monitor is closed by the thread.
  void Forget(int peer);
  /// Since when `peer`'s connection is down (epoch: up).
  Clock::time_point DownSince(int peer);
  /// Since when `peer` is gone (above; epoch: not gone).
  Clock::time_point GoneSince(int peer);
  /// Why `peer` refused this node ("" if it did not).
  std::string RefusedBy(int peer);
  /// Stops the thread and closes its sockets (before the context is terminated).
  void Stop();

 private:
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
    Clock::time_point since;
  };

  void Loop();
  void HandleZap();
  void HandleEvents(const Monitor& mon);
  bool HandleEvent(const Monitor& mon);
  bool Retired(const Monitor& m) const;
  void Admit(int fd);
  void EnforceCap(bool drained);
  int OldestOf(const std::string& ip) const;
  void Evict(int fd, const std::string& scope);

  void* ctx_;
  const TransportConfig& cfg_;
  const JobKeys& keys_;
  void* zap_ = nullptr;
  RateLimiter limiter_;
  std::atomic<uint64_t> next_gen_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;

  std::mutex mu_;
  std::vector<Monitor> new_monitors_;
  std::map<int, Pending> pending_;       // by fd: accepted, handshake not finished
  std::map<int, uint64_t> monitor_gen_;  // peer -> generation of its current socket
  std::map<int, std::string> refused_;
  std::map<int, Clock::time_point> down_since_;  // by peer
  std::set<int> lost_;                           // up once, lost, not reconnected since
  std::map<int, Clock::time_point> gone_since_;  // by peer
};

}  // namespace pskv
