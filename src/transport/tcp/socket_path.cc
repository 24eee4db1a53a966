#include "transport/tcp/socket_path.h"

#include <arpa/inet.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "common/logging.h"
#include "common/payload_reader.h"
#include "pskv/error.h"
#include "transport/tcp/direct_tcp.h"
#include "transport/upgrade/control_codec.h"

namespace pskv::direct {
namespace {

using upgrade::Clock;
using upgrade::InPath;
using upgrade::OutPath;
using upgrade::Signal;

// Bytes one Write puts into a socket before letting go of the peer's lock;
// bytes one Pump reads from one socket before the Recv thread looks at others.
constexpr uint64_t kSocketBudget = 4 << 20;
// An offer nobody took (declined, or crowded out at the listener) is made again
// after this.
constexpr auto kReofferAfter = std::chrono::seconds(30);

bool Watch(int epfd, int fd, int op, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  return ::epoll_ctl(epfd, op, fd, &ev) == 0;
}

class SocketOut final : public OutPath {
 public:
  SocketOut(const upgrade::PathHost& host) : host_(host) {}
  ~SocketOut() override { Close(false); }

  // The listener found the receiver's proven connection for this offer.
  bool Adopt(int fd) {
    if (sock_ >= 0 || closed_) return false;
    if (!SendAll(fd, Proof(*host_.keys, false, nonce_))) return false;
    KeepAlive(fd, host_.cfg->keepalive_interval, host_.cfg->keepalive_timeout);
    sock_ = fd;
    if (pacing_) MaxPacingRate(sock_, pacing_);
    return true;
  }

  void SetPacingRate(uint64_t bytes_per_s) override {
    if (bytes_per_s == pacing_) return;
    pacing_ = bytes_per_s;
    if (sock_ >= 0) MaxPacingRate(sock_, bytes_per_s);
  }
  bool SendStats(TcpSendStats* out) const override {
    return sock_ >= 0 && ReadSendStats(sock_, out);
  }
  upgrade::Nonce nonce_{};

  Taken Accepted(std::string*) override { return sock_ < 0 ? Taken::kWaiting : Taken::kTaken; }

  Written Write(std::deque<framing::OutMsg>& q, bool from_writer, uint64_t* written,
                std::string* why) override {
    int err = 0;
    *written = direct::Write(sock_, q, kSocketBudget, &err);
    if (err) {
      // The receiver closed (it found something invalid, or it died). Unread
      // messages are lost, never reordered.
      *why = std::string("the direct TCP connection failed (") + std::strerror(err) + ")";
      return Written::kBroken;
    }
    // The writer thread carries on (it waits for POLLOUT); it need not wake itself.
    if (!q.empty() && !from_writer) Signal(host_.tx_wake);
    return Written::kOk;
  }

  void WatchForSpace(std::vector<pollfd>* fds) const override {
    if (sock_ >= 0) fds->push_back({sock_, POLLOUT, 0});
  }

  // A socket's kernel buffer still goes out before its end.
  void Close(bool) override {
    closed_ = true;
    if (sock_ >= 0) ::close(sock_);
    sock_ = -1;
  }

 private:
  const upgrade::PathHost host_;
  int sock_ = -1;  // the receiver's proven connection
  bool closed_ = false;
  uint64_t pacing_ = 0;  // SetPacingRate (0: none)
};

// Connecting, reading the sender's ACK, parked (ACK read, SWITCH not yet: not
// watched once data waits), reading messages.
class SocketIn final : public InPath {
 public:
  SocketIn(const upgrade::PathHost& host, int fd, const upgrade::Nonce& nonce)
      : host_(host),
        sock_(fd),
        nonce_(nonce),
        reader_(host.cfg->max_frame, nonce),
        since_(Clock::now()) {}
  ~SocketIn() override { Close(); }

  int fd() const override { return sock_; }

