// Transport: moves framed messages between nodes. Nothing else — registration,
// barriers, heartbeats and resend live in the protocol layer above (src/ps).
//
// A backend lives in its own folder (zmq/, upgrade/), registers its creator
// under a kind name (RegisterTransport, from a static initializer in that
// folder) and is created by CreateTransport(kind): this core never includes a
// backend's header. shm/ and tcp/ are data paths plugged into upgrade/
// (upgrade/data_path.h), not transports; fault/ wraps any transport
// (CreateFaultTransport, for tests). Contract every backend meets
// (tests/transport/test_transport.cc runs the same suite against each):
//  * Bind() once, before anything else; it returns the "host:port" bound.
//  * Connect(peer, endpoint, token) may be called again for the same peer with a
//    new endpoint; `token` is the identity the peer will have to prove (the
//    credentials presented are valid for that process only; kSchedulerToken:
//    the job's scheduler, whose token is not known before registration).
//    Send() to a peer not connected is an IOError. Disconnect(peer) lets queued
//    messages go out for at most a second, then releases everything of the peer.
//  * Send() is thread-safe, never blocks on a slow or dead peer, and sends the
//    frames' memory without copying it; each frame's owner is released once the
//    backend no longer needs the memory. A gathered frame (Frame::pieces) arrives
//    as one frame holding its pieces' bytes, exactly as if they had been sent
//    contiguously: gathering is invisible on the wire and to the receiver.
//  * Recv() is called by one thread only; it returns false on timeout. Every
//    message it returns comes from a connection that passed the job's handshake
//    (transport/auth.h); `peer` is the identity token bound to that connection.
//  * Messages between one pair of nodes arrive in order, or not at all.
//  * Resources a peer can make a node spend are bounded (frame size, queued
//    messages, connections that have not authenticated, log lines).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/frame.h"

