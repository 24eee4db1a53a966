// The upgrading transport: making it, binding and closing it; its sending and
// receiving sides do the rest (negotiator.h).
#include "transport/upgrade/negotiator.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cstring>

#include "common/logging.h"
#include "pskv/error.h"
#include "transport/upgrade/receiving.h"
#include "transport/upgrade/sending.h"
#include "transport/zmq/zmq_transport.h"

namespace pskv::upgrade {

using namespace std::chrono_literals;

void Signal(int fd) {
  if (fd < 0) return;
  const char b = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &b, 1);  // EAGAIN: a wake-up is pending anyway
}

UpgradingTransport::UpgradingTransport(const TransportConfig& cfg, const ControlWrapper& wrap)
    : cfg_(cfg), keys_(cfg.secret, cfg.job) {
  int rx[2], tx[2];
  if (::pipe2(rx, O_NONBLOCK | O_CLOEXEC) != 0) throw IOError("pipe2 failed");
  if (::pipe2(tx, O_NONBLOCK | O_CLOEXEC) != 0) {
    ::close(rx[0]);
    ::close(rx[1]);
    throw IOError("pipe2 failed");
  }
  rx_rd_ = rx[0];
  rx_wr_ = rx[1];
  tx_rd_ = tx[0];
  tx_wr_ = tx[1];
  try {
    epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) throw IOError(std::string("epoll_create1 failed: ") + std::strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = rx_rd_;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, rx_rd_, &ev) != 0) throw IOError("epoll_ctl failed");
    auto zmq = CreateZmqTransport(cfg, epfd_);
    zmq_ = zmq.get();
    inner_ = wrap ? wrap(std::move(zmq)) : std::move(zmq);
    upgrade::PathHost host;
    host.cfg = &cfg_;
    host.keys = &keys_;
    host.pid = ::getpid();
    host.rx_wake = rx_wr_;
    host.tx_wake = tx_wr_;
    host.epfd = epfd_;
    // Every registered path (data_path.h), in order of preference: a peer gets the
    // first path that wants it.
    kinds_ = CreateDataPaths(host);
    sender_ = std::make_unique<Sender>(cfg_, *inner_, kinds_, limiter_, tx_rd_, tx_wr_);
    receiver_ =
        std::make_unique<Receiver>(cfg_, *inner_, epfd_, rx_rd_, kinds_, limiter_,
                                   [this](uint64_t token) { return sender_->CutOff(token); });
  } catch (...) {
    for (int fd : {rx_rd_, rx_wr_, tx_rd_, tx_wr_, epfd_})
      if (fd >= 0) ::close(fd);
    throw;
  }
  sender_->Start();
}

UpgradingTransport::~UpgradingTransport() {
  Close(std::chrono::milliseconds(0));
}

std::string UpgradingTransport::Bind(const std::string& host, int port) {
  std::string ep = inner_->Bind(host, port);
  receiver_->WatchControl(*zmq_);
  for (auto& k : kinds_) k->Bind(host);
  return ep;
}

void UpgradingTransport::Connect(int peer, const std::string& endpoint, uint64_t token) {
  inner_->Connect(peer, endpoint, token);
  sender_->Connect(peer, endpoint, token);
}

void UpgradingTransport::Disconnect(int peer) {
  sender_->Disconnect(peer);
  inner_->Disconnect(peer);
}

void UpgradingTransport::SetPacingRate(int peer, uint64_t bytes_per_s) {
  sender_->SetPacingRate(peer, bytes_per_s);
}

bool UpgradingTransport::SendStats(int peer, TcpSendStats* out) {
  return sender_->SendStats(peer, out);
}

void UpgradingTransport::Send(int peer, std::vector<Frame> frames) {
  sender_->Send(peer, std::move(frames));
}

bool UpgradingTransport::Recv(Received* in, std::chrono::milliseconds timeout) {
  return receiver_->Recv(in, timeout);
}

void UpgradingTransport::Close(std::chrono::milliseconds linger) {
  if (closed_.exchange(true)) return;
  sender_->Linger(linger);  // pending messages get up to `linger` to go into their paths
  sender_->StopWriter();
  for (auto& k : kinds_) k->Close();
  sender_->Clear();
  receiver_->Clear();
  inner_->Close(linger);
  receiver_->Detach();
  for (int* fd : {&rx_rd_, &rx_wr_, &tx_rd_, &tx_wr_, &epfd_}) {
    ::close(*fd);
    *fd = -1;
  }
}

std::string UpgradingTransport::PathTo(int peer) {
  return sender_->PathTo(peer);
}

int UpgradingTransport::DirectPort() const {
  for (auto& k : kinds_)
    if (k->Port()) return k->Port();
  return 0;
}

}  // namespace pskv::upgrade

namespace pskv {

std::unique_ptr<Transport> CreateShmTransport(const TransportConfig& cfg) {
  return std::make_unique<upgrade::UpgradingTransport>(cfg, nullptr);
}

std::unique_ptr<Transport> CreateShmTransport(const TransportConfig& cfg,
                                              const ControlWrapper& wrap) {
  return std::make_unique<upgrade::UpgradingTransport>(cfg, wrap);
}

std::string DataPath(Transport& t, int peer) {
  auto* s = dynamic_cast<upgrade::UpgradingTransport*>(&t);
  return s ? s->PathTo(peer) : "zmq";
}

bool SendsThroughShm(Transport& t, int peer) {
  return DataPath(t, peer) == "shm";
}

namespace {
const bool registered = [] {
  auto create = [](const TransportConfig& cfg) { return CreateShmTransport(cfg); };
  return RegisterTransport(kNodeTransport, create);
}();
}  // namespace

int DirectTcpPort(Transport& t) {
  auto* s = dynamic_cast<upgrade::UpgradingTransport*>(&t);
  return s ? s->DirectPort() : 0;
}

}  // namespace pskv