  Status OnEvent(uint32_t, const char** why) override {
    if (st_ == kConnecting) {
      if (ConnectError(sock_) != 0) {
        *why = "could not connect to the sender's port; using ZeroMQ";
        return Status::kDrop;
      }
      if (!SendAll(sock_, Proof(*host_.keys, true, nonce_))) {
        *why = "could not send the proof";
        return Status::kDrop;
      }
      st_ = kAck;
      Watch(host_.epfd, sock_, EPOLL_CTL_MOD, EPOLLIN);
    } else if (st_ == kAck) {
      switch (reader_.PumpAck(sock_, *host_.keys, why)) {
        case Reader::kNone:  // ACK complete
          if (active_) {
            st_ = kReading;
            readable_ = true;
          } else {
            st_ = kParked;  // until SWITCH; still watched for its end
          }
          break;
        case Reader::kAgain:
          break;
        case Reader::kClosed:
          *why = nullptr;
          return Status::kDrop;
        default:
          return Status::kDrop;
      }
    } else if (st_ == kParked) {
      // Before SWITCH: the writer closed (drop it), or data came ahead of its
      // SWITCH (stop watching until SWITCH).
      char c;
      const ssize_t k = ::recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        *why = nullptr;
        return Status::kDrop;
      }
      if (k > 0) {
        ::epoll_ctl(host_.epfd, EPOLL_CTL_DEL, sock_, nullptr);
        data_waiting_ = true;
      }
    } else {
      readable_ = true;
    }
    return Status::kOk;
  }

  Status Activate(const char** why) override {
    active_ = true;
    if (st_ != kParked) return Status::kOk;
    st_ = kReading;
    readable_ = true;
    // Watched again, or still (no data came ahead of SWITCH).
    if (!Watch(host_.epfd, sock_, data_waiting_ ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, EPOLLIN)) {
      *why = "cannot watch the connection";
      return Status::kDrop;
    }
    return Status::kOk;
  }

  Status Check(Clock::time_point now, const char** why) override {
    if (st_ != kParked && st_ != kReading && now - since_ > host_.cfg->handshake_timeout) {
      *why = "the connection was not set up in time";
      return Status::kDrop;
    }
    return data_waiting_ ? Status::kDataWaiting : Status::kOk;
  }

  Read Pump(std::vector<Frame>* frames, const char** why) override {
    if (st_ != kReading) {
      // Switched, but still connecting or reading the ACK.
      if (Clock::now() - since_ > host_.cfg->handshake_timeout) {
        *why = "the connection was not set up in time";
        return Read::kBad;
      }
      return Read::kNothing;
    }
    if (!(readable_ || reader_.buffered())) return Read::kNothing;
    switch (reader_.Pump(sock_, *host_.keys, kSocketBudget, why)) {
      case Reader::kMessage:
        *frames = reader_.Take();
        readable_ = !reader_.drained();  // epoll says when more comes
        return Read::kMessage;
      case Reader::kAgain:
        readable_ = false;
        return Read::kNothing;
      case Reader::kNone:
        return Read::kNothing;
      case Reader::kClosed:
        return Read::kClosed;  // the writer closed and everything was read
      case Reader::kBad:
        return Read::kBad;
    }
    return Read::kNothing;
  }

  bool Arm() override { return st_ == kReading && (readable_ || reader_.buffered()); }

  void Close() override {
    if (sock_ < 0) return;
    // Explicitly: after a fork() the child holds the descriptor too, and close()
    // alone would leave it in the epoll set.
    ::epoll_ctl(host_.epfd, EPOLL_CTL_DEL, sock_, nullptr);
    ::close(sock_);
    sock_ = -1;
  }

 private:
  const upgrade::PathHost host_;
  int sock_;
  const upgrade::Nonce nonce_;
  Reader reader_;
  const Clock::time_point since_;  // connecting started
  enum { kConnecting, kAck, kParked, kReading } st_ = kConnecting;
  bool active_ = false;
  bool readable_ = false;
  bool data_waiting_ = false;  // parked, data came ahead of SWITCH (not watched)
};

class SocketPath final : public upgrade::DataPath {
 public:
  explicit SocketPath(const upgrade::PathHost& host)
      : host_(host),
        listener_(*host.keys, host.cfg->handshake_timeout,
                  static_cast<size_t>(std::max(0, host.cfg->max_pending_connections))) {}

  upgrade::PathKind kind() const override { return upgrade::PathKind::kTcp; }