namespace pskv {

/// What a transport needs to know about the job (filled by the Node).
struct TransportConfig {
  std::string secret;    ///< job secret; empty = open mode
  bool encrypt = false;  ///< CURVE-encrypt everything (needs a secret)
  uint64_t job = 0;      ///< job hash: nodes of other jobs are refused at the handshake
  uint64_t token = 0;    ///< this process's identity, proven at every connection
  /// This node is the job's scheduler: it also accepts credentials addressed to
  /// "the scheduler" (kSchedulerToken), which nodes use before they know its token.
  bool scheduler = false;
  /// Connections accepted that have not finished the handshake, at most, per
  /// listener (AdmissionPolicy, transport/admission.h: one source address may
  /// hold a quarter of them, at least 16; beyond that the oldest of the address
  /// holding the most is closed), so a stranger cannot hold the door shut for the
  /// job's nodes.
  int max_pending_connections = 64;
  /// A connection that has not finished the handshake by then is closed.
  std::chrono::milliseconds handshake_timeout{10000};
  /// Largest frame accepted; larger frames close the connection before anything
  /// is reserved for them.
  uint64_t max_frame = uint64_t{128} << 20;
  /// Complete messages queued per incoming connection before the sender is held
  /// back by TCP flow control.
  int max_queued_messages = 1000;
  /// Keep-alive on every outgoing connection (0: off): a connection whose peer
  /// does not answer within `keepalive_timeout` is closed and reported down, so
  /// half-open connections are noticed.
  std::chrono::milliseconds keepalive_interval{0}, keepalive_timeout{0};
  /// For the "upgrade" backend: an offered ring the peer has not attached this long
  /// after the connection is up (it declined: another host, PSKV_SHM=0) is given up.
  std::chrono::milliseconds shm_attach_deadline{10000};
  /// For the "upgrade" backend: Recv looks again without sleeping for this long after
  /// a message before it sleeps (Options::spin_us); 0: never.
  std::chrono::microseconds spin{0};
  /// Test seams of the ZeroMQ backend (zero in production): interleavings a real
  /// scheduler produces only rarely, widened so that a test can rely on them. Looked
  /// at once per Connect and per turn of the guard thread (zmq/guard.h), never per
  /// message; disturbances of messages are the fault decorator's (fault/).
  struct Seams {
    /// Connect pauses this long after its socket started connecting (a connecting
    /// thread preempted at the worst moment).
    std::chrono::milliseconds connect_pause{0};
    /// The bound socket's connection events are handled this long after they came
    /// (ZAP requests meanwhile at once): a guard thread behind a backlog of events.
    std::chrono::milliseconds monitor_lag{0};
  } seams;
  /// For the "upgrade" backend: shared memory with peers on this host. kOff (offer
  /// none, decline every offer), kAuto (offer to peers whose endpoint is an
  /// address of this host), kOn (offer to every peer; one on another host
  /// declines and TCP is used).
  enum class Shm { kOff, kAuto, kOn } shm = Shm::kOff;
  /// For the "upgrade" backend: a direct TCP connection (no ZeroMQ I/O thread on the
  /// data path) per direction with peers that get no ring, negotiated over the
  /// authenticated ZeroMQ connection (tcp/direct_tcp.h; Options::tcp_direct,
  /// PSKV_TCP_DIRECT). Ignored with `encrypt` and on the scheduler.
  bool tcp_direct = false;
  /// Bytes of each shared-memory ring (one per direction and co-located pair);
  /// a power of two. Messages larger than the ring stream through it.
  uint64_t shm_ring_bytes = uint64_t{8} << 20;
};

/// A received message and who sent it.
struct Received {
  std::vector<Frame> frames;
  uint64_t peer = 0;      ///< identity token bound to the connection at its handshake
  std::string peer_addr;  ///< the peer's IP address, for log lines
  /// Which of the sender's connections carried it (a number the sender gives each
  /// Connect, part of the ZeroMQ routing id; a direct path's messages carry the
  /// number of the connection that negotiated it). Messages of one connection
  /// arrive in the order sent; those of two connections of one sender may not.
  uint64_t conn = 0;
};

/// What the kernel counted on one direct TCP connection since it opened (TCP_INFO).
struct TcpSendStats {
  uint64_t bytes_acked = 0;  ///< payload bytes the peer acknowledged
  /// Microseconds with data waiting in the socket (in flight, or held by the
  /// receiver's window or the send buffer): the connection was backlogged.
  uint64_t busy_us = 0;
};

/// The `token` of Transport::Connect for the job's scheduler.
constexpr uint64_t kSchedulerToken = 0;

class Transport {
 public:
  virtual ~Transport() = default;
  /// Binds to host:port (port 0: any free port). Returns the bound "host:port".
  virtual std::string Bind(const std::string& host, int port) = 0;
  /// Several peer ids may name the same endpoint and token (the scheduler's
  /// temporary and final ids of a node): each is a connection of its own, all
  /// deliver; order is kept per peer id, not across them.
  virtual void Connect(int peer, const std::string& endpoint, uint64_t token) = 0;
  virtual void Disconnect(int peer) = 0;
  virtual void Send(int peer, std::vector<Frame> frames) = 0;
  virtual bool Recv(Received* in, std::chrono::milliseconds timeout) = 0;
  /// Non-empty when `peer` refused this node's credentials at the handshake: says
  /// why (another job, another secret, encryption setting differs).
  virtual std::string RefusedBy(int peer) { return {}; }
  /// When the connection to `peer` was lost (or, if never established, when
  /// Connect was called); a default time_point while it is up or unknown.
  virtual std::chrono::steady_clock::time_point DownSince(int peer) { return {}; }
  /// When `peer` was found gone: its connection, once up, was lost and a new
  /// connection attempt failed since (refused: nothing listens on its port any more;
  /// or its host unreachable): the process exited or was killed. A default
  /// time_point otherwise (up, still reconnecting, or silent: a live peer that only
  /// lost a connection reconnects, its port being open; a frozen one, a cut link or
  /// a host gone is left to heartbeats). Where the backend cannot tell: never.
  virtual std::chrono::steady_clock::time_point GoneSince(int peer) { return {}; }
  /// Caps the rate at which the kernel sends this node's data to `peer` over a
  /// direct TCP connection, now and on any later one (SO_MAX_PACING_RATE: Linux
  /// spaces the connection's packets itself, no qdisc needed), in payload bytes per
  /// second; 0 lifts the cap. Backends without such a connection ignore it.
  virtual void SetPacingRate(int peer, uint64_t bytes_per_s) {}
  /// The kernel's counters of the direct TCP connection that carries this node's
  /// data to `peer` (TCP_INFO), for learning the link's rate
  /// (kvstore/distributed/link_pacing.h). False where there is none (ZeroMQ, shared
  /// memory, not connected yet).
  virtual bool SendStats(int peer, TcpSendStats* out) { return false; }
  /// Releases sockets; waits at most `linger` for queued messages to go out.
  virtual void Close(std::chrono::milliseconds linger) = 0;
  virtual std::string Name() const = 0;
};

using TransportCreator = std::function<std::unique_ptr<Transport>(const TransportConfig&)>;

/// Makes `create` the backend of `kind` (each backend's folder calls it once, from a
/// static initializer). Returns true, so that it can initialise a namespace-scope
/// constant. Registering a kind twice is a programming error (InternalError).
bool RegisterTransport(const std::string& kind, TransportCreator create);

/// The kinds registered, sorted.
std::vector<std::string> TransportKinds();

/// The backend every node uses: ZeroMQ for the handshake and control, with a
/// negotiated direct data path per peer where one is available (cfg.shm,
/// cfg.tcp_direct).
inline constexpr char kNodeTransport[] = "upgrade";

/// Creates a backend: "zmq" (TCP through ZeroMQ), "upgrade" (kNodeTransport) and
/// whatever else is registered ("" means "zmq"). All nodes of a job use the same
/// backend: "zmq" does not understand "upgrade"'s offers. ConfigError for an
/// unknown kind.
std::unique_ptr<Transport> CreateTransport(const std::string& kind, const TransportConfig& cfg);

}  // namespace pskv
