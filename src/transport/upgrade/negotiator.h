// The upgrading transport's parts (upgrading_transport.h says what it does; the
// negotiation is in data_path.h), one concern each:
//  * UpgradingTransport (upgrading_transport.cc): makes the pipes, the epoll set, the
//    control connection and the data paths, and hands each call to the side it
//    belongs to; Bind, Close;
//  * Sender (sending.h, sending.cc): the per-peer sending state machine (offer,
//    switch, give up) and the writer thread;
//  * Receiver (receiving.h, receiving.cc): the Recv loop (ZeroMQ, the wake-up pipe and
//    the incoming paths in one epoll set; spinning).
// Private to src/transport/upgrade.
//
// Threads of this backend (the negotiation is in data_path.h):
//  * senders (any thread) write into a peer's path under that peer's Out::mu,
//    as much as fits; what does not fit waits in Out::pending, whose frames keep
//    their owners (no copy until the bytes go into the path);
//  * the writer thread (Sender) moves pending bytes into paths when they have room;
//    it sleeps on this process's tx pipe (ring readers write to it) and on what the
//    paths ask it to watch (POLLOUT of sockets, the direct TCP listener);
//  * the Recv caller owns the incoming paths (Receiver: under its in_mu_ only so that
//    Close from another thread is safe) and the control connection's Recv; it
//    sleeps in one epoll set holding ZeroMQ's descriptor, the rx pipe that ring
//    writers use and the paths' descriptors.
// Lock order: Receiver's in_mu_, then a DataPath's own lock (the listener), then
// Sender's peers_mu_, then an Out's mu, then the control transport's locks. The Recv
// thread takes peers_mu_ (shared) under in_mu_ only to ask whether a writer is cut off
// (Sender::CutOff).
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rate_limit.h"
#include "transport/auth.h"
#include "transport/transport.h"
#include "transport/upgrade/data_path.h"
#include "transport/upgrade/upgrading_transport.h"

namespace pskv::upgrade {

class Sender;
class Receiver;

// Empties a wake-up pipe — bounded: a peer that keeps writing into it cannot keep
// the caller here (what is left makes the next poll return at once; the paths'
// own state, not the bytes, says what is to be done).
inline void Drain(int fd) {
  char buf[4096];
  for (int i = 0; i < 16 && ::read(fd, buf, sizeof buf) == static_cast<ssize_t>(sizeof buf); ++i) {
  }
}

class UpgradingTransport final : public Transport {
 public:
  UpgradingTransport(const TransportConfig& cfg, const ControlWrapper& wrap);
  ~UpgradingTransport() override;

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
  TransportConfig cfg_;
  const JobKeys keys_;
  int rx_rd_ = -1, rx_wr_ = -1;       // wakes the Recv thread (in the epoll set)
  int tx_rd_ = -1, tx_wr_ = -1;       // wakes the writer thread
  int epfd_ = -1;                     // ZeroMQ's descriptor, the rx pipe, the paths' descriptors
  std::unique_ptr<Transport> inner_;  // the control connection: ZeroMQ (zmq_), or a test's wrapper
  Transport* zmq_ = nullptr;
  std::vector<std::unique_ptr<upgrade::DataPath>> kinds_;  // fixed after construction
  RateLimiter limiter_;
  std::atomic<bool> closed_{false};
  std::unique_ptr<Sender> sender_;
  std::unique_ptr<Receiver> receiver_;
};

}  // namespace pskv::upgrade