  void Bind(const std::string& host) override {
    const TransportConfig& c = *host_.cfg;
    if (!c.tcp_direct || c.encrypt || c.scheduler) return;
    std::lock_guard<std::mutex> g(mu_);
    try {
      listener_.Open(host);
      ip_ = listener_.ip();
      port_ = listener_.port();
    } catch (const Error& e) {
      PSKV_WARN("direct TCP unavailable, messages to other hosts go through ZeroMQ: " << e.what());
    }
  }

  // Not with the scheduler: its messages are few and not latency bound, and it
  // would hold two more sockets per node.
  bool Wants(const std::string&, uint64_t token) const override {
    return port_ != 0 && token != kSchedulerToken;
  }

  std::unique_ptr<OutPath> Offer(upgrade::Nonce* nonce, std::string* details,
                                 std::string*) override {
    auto out = std::make_unique<SocketOut>(host_);
    randombytes_buf(out->nonce_.data(), out->nonce_.size());
    *nonce = out->nonce_;
    *details = EncodeTcpDetails({ip_, port_});
    return out;
  }
  std::chrono::milliseconds RetryDeclinedAfter() const override { return kReofferAfter; }

  // Connects to where the offering peer listens (the rest happens in OnEvent).
  std::unique_ptr<InPath> Accept(const upgrade::Offer& offer, const std::string& from,
                                 std::string* why) override {
    const TcpDetails d = DecodeTcpDetails(offer.details);
    if (!host_.cfg->tcp_direct || host_.cfg->encrypt) return nullptr;  // declined quietly
    uint32_t ip = d.ip;
    if (ip == 0 && ::inet_pton(AF_INET, from.c_str(), &ip) != 1) return nullptr;
    const int fd = StartConnect(ip, d.port, why);
    if (fd < 0) return nullptr;
    KeepAlive(fd, host_.cfg->keepalive_interval, host_.cfg->keepalive_timeout);
    auto in = std::make_unique<SocketIn>(host_, fd, offer.nonce);
    if (!Watch(host_.epfd, fd, EPOLL_CTL_ADD, EPOLLOUT)) {
      *why = "cannot watch the connection";
      return nullptr;
    }
    return in;
  }

  void PollFds(std::vector<pollfd>* fds) override {
    std::lock_guard<std::mutex> g(mu_);
    listener_.PollFds(fds);
  }

  // A receiver proved the nonce of an offer: the socket becomes that offer's,
  // and the ACK tells the receiver it reached us.
  void Service(const Adopt& adopt) override {
    std::lock_guard<std::mutex> g(mu_);
    listener_.Service([&](const Nonce& nonce, int fd) {
      return adopt(nonce, [fd](OutPath& p) { return static_cast<SocketOut&>(p).Adopt(fd); });
    });
  }

  void Close() override {
    std::lock_guard<std::mutex> g(mu_);
    listener_.Close();
  }
  int Port() const override { return port_; }

 private:
  const upgrade::PathHost host_;
  std::mutex mu_;      // the listener: the writer thread, and Bind/Close
  Listener listener_;  // under mu_
  std::atomic<uint32_t> ip_{0};
  std::atomic<uint16_t> port_{0};  // 0: no offers
};

}  // namespace

namespace {
constexpr auto kKind = static_cast<uint8_t>(upgrade::PathKind::kTcp);
}  // namespace

std::string EncodeTcpDetails(const TcpDetails& d) {
  ByteWriter w = BeginPayload(kKind, upgrade::kVersion);
  w.Put<uint32_t>(d.ip);
  w.Put<uint16_t>(d.port);
  return w.Take();
}

TcpDetails DecodeTcpDetails(const std::string& s) {
  PayloadReader r(s.data(), s.size(), "direct TCP offer");
  r.Header(kKind, 0, upgrade::kVersion);
  TcpDetails d;
  d.ip = r.Get<uint32_t>();
  d.port = r.Get<uint16_t>();
  r.End();
  return d;
}

std::unique_ptr<upgrade::DataPath> CreateSocketPath(const upgrade::PathHost& host) {
  return std::make_unique<SocketPath>(host);
}

namespace {
// After the ring: the peers the ring does not want.
const bool registered =
    upgrade::RegisterDataPath(upgrade::PathKind::kTcp, "tcp", "direct TCP", 10, CreateSocketPath);
}  // namespace

}  // namespace pskv::direct
