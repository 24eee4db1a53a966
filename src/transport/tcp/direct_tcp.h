// Direct TCP data path: one plain TCP connection per direction and pair of nodes
// on different hosts, written by the sending thread itself and read by the
// receiving node's Recv thread — no ZeroMQ I/O thread in between (each one costs
// two thread wake-ups per message, which dominated small operations).
//
// ZeroMQ stays the authenticated control channel; the direct connection is
// negotiated over it the way a shared-memory ring is (upgrade/data_path.h,
// tcp/socket_path.h):
//  1. sender B listens on one port of its own (bound at Bind, same host).
//  2. B sends an OFFER over its authenticated ZeroMQ connection to A: a random
//     128-bit nonce and where B listens.
//  3. A connects there and sends HELLO = nonce + HMAC(job key, "hello" + nonce):
//     only the process bound to that ZeroMQ connection learnt the nonce, and only a
//     holder of the job secret can compute the MAC (in authenticated mode the nonce
//     crosses the network in clear text, the MAC does not let a listener in).
//  4. B checks it (constant time), answers ACK = nonce + HMAC(key, "ack" + nonce)
//     so that A knows it reached B, and from its next send on sends SWITCH over
//     ZeroMQ and writes that pair's messages into the socket (framing.h). A starts
//     reading the socket when SWITCH arrives: order is kept across the switch.
// A connection that has not proven itself within the handshake timeout is
// closed; at most kMaxUnproven wait at once (one source address: a quarter), so a
// stranger at the port can neither get in nor keep the job's nodes out.
// Not used in encrypted mode (PSKV_ENCRYPT=1: CURVE must protect every byte).
#pragma once

#include <poll.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "common/rate_limit.h"
#include "transport/admission.h"
#include "transport/auth.h"
#include "transport/framing.h"
#include "transport/transport.h"

namespace pskv::direct {

using Nonce = std::array<uint8_t, 16>;

constexpr size_t kProofBytes = 8 + 16 + 64;  // magic, nonce, hex HMAC
constexpr size_t kMaxUnproven = 32;          // Listener's default cap

/// HELLO (receiver to sender) or ACK (sender to receiver) for `nonce`.
std::string Proof(const JobKeys& keys, bool hello, const Nonce& nonce);
/// Checks a proof of `kProofBytes` (constant-time MAC comparison); sets *nonce.
bool CheckProof(const JobKeys& keys, bool hello, const char* p, Nonce* nonce);

/// The sender's listening socket and the connections that have not proven
/// themselves yet. Used by one thread (the transport's writer thread).
class Listener {
 public:
  /// `max_unproven`: connections that have not proven themselves, at most, as
  /// the node's AdmissionPolicy (transport/admission.h) says for that cap.
  Listener(const JobKeys& keys, std::chrono::milliseconds handshake_timeout,
           size_t max_unproven = kMaxUnproven)
      : keys_(keys), timeout_(handshake_timeout), admission_(max_unproven) {}
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  /// Listens on `host` (an IPv4 literal; anything else: all interfaces), any port.
  /// Throws IOError.
  void Open(const std::string& host);
  bool open() const { return fd_ >= 0; }
  uint16_t port() const { return port_; }
  /// The address to advertise (network order), 0 = "where my connection came from".
  uint32_t ip() const { return ip_; }

  /// Adds the descriptors to watch (listening socket, unproven connections).
  void PollFds(std::vector<pollfd>* fds) const;
  /// Accepts and reads what is ready. For each connection that proved a nonce,
  /// `claim(nonce, fd)` is called: true = the caller took the socket (and sends
  /// the ACK), false = no such offer (the socket is closed).
  void Service(const std::function<bool(const Nonce&, int fd)>& claim);
  /// Closes everything (idempotent).
  void Close();

 private:
  struct Unproven {
    int fd = -1;
    std::string addr;
    std::chrono::steady_clock::time_point deadline;
    char buf[kProofBytes];
    size_t have = 0;
  };
  void Drop(size_t i);
  bool TryProof(Unproven& u, const std::function<bool(const Nonce&, int fd)>& claim);

