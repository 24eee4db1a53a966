// The receiving side of the upgrading transport (negotiator.h): the Recv loop over
// the control connection (ZeroMQ) and the incoming paths, sleeping in one epoll set
// with ZeroMQ's descriptor, the rx wake-up pipe and the paths' descriptors, and
// spinning briefly after small messages.
// Private to src/transport/upgrade.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/rate_limit.h"
#include "transport/transport.h"
#include "transport/upgrade/data_path.h"
#include "transport/upgrade/incoming_paths.h"

namespace pskv::upgrade {

// Spin (TransportConfig::spin) only after messages of at most this many bytes.
constexpr uint64_t kSpinAfterBytes = 64 << 10;

class Receiver {
 public:
  /// Everything given belongs to the transport and outlives this: `control` is the
  /// control connection, `epfd` the epoll set, `rx_rd` the Recv thread's wake-up pipe
  /// (in the set); `cut_off` as IncomingPaths's.
  Receiver(const TransportConfig& cfg, Transport& control, int epfd, int rx_rd,
           const std::vector<std::unique_ptr<DataPath>>& kinds, RateLimiter& limiter,
           IncomingPaths::CutOff cut_off)
      : control_(control),
        epfd_(epfd),
        rx_rd_(rx_rd),
        incoming_(kinds, limiter, std::move(cut_off)),
        spin_(cfg.spin) {}

  /// Transport::Recv (see above).
  bool Recv(Received* in, std::chrono::milliseconds timeout);
  /// After Bind: sleeps on the receiving socket of `zmq` (ZMQ_FD) too. Takes in_mu_:
  /// the socket is the Recv thread's.
  void WatchControl(Transport& zmq);
  /// Close: every incoming path stops reading (a ring is marked closed).
  void Clear();
  /// Close, once the descriptors are about to be closed: Recv then only waits.
  void Detach() { epfd_ = -1; }

 private:
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

  Transport& control_;
  std::atomic<int> epfd_;  // -1 once the transport closes it (Detach)
  const int rx_rd_;

  std::mutex in_mu_;  // the Recv caller's: incoming_ and what follows
  IncomingPaths incoming_;
  bool zmq_first_ = false;
  int zmq_fd_ = -1;            // ZeroMQ's receiving socket's ZMQ_FD (in the epoll set)
  bool events_fresh_ = false;  // the epoll set was just read (by the sleep)
  bool spun_zmq_ = false;
  Clock::time_point last_small_msg_{};
  const std::chrono::microseconds spin_;
};

}  // namespace pskv::upgrade
