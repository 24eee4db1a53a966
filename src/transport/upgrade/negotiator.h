// The upgrading transport's parts (upgrading_transport.h says what it does; the
// negotiation is in data_path.h), in three files by concern:
//  * upgrading_transport.cc: making it, Bind, Connect, Disconnect, Send, Close;
//  * sending.cc: the per-peer sending state machine (offer, switch, give up) and
//    the writer thread;
//  * receiving.cc: the Recv loop (ZeroMQ, the wake-up pipe and the incoming paths
//    in one epoll set; spinning) and what it asks of the sending side.
// Private to src/transport/upgrade.
//
// Threads of this backend (the negotiation is in data_path.h):
//  * senders (any thread) write into a peer's path under that peer's Out::mu,
//    as much as fits; what does not fit waits in Out::pending, whose frames keep
//    their owners (no copy until the bytes go into the path);
//  * the writer thread moves pending bytes into paths when they have room; it
//    sleeps on this process's tx pipe (ring readers write to it) and on what the
//    paths ask it to watch (POLLOUT of sockets, the direct TCP listener);
//  * the Recv caller owns the incoming paths (incoming_, under in_mu_ only so that
//    Close from another thread is safe) and the inner transport's Recv; it
//    sleeps in one epoll set holding ZeroMQ's descriptor, the rx pipe that ring
//    writers use and the paths' descriptors.
// Lock order: in_mu_, then a DataPath's own lock (the listener), then peers_mu_,
// then an Out's mu, then the inner transport's locks. The Recv thread takes
// peers_mu_ (shared) under in_mu_ only to ask whether a writer is cut off.
#pragma once

#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/rate_limit.h"
#include "transport/auth.h"
#include "transport/framing.h"
#include "transport/transport.h"
#include "transport/upgrade/control_codec.h"
#include "transport/upgrade/data_path.h"
#include "transport/upgrade/incoming_paths.h"
#include "transport/upgrade/upgrading_transport.h"

namespace pskv::upgrade {

using framing::OutMsg;

// Spin (TransportConfig::spin) only after messages of at most this many bytes.
constexpr uint64_t kSpinAfterBytes = 64 << 10;
// A path that broke (a failed write, a failed OFFER or SWITCH) is offered again
// after this, once the control connection is up.
constexpr auto kRetryBroken = std::chrono::seconds(1);
// A writer whose control connection (this node's to it) has been down this long is
// cut off: a SWITCH of its that has not come never will (IncomingPaths::CutOff).
// Longer than a reconnection, which ZeroMQ makes at once.
constexpr auto kCutOffAfter = std::chrono::seconds(5);

// Empties a wake-up pipe — bounded: a peer that keeps writing into it cannot keep
// the caller here (what is left makes the next poll return at once; the paths'
// own state, not the bytes, says what is to be done).
inline void Drain(int fd) {
  char buf[4096];
  for (int i = 0; i < 16 && ::read(fd, buf, sizeof buf) == static_cast<ssize_t>(sizeof buf); ++i) {
  }
}

// The producer side of one peer: kPlain (no path for this peer), kOffered,
// kActive (SWITCH sent: messages go into the path), kDown (the path broke or the
// control connection is down: offered again later), kOff (never again).
struct Out {
  std::mutex mu;
  enum State { kPlain, kOffered, kActive, kDown, kOff } state = kPlain;
  std::string endpoint;
  uint64_t token = 0;                 // the identity the peer proves (Connect)
  upgrade::DataPath* kind = nullptr;  // the path offered to this peer
  std::unique_ptr<OutPath> path;
  upgrade::Nonce nonce{};  // names the current offer
  bool seen_up = false;
  Clock::time_point retry_after{};    // kDown: no new offer before then
  Clock::time_point offered_up_at{};  // kOffered: when the connection was first seen up
  std::deque<OutMsg> pending;
  uint64_t pacing = 0;  // SetPacingRate: every path made for this peer gets it
};

class UpgradingTransport final : public Transport {
 public:
  UpgradingTransport(const TransportConfig& cfg, const ControlWrapper& wrap);
  ~UpgradingTransport() override { Close(std::chrono::milliseconds(0)); }

  std::string Bind(const std::string& host, int port) override;

  void Connect(int peer, const std::string& endpoint, uint64_t token) override;

  void Disconnect(int peer) override;

  void Send(int peer, std::vector<Frame> frames) override;

  bool Recv(Received* in, std::chrono::milliseconds timeout) override;