  const JobKeys& keys_;
  const std::chrono::milliseconds timeout_;
  const AdmissionPolicy admission_;
  int fd_ = -1;
  uint16_t port_ = 0;
  uint32_t ip_ = 0;
  std::vector<Unproven> unproven_;
  RateLimiter limiter_;
};

/// Starts a non-blocking connection to ip:port (network order); -1 and *why on
/// failure.
int StartConnect(uint32_t ip, uint16_t port, std::string* why);
/// After the socket became writable: 0 when connected, else the errno.
int ConnectError(int fd);
/// TCP keep-alive as the ZeroMQ connections have it (interval 0: off): a peer
/// host that vanished is noticed within about `timeout`.
void KeepAlive(int fd, std::chrono::milliseconds interval, std::chrono::milliseconds timeout);
/// Caps the rate at which the kernel sends on `fd` (SO_MAX_PACING_RATE, payload
/// bytes per second; 0: no cap). TCP paces internally once a cap is set, with any
/// qdisc. False if the kernel refused.
bool MaxPacingRate(int fd, uint64_t bytes_per_s);
/// The connection's TCP_INFO counters (tcp_info.cc: the kernel's header, which
/// glibc's <netinet/tcp.h> lags behind); false if the kernel has none.
bool ReadSendStats(int fd, TcpSendStats* out);
/// Sends all of `p` on a fresh (empty send buffer) socket; false if it did not go.
bool SendAll(int fd, const std::string& p);

/// Writes queued messages into `fd` (non-blocking, no SIGPIPE) until the socket
/// is full, the queue empty, or `budget` bytes went out. Returns the bytes written;
/// *err is set to the errno of a failed connection (0 otherwise).
uint64_t Write(int fd, std::deque<framing::OutMsg>& q, uint64_t budget, int* err);

/// The receiving side of one direct connection: the peer's ACK, then messages.
class Reader {
 public:
  Reader(uint64_t max_frame, const Nonce& nonce) : parser_(max_frame), nonce_(nonce) {}
  enum Result { kNone, kMessage, kAgain, kClosed, kBad };
  /// Reads the ACK (if not read yet) and then up to one message, at most
  /// `budget` bytes from the socket. kMessage: Take() it; kAgain: the socket has
  /// nothing more now; kNone: budget spent, call again; kClosed: the sender closed
  /// between two messages; kBad: *why says what was wrong.
  Result Pump(int fd, const JobKeys& keys, uint64_t budget, const char** why);
  bool acked() const { return ack_have_ == kProofBytes; }
  /// Reads only the ACK (before SWITCH): kNone when it is complete.
  Result PumpAck(int fd, const JobKeys& keys, const char** why);
  /// Bytes received but not parsed yet (the socket may look idle).
  bool buffered() const { return pos_ < len_; }
  /// The last read found the socket empty (it returned less than asked for).
  bool drained() const { return drained_; }
  std::vector<Frame> Take() { return parser_.Take(); }
  /// The socket's receive low-water mark as last set (SO_RCVLOWAT; 1 = any byte).
  int low_water() const { return lowat_; }

  /// Before the Recv thread sleeps on the socket: how many bytes must have arrived
  /// before it wakes. Inside a frame's body with at least kLowWaterMin bytes to
  /// come: kLowWaterMax at most, and all but the last kLowWaterTail where that is
  /// less (the copy of what came overlaps the arrival of the tail, so the message
  /// is complete no later than with a wake-up per segment); else the first byte.
  static int LowWaterFor(bool in_body, uint64_t body_left) {
    if (!in_body || body_left < kLowWaterMin) return 1;
    if (body_left > kLowWaterMax + kLowWaterTail) return static_cast<int>(kLowWaterMax);
    if (body_left >= 2 * kLowWaterTail) return static_cast<int>(body_left - kLowWaterTail);
    return static_cast<int>(body_left);
  }
  static constexpr uint64_t kLowWaterMin = 32 << 10;
  static constexpr uint64_t kLowWaterTail = 64 << 10;
  static constexpr uint64_t kLowWaterMax = 256 << 10;

 private:
  // Sets the socket's SO_RCVLOWAT to LowWaterFor(where the parser is) when it
  // changes (one setsockopt per change): a reader waiting for the rest of a big
  // body is woken once per kLowWaterMax, not per segment the kernel delivers.
  // The kernel wakes it anyway on EOF, an error or memory pressure. At most a
  // quarter of the socket's receive buffer (SO_RCVBUF), so that the kernel never
  // grows the buffer for the mark and clamps the window to it.
  void SetLowWater(int fd);
  Result PumpFrames(int fd, uint64_t budget, const char** why);
  int lowat_ = 1;
  framing::Parser parser_;
  Nonce nonce_;
  char ack_[kProofBytes];
  size_t ack_have_ = 0;
  std::unique_ptr<char[]> stage_ = std::make_unique<char[]>(kStage);
  size_t pos_ = 0, len_ = 0;
  bool drained_ = false;
  static constexpr size_t kStage = 64 << 10;
  static constexpr uint64_t kDirectRead = 16 << 10;  // bodies this big bypass the staging
};

}  // namespace pskv::direct
