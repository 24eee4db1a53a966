#include "transport/tcp/direct_tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "common/logging.h"
#include "pskv/error.h"

namespace pskv::direct {

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kHelloMagic[8] = {'P', 'S', 'K', 'V', 'T', 'C', 'P', 'H'};
constexpr char kAckMagic[8] = {'P', 'S', 'K', 'V', 'T', 'C', 'P', 'A'};

std::string Hex(const Nonce& n) {
  char buf[2 * 16 + 1];
  sodium_bin2hex(buf, sizeof buf, n.data(), n.size());
  return buf;
}

// What a proof's MAC covers: its direction, the job and the offer's nonce.
std::string Label(const JobKeys& keys, bool hello, const Nonce& n) {
  return std::string(hello ? "pskv-direct-hello " : "pskv-direct-ack ") +
         std::to_string(keys.job()) + " " + Hex(n);
}

void NoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string AddrOf(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return buf;
}

}  // namespace

std::string Proof(const JobKeys& keys, bool hello, const Nonce& nonce) {
  std::string p(hello ? kHelloMagic : kAckMagic, 8);
  p.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  p += keys.Password(Label(keys, hello, nonce));
  return p;
}

bool CheckProof(const JobKeys& keys, bool hello, const char* p, Nonce* nonce) {
  if (std::memcmp(p, hello ? kHelloMagic : kAckMagic, 8) != 0) return false;
  std::memcpy(nonce->data(), p + 8, nonce->size());
  const std::string want = keys.Password(Label(keys, hello, *nonce));
  return want.size() == 64 && sodium_memcmp(want.data(), p + 24, 64) == 0;
}

// ------------------------------------------------------------------ Listener

Listener::~Listener() {
  Close();
}

void Listener::Open(const std::string& host) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (host != "0.0.0.0" && ::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1)
    ip_ = a.sin_addr.s_addr;
  else
    a.sin_addr.s_addr = htonl(INADDR_ANY);
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw IOError(std::string("direct TCP: socket failed: ") + std::strerror(errno));
  socklen_t len = sizeof a;
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    Close();
    throw IOError("direct TCP: cannot listen on " + host + ": " + std::strerror(e));
  }
  port_ = ntohs(a.sin_port);
}

void Listener::PollFds(std::vector<pollfd>* fds) const {
  if (fd_ < 0) return;
  fds->push_back({fd_, POLLIN, 0});
  for (const Unproven& u : unproven_) fds->push_back({u.fd, POLLIN, 0});
}

void Listener::Drop(size_t i) {
  ::close(unproven_[i].fd);
  unproven_.erase(unproven_.begin() + static_cast<std::ptrdiff_t>(i));
}

// Reads what `u` sent; true when it is finished with (claimed, or closed).
bool Listener::TryProof(Unproven& u, const std::function<bool(const Nonce&, int)>& claim) {
  const ssize_t k = ::recv(u.fd, u.buf + u.have, kProofBytes - u.have, MSG_DONTWAIT);
  if (k > 0) u.have += static_cast<size_t>(k);
  if (u.have == kProofBytes) {
    Nonce nonce;
    if (CheckProof(keys_, true, u.buf, &nonce)) {
      NoDelay(u.fd);
      if (claim(nonce, u.fd)) return true;  // the socket is the caller's now
    } else {
      PSKV_LOG_LIMITED(limiter_, "proof/" + u.addr, "WARN",
                       "closed a direct TCP connection from "
                           << u.addr << ": it did not prove it belongs to this job");
    }
    ::close(u.fd);
    return true;
  }
  const bool gone = k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  if (gone || Clock::now() >= u.deadline) {
    ::close(u.fd);
    return true;
  }
  return false;
}

