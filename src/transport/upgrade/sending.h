// The sending side of the upgrading transport (negotiator.h): per peer, the state
// machine of data_path.h (offer a path, switch to it, give it up) and the writer
// thread that moves what waits into the paths.
// Private to src/transport/upgrade.
#pragma once

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
#include "transport/framing.h"
#include "transport/transport.h"
#include "transport/upgrade/control_codec.h"
#include "transport/upgrade/data_path.h"

namespace pskv::upgrade {

using framing::OutMsg;

// A path that broke (a failed write, a failed OFFER or SWITCH) is offered again
// after this, once the control connection is up.
constexpr auto kRetryBroken = std::chrono::seconds(1);
// A writer whose control connection (this node's to it) has been down this long is
// cut off: a SWITCH of its that has not come never will (IncomingPaths::CutOff).
// Longer than a reconnection, which ZeroMQ makes at once.
constexpr auto kCutOffAfter = std::chrono::seconds(5);

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

class Sender {
 public:
  /// Everything given belongs to the transport and outlives this: `control` carries
  /// the OFFERs and SWITCHes (and the messages of peers without a path), `kinds` are
  /// the data paths, `tx_rd`/`tx_wr` the writer thread's wake-up pipe.
  Sender(const TransportConfig& cfg, Transport& control,
         const std::vector<std::unique_ptr<DataPath>>& kinds, RateLimiter& limiter, int tx_rd,
         int tx_wr);
  ~Sender() { StopWriter(); }

  /// Starts the writer thread.
  void Start();
  /// A peer's (new) connection: offers it the first path that wants it.
  void Connect(int peer, const std::string& endpoint, uint64_t token);
  /// Gives the peer's path up and forgets the peer.
  void Disconnect(int peer);
  /// Into the peer's path if it has one, else over the control connection.
  void Send(int peer, std::vector<Frame> frames);
  void SetPacingRate(int peer, uint64_t bytes_per_s);
  /// The kernel's counters of the active data path to `peer` (false: none, or no TCP).
  bool SendStats(int peer, TcpSendStats* out);
  /// "shm", "tcp" or "zmq": how messages to `peer` travel now.
  std::string PathTo(int peer);
  /// IncomingPaths::CutOff: this node's control connection to the node proving
  /// `token` has been down for kCutOffAfter. Recv thread (takes peers_mu_ shared).
  bool CutOff(uint64_t token);

  /// Close, in this order: waits up to `linger` for pending messages to go into
  /// their paths; stops the writer thread; gives every path up.
  void Linger(std::chrono::milliseconds linger);
  void StopWriter();
  void Clear();

 private:
  // Makes o.kind's sending end for `peer` and offers it over ZeroMQ. Under o.mu.
  void Offer(int peer, Out& o, bool up);

  // Sends an OFFER or SWITCH over ZeroMQ. A failure (the connection is being
  // replaced or was refused) gives the path up; false then. Under o.mu.
  bool SendControl(int peer, Out& o, const upgrade::PathControl& c);

  // Gives the path up: the reader drains what was written, then drops it. Under o.mu.
  static void Teardown(Out& o);

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

  const TransportConfig& cfg_;
  Transport& control_;
  const std::vector<std::unique_ptr<DataPath>>& kinds_;
  RateLimiter& limiter_;
  const int tx_rd_, tx_wr_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> offers_{0};  // numbers this node's offers (upgrade::Offer::seq)

  std::shared_mutex peers_mu_;
  std::map<int, std::unique_ptr<Out>> outs_;
  std::thread writer_;
};

}  // namespace pskv::upgrade