  std::string RefusedBy(int peer) override { return inner_->RefusedBy(peer); }
  Clock::time_point DownSince(int peer) override { return inner_->DownSince(peer); }
  Clock::time_point GoneSince(int peer) override { return inner_->GoneSince(peer); }
  void SetPacingRate(int peer, uint64_t bytes_per_s) override;
  bool SendStats(int peer, TcpSendStats* out) override;

  void Close(std::chrono::milliseconds linger) override;

  std::string Name() const override { return "shm+" + inner_->Name(); }

  std::string PathTo(int peer);
  int DirectPort() const;

 private:
  // ---------------------------------------------------------------- producer (sending.cc)

  // Makes o.kind's sending end for `peer` and offers it over ZeroMQ. Under o.mu.
  void Offer(int peer, Out& o, bool up);

  // Sends an OFFER or SWITCH over ZeroMQ. A failure (the connection is being
  // replaced or was refused) gives the path up; false then. Under o.mu.
  bool SendControl(int peer, Out& o, const upgrade::PathControl& c);

  // Gives the path up: the reader drains what was written, then drops it. Under o.mu.
  void Teardown(Out& o);

  // Gives the path up after a failure: kOff (never again) or kDown (again after
  // `retry`, once ZeroMQ says the peer is up). Under o.mu.
  void GiveUp(int peer, Out& o, const std::string& why, bool for_good,
              Clock::duration retry = kRetryBroken);

  // The state machine of data_path.h, run before each Send. Under o.mu.
  void Advance(int peer, Out& o);

  // Moves pending bytes into the path (bounded per call, so that o.mu and the
  // Send callers and heartbeats waiting for it are never held for long; the
  // writer thread carries on). Returns the bytes written. Under o.mu.
  uint64_t WriteSome(int peer, Out& o, bool from_writer);

  void WriterLoop();

  // ---------------------------------------------------------------- consumer (receiving.cc)

  bool Watch(int fd, int op, uint32_t events);

  // Handles what the epoll set reports for the paths' descriptors. Recv thread.
  void Events();
  // Returns whether ZeroMQ's descriptor was among the events.
  bool HandleEvents(const epoll_event* evs, int n);

  // A small message: a latency-bound exchange, worth a spin before the next sleep
  // (after big ones the threads that copy need the cores more).
  void NoteMessage(const Received& m);

  // Before sleeping, shortly after a small message: looks again for up to the
  // spin budget without sleeping, giving the core to any other runnable thread
  // between looks. True if something arrived (spun_zmq_: on ZeroMQ's descriptor).
  bool SpinFor(Clock::time_point deadline);

  // One complete message from any active path (round robin). Recv thread.
  bool PumpAll(Received* out);

  // Before sleeping: asks every path for a wake-up. True if data arrived
  // meanwhile (then do not sleep).
  bool Arm() { return incoming_.Arm(); }
  void Disarm() { incoming_.Disarm(); }

  // IncomingPaths::CutOff: this node's control connection to the node proving
  // `token` has been down for kCutOffAfter. Recv thread, under in_mu_.
  bool CutOff(uint64_t token);

  TransportConfig cfg_;
  const JobKeys keys_;
  int rx_rd_ = -1, rx_wr_ = -1;       // wakes the Recv thread (in the epoll set)
  int tx_rd_ = -1, tx_wr_ = -1;       // wakes the writer thread
  int epfd_ = -1;                     // ZeroMQ's descriptor, the rx pipe, the paths' descriptors
  std::unique_ptr<Transport> inner_;  // the control connection: ZeroMQ (zmq_), or a test's wrapper
  Transport* zmq_ = nullptr;
  std::vector<std::unique_ptr<upgrade::DataPath>> kinds_;  // fixed after construction
  RateLimiter limiter_;
  std::atomic<bool> closed_{false}, stop_{false};
  std::atomic<uint64_t> offers_{0};  // numbers this node's offers (upgrade::Offer::seq)

  std::shared_mutex peers_mu_;
  std::map<int, std::unique_ptr<Out>> outs_;
  std::thread writer_;

  std::mutex in_mu_;  // the Recv caller's: incoming_ and what follows
  upgrade::IncomingPaths incoming_{kinds_, limiter_,
                                   [this](uint64_t token) { return CutOff(token); }};
  bool zmq_first_ = false;
  int zmq_fd_ = -1;            // ZeroMQ's receiving socket's ZMQ_FD (in the epoll set)
  bool events_fresh_ = false;  // the epoll set was just read (by the sleep)
  bool spun_zmq_ = false;
  Clock::time_point last_small_msg_{};
  const std::chrono::microseconds spin_{cfg_.spin};
};

}  // namespace pskv::upgrade