void Listener::Service(const std::function<bool(const Nonce&, int)>& claim) {
  if (fd_ < 0) return;
  // Those waiting first: a connection that proved itself is never pushed out.
  std::erase_if(unproven_, [&](Unproven& u) { return TryProof(u, claim); });
  // Then new ones (bounded per turn), each read at once: its proof is usually
  // there already. Only one still silent waits; the admission policy then says
  // whose oldest goes (the newcomer itself if it is the only one of that address).
  for (int n = 0; n < 64; ++n) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    const int c =
        ::accept4(fd_, reinterpret_cast<sockaddr*>(&a), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) break;
    Unproven u;
    u.fd = c;
    u.addr = AddrOf(a);
    u.deadline = Clock::now() + timeout_;
    if (TryProof(u, claim)) continue;
    unproven_.push_back(std::move(u));  // oldest first
    for (;;) {
      std::map<std::string, size_t> waiting;
      for (const Unproven& x : unproven_) waiting[x.addr]++;
      const std::optional<std::string> source = admission_.Victim(waiting);
      if (!source) break;
      for (size_t i = 0; i < unproven_.size(); ++i)
        if (unproven_[i].addr == *source) {
          Drop(i);
          break;
        }
    }
  }
}

void Listener::Close() {
  for (Unproven& u : unproven_) ::close(u.fd);
  unproven_.clear();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

// ------------------------------------------------------------------ connect

int StartConnect(uint32_t ip, uint16_t port, std::string* why) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  NoDelay(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = ip;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    *why = std::string("connect: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

int ConnectError(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

void KeepAlive(int fd, std::chrono::milliseconds interval, std::chrono::milliseconds timeout) {
  if (interval.count() <= 0) return;
  const int on = 1;
  const int ivl = static_cast<int>(std::max<int64_t>(1, interval.count() / 1000));
  const int cnt = static_cast<int>(
      std::clamp<int64_t>(timeout.count() / std::max<int64_t>(1, interval.count()), 1, 100));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &ivl, sizeof ivl);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &ivl, sizeof ivl);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  // Not TCP_USER_TIMEOUT: a live peer that is busy (not reading, zero window)
  // must not lose its connection; keep-alive probes are answered by its kernel.
}

bool MaxPacingRate(int fd, uint64_t bytes_per_s) {
  // The 64-bit form (Linux >= 4.20 reads 8 bytes), so that caps above 4.29 GB/s
  // hold; all ones means no cap. An older kernel reads the first 4 bytes only and
  // answers getsockopt with 4: there the 32-bit form, saturated, is the best it has.
  const uint64_t v = bytes_per_s == 0 ? ~uint64_t{0} : bytes_per_s;
  if (::setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &v, sizeof v) != 0) return false;
  uint64_t got = 0;
  socklen_t len = sizeof got;
  if (::getsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &got, &len) == 0 && len == sizeof got &&
      got == v)
    return true;
  const uint32_t v32 =
      bytes_per_s == 0 ? ~0U : static_cast<uint32_t>(std::min<uint64_t>(bytes_per_s, ~0U - 1));
  return ::setsockopt(fd, SOL_SOCKET, SO_MAX_PACING_RATE, &v32, sizeof v32) == 0;
}

bool SendAll(int fd, const std::string& p) {
  const ssize_t k = ::send(fd, p.data(), p.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return k == static_cast<ssize_t>(p.size());
}

// ------------------------------------------------------------------ write

uint64_t Write(int fd, std::deque<framing::OutMsg>& q, uint64_t budget, int* err) {
  *err = 0;
  uint64_t written = 0;
  constexpr int kIov = 64;
  while (!q.empty() && written < budget) {
    iovec iov[kIov];
    int n = 0;
    uint64_t bytes = 0;
    for (size_t m = 0; m < q.size() && n < kIov && bytes < budget - written; ++m) {
      const framing::OutMsg& msg = q[m];
      for (size_t p = m == 0 ? msg.piece : 0; p < msg.pieces() && n < kIov; ++p) {
        auto [ptr, len] = msg.Piece(p);
        const uint64_t off = m == 0 && p == msg.piece ? msg.offset : 0;
        if (len == off) continue;
        iov[n++] = {const_cast<char*>(ptr + off), len - off};
        bytes += len - off;
      }
    }
    if (n == 0) {  // only empty pieces left
      framing::Consume(q, 0);
      continue;
    }
    msghdr h{};
    h.msg_iov = iov;
    h.msg_iovlen = static_cast<size_t>(n);
    const ssize_t k = ::sendmsg(fd, &h, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) *err = errno;
      return written;
    }
    framing::Consume(q, static_cast<uint64_t>(k));
    written += static_cast<uint64_t>(k);
    if (static_cast<uint64_t>(k) < bytes) return written;  // the socket is full
  }
  return written;
}

