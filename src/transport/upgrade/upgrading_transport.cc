// The upgrading transport: making it, its peers and closing it (negotiator.h).
#include "transport/upgrade/negotiator.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cstring>

#include "common/logging.h"
#include "pskv/error.h"
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
  } catch (...) {
    for (int fd : {rx_rd_, rx_wr_, tx_rd_, tx_wr_, epfd_})
      if (fd >= 0) ::close(fd);
    throw;
  }
  writer_ = std::thread([this] { WriterLoop(); });
}

std::string UpgradingTransport::Bind(const std::string& host, int port) {
  std::string ep = inner_->Bind(host, port);
  {
    std::lock_guard<std::mutex> g(in_mu_);
    zmq_fd_ = ZmqReceiveFd(*zmq_);
    if (zmq_fd_ >= 0 && !Watch(zmq_fd_, EPOLL_CTL_ADD, EPOLLIN)) zmq_fd_ = -1;
  }
  for (auto& k : kinds_) k->Bind(host);
  return ep;
}

void UpgradingTransport::Connect(int peer, const std::string& endpoint, uint64_t token) {
  inner_->Connect(peer, endpoint, token);
  std::unique_lock<std::shared_mutex> lk(peers_mu_);
  auto& o = outs_[peer];
  if (o && o->endpoint == endpoint && o->token == token) return;
  uint64_t pacing = 0;  // a cap set for this peer holds for its new connection too
  if (o) {
    std::lock_guard<std::mutex> g(o->mu);
    Teardown(*o);
    pacing = o->pacing;
  }
  o = std::make_unique<Out>();
  o->endpoint = endpoint;
  o->token = token;
  o->pacing = pacing;
  // One direct path per pair of nodes: another connection to the same node (a
  // second peer id for it) stays on ZeroMQ — the receiver keeps one path per
  // sending node.
  for (auto& [id, other] : outs_)
    if (id != peer && other->token == token) return;
  for (auto& k : kinds_)
    if (k->Wants(endpoint, token)) {
      std::lock_guard<std::mutex> g(o->mu);
      o->kind = k.get();
      Offer(peer, *o, false);
      break;
    }
}

void UpgradingTransport::Disconnect(int peer) {
  std::unique_ptr<Out> gone;  // destroyed after its mutex is released
  {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    auto it = outs_.find(peer);
    if (it != outs_.end()) {
      gone = std::move(it->second);
      outs_.erase(it);
      std::lock_guard<std::mutex> g(gone->mu);
      Teardown(*gone);
    }
  }
  inner_->Disconnect(peer);
}

void UpgradingTransport::SetPacingRate(int peer, uint64_t bytes_per_s) {
  std::shared_lock<std::shared_mutex> lk(peers_mu_);
  auto it = outs_.find(peer);
  if (it == outs_.end()) return;  // not connected: nothing to pace
  Out& o = *it->second;
  std::lock_guard<std::mutex> g(o.mu);
  o.pacing = bytes_per_s;
  if (o.path) o.path->SetPacingRate(bytes_per_s);
}

bool UpgradingTransport::SendStats(int peer, TcpSendStats* out) {
  std::shared_lock<std::shared_mutex> lk(peers_mu_);
  auto it = outs_.find(peer);
  if (it == outs_.end()) return false;
  Out& o = *it->second;
  std::lock_guard<std::mutex> g(o.mu);
  return o.state == Out::kActive && o.path && o.path->SendStats(out);
}

void UpgradingTransport::Send(int peer, std::vector<Frame> frames) {
  if (frames.empty()) return;
  std::shared_lock<std::shared_mutex> lk(peers_mu_);
  auto it = outs_.find(peer);
  if (it == outs_.end()) return inner_->Send(peer, std::move(frames));
  Out& o = *it->second;
  std::lock_guard<std::mutex> g(o.mu);
  Advance(peer, o);
  if (o.state != Out::kActive) return inner_->Send(peer, std::move(frames));
  o.pending.push_back(OutMsg::Make(std::move(frames)));
  if (o.pending.size() == 1) WriteSome(peer, o, false);
  // Still waiting (it is the last one queued): frames without an owner are only
  // valid during this call, so they are copied now.
  if (!o.pending.empty()) o.pending.back().OwnAll();
}

void UpgradingTransport::Close(std::chrono::milliseconds linger) {
  if (closed_.exchange(true)) return;
  // Give pending messages up to `linger` to go into their paths.
  for (const auto end = Clock::now() + linger; Clock::now() < end;) {
    bool any = false;
    {
      std::shared_lock<std::shared_mutex> lk(peers_mu_);
      for (auto& [id, o] : outs_) {
        std::lock_guard<std::mutex> g(o->mu);
        any |= o->state == Out::kActive && !o->pending.empty();
      }
    }
    if (!any) break;
    std::this_thread::sleep_for(1ms);
  }
  stop_ = true;
  Signal(tx_wr_);
  if (writer_.joinable()) writer_.join();
  for (auto& k : kinds_) k->Close();
  {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    for (auto& [id, o] : outs_) {
      std::lock_guard<std::mutex> g(o->mu);
      Teardown(*o);
    }
    outs_.clear();
  }
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    incoming_.Clear();  // each path stops reading (a ring is marked closed)
  }
  inner_->Close(linger);
  for (int* fd : {&rx_rd_, &rx_wr_, &tx_rd_, &tx_wr_, &epfd_}) {
    ::close(*fd);
    *fd = -1;
  }
}

std::string UpgradingTransport::PathTo(int peer) {
  std::shared_lock<std::shared_mutex> lk(peers_mu_);
  auto it = outs_.find(peer);
  if (it == outs_.end()) return "zmq";
  std::lock_guard<std::mutex> g(it->second->mu);
  if (it->second->state != Out::kActive) return "zmq";
  return DataPathName(it->second->kind->kind());
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
  return RegisterTransport(kNodeTransport, create) && RegisterTransport("shm", create);
}();
}  // namespace

int DirectTcpPort(Transport& t) {
  auto* s = dynamic_cast<upgrade::UpgradingTransport*>(&t);
  return s ? s->DirectPort() : 0;
}

}  // namespace pskv
