#include "common/metrics_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

#include "pskv/error.h"

namespace pskv::obs {

namespace {

// One connection of the metrics endpoint: the request head is read until its blank
// line (at most 8 KiB), then the response is written; every step is nonblocking.
struct Conn {
  int fd = -1;
  std::string in, out;
  size_t off = 0;          // bytes of `out` sent
  bool answering = false;  // the request was read: writing `out`
  std::chrono::steady_clock::time_point read_until, close_at;
};

constexpr size_t kMaxConns = 16;
constexpr auto kReadFor = std::chrono::seconds(2), kLiveFor = std::chrono::seconds(10);
using Clock = std::chrono::steady_clock;

// How long poll() may wait: until the next connection's deadline, at most 1 s.
int WaitMs(const std::vector<Conn>& conns, Clock::time_point now) {
  int wait_ms = 1000;
  for (auto& c : conns) {
    const auto due = c.answering ? c.close_at : std::min(c.read_until, c.close_at);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(due - now).count();
    wait_ms = static_cast<int>(std::clamp<int64_t>(ms + 1, 0, wait_ms));
  }
  return wait_ms;
}

// One step of connection `c` after poll() reported `ev`: reads the request head or
// writes the answer; closes it when it is done, failed or out of time.
void Step(Conn& c, short ev, Clock::time_point now, const std::function<std::string()>& text) {
  bool done = false;
  if (!c.answering && (ev & (POLLIN | POLLHUP | POLLERR))) {
    char buf[4096];
    const ssize_t n = ::recv(c.fd, buf, std::min(sizeof buf, 8192 - c.in.size()), 0);
    if (n > 0) c.in.append(buf, static_cast<size_t>(n));
    if (n == 0 || c.in.find("\r\n\r\n") != std::string::npos || c.in.size() >= 8192) {
      // every path is answered with the metrics
      const std::string body = text();
      c.out = "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
              std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
      c.answering = true;
      c.in.clear();
    } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      done = true;
    }
  } else if (c.answering && (ev & (POLLOUT | POLLHUP | POLLERR))) {
    const ssize_t n =
        ::send(c.fd, c.out.data() + c.off, c.out.size() - c.off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) c.off += static_cast<size_t>(n);
    if (c.off == c.out.size() ||
        (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      done = true;
  }
  // A client silent for kReadFor asked for nothing and gets nothing: answering it
  // would build the whole text for each connection of a flood and fill the slots
  // with answers nobody reads, shutting out a real scraper.
  if (!c.answering && now >= c.read_until) done = true;
  if (done || now >= c.close_at) {
    ::close(c.fd);
    c.fd = -1;
  }
}

// Accepts every waiting connection, within kMaxConns.
void AcceptAll(int listen_fd, std::vector<Conn>& conns, Clock::time_point now) {
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    if (conns.size() >= kMaxConns) {
      // The oldest connection that has not sent its request gives way; if every one
      // is being answered, the new one is closed at once.
      auto it =
          std::find_if(conns.begin(), conns.end(), [](const Conn& c) { return !c.answering; });
      if (it == conns.end()) {
        ::close(fd);
        continue;
      }
      ::close(it->fd);
      conns.erase(it);
    }
    Conn c;
    c.fd = fd;
    c.read_until = now + kReadFor;
    c.close_at = now + kLiveFor;
    conns.push_back(std::move(c));
  }
}

}  // namespace

// Serves scrapes without letting one client hold up another: nonblocking sockets
// served together with poll(), at most kMaxConns at once (the oldest still-silent
// one gives way to a new one), 2 s to send the request head (closed unanswered after
// that) and 10 s for the whole exchange. The text is built from a snapshot of the
// counters (PrometheusText): operations never wait for a scrape.
void ServeMetrics(int listen_fd, const std::function<std::string()>& text) {
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  // Accepted until EAGAIN below: the listening socket must not block.
  ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  for (;;) {
    const int wait_ms = WaitMs(conns, Clock::now());
    fds.assign(1, pollfd{listen_fd, POLLIN, 0});
    for (auto& c : conns)
      fds.push_back(pollfd{c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    if (::poll(fds.data(), fds.size(), wait_ms) < 0) continue;
    const auto now = Clock::now();
    for (size_t i = 0; i < conns.size(); ++i) Step(conns[i], fds[i + 1].revents, now, text);
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    if (fds[0].revents & POLLIN) AcceptAll(listen_fd, conns, now);
  }
}

// Binds the first free port in [port, port + 64): the processes of a job on one
// host share one PSKV_METRICS_PORT setting.
int ListenForMetrics(const std::string& host, int port, int* bound) {
  in_addr addr{};
  if (::inet_pton(AF_INET, host.c_str(), &addr) != 1)
    throw ConfigError("PSKV_METRICS_HOST='" + host +
                      "' is not an IPv4 address (127.0.0.1: this host only; 0.0.0.0: every "
                      "interface)");
  for (int p = port; p < port + 64 && p <= 65535; ++p) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr = addr;
    a.sin_port = htons(static_cast<uint16_t>(p));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 16) == 0) {
      *bound = p;
      return fd;
    }
    ::close(fd);
  }
  return -1;
}

}  // namespace pskv::obs