// ------------------------------------------------------------------ Reader

Reader::Result Reader::PumpAck(int fd, const JobKeys& keys, const char** why) {
  while (ack_have_ < kProofBytes) {
    const ssize_t k = ::recv(fd, ack_ + ack_have_, kProofBytes - ack_have_, MSG_DONTWAIT);
    if (k == 0) return kClosed;
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return kAgain;
      *why = "connection failed";
      return kBad;
    }
    ack_have_ += static_cast<size_t>(k);
  }
  Nonce n;
  if (!CheckProof(keys, false, ack_, &n) || n != nonce_) {
    *why = "the other end did not prove it is the node that offered the connection";
    return kBad;
  }
  return kNone;
}

void Reader::SetLowWater(int fd) {
  const auto [dst, want] = parser_.Want();
  int mark = LowWaterFor(parser_.InBody(), want);
  if (mark == lowat_) return;
  if (mark > 1) {
    // Never above a quarter of the receive buffer: a mark the buffer cannot hold
    // twice over makes the kernel grow the buffer and clamp the receive window to
    // the mark (tcp_set_rcvlowat), which would cap the rate of a long link. The
    // buffer grows by itself (autotuning) on a connection that moves much.
    int buf = 0;
    socklen_t len = sizeof buf;
    if (::getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, &len) != 0) buf = 0;
    mark = std::min(mark, buf / 4);
    if (mark < static_cast<int>(kLowWaterMin)) mark = 1;
    if (mark == lowat_) return;
  }
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &mark, sizeof mark) == 0)
    lowat_ = mark;
  else if (mark == 1)
    lowat_ = 1;  // refused (not TCP): nothing was raised either
}

Reader::Result Reader::Pump(int fd, const JobKeys& keys, uint64_t budget, const char** why) {
  if (!acked()) {
    const Result r = PumpAck(fd, keys, why);
    if (r != kNone) return r;
  }
  const Result r = PumpFrames(fd, budget, why);
  // The caller may sleep on the socket after either: the mark follows the parser
  // (back to 1 once the body ended; a syscall only where the mark changes).
  if (r == kAgain || r == kMessage) SetLowWater(fd);
  return r;
}

Reader::Result Reader::PumpFrames(int fd, uint64_t budget, const char** why) {
  uint64_t read = 0;
  for (;;) {
    auto [dst, want] = parser_.Want();
    uint64_t n = 0;
    if (pos_ < len_) {
      n = std::min<uint64_t>(want, len_ - pos_);
      std::memcpy(dst, stage_.get() + pos_, n);
      pos_ += n;
    } else {
      if (read >= budget) return kNone;
      const bool direct = want >= kDirectRead;
      const ssize_t k =
          ::recv(fd, direct ? dst : stage_.get(), direct ? want : kStage, MSG_DONTWAIT);
      if (k == 0) {
        if (parser_.Idle()) return kClosed;
        *why = "connection closed in the middle of a message";
        return kBad;
      }
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return kAgain;
        *why = "connection failed";
        return kBad;
      }
      read += static_cast<uint64_t>(k);
      drained_ = static_cast<uint64_t>(k) < (direct ? want : kStage);
      if (!direct) {
        pos_ = 0;
        len_ = static_cast<size_t>(k);
        continue;
      }
      n = static_cast<uint64_t>(k);
    }
    const char* bad = nullptr;
    const bool done = parser_.Got(n, &bad);
    if (bad) {
      *why = bad;
      return kBad;
    }
    if (done) return kMessage;
  }
}

}  // namespace pskv::direct
