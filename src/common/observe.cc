#include "common/observe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "common/logging.h"
#include "pskv/error.h"

namespace pskv::obs {

namespace {

// Latency buckets (seconds), Prometheus' default set extended down to 10 us.
constexpr std::array<double, 14> kBuckets = {1e-5, 5e-5,   1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                                             1e-2, 2.5e-2, 5e-2, 0.1,  0.25, 1.0,    10.0};

struct Histogram {
  std::array<uint64_t, kBuckets.size()> counts{};
  uint64_t count = 0;
  double sum = 0;
  void Add(double s) {
    for (size_t i = 0; i < kBuckets.size(); ++i)
      if (s <= kBuckets[i]) ++counts[i];
    ++count;
    sum += s;
  }
};

struct OpStats {
  uint64_t ops = 0, failed = 0, bytes = 0;
  Histogram latency;
};

struct State {
  std::mutex mu;
  bool configured = false;
  std::string role;
  // timeline
  FILE* trace = nullptr;
  bool first_event = true;
  std::string pending;  // formatted events not yet written
  // metrics; keys are bounded by the job's keys and peers by its nodes
  std::map<std::pair<std::string, std::string>, OpStats> ops;     // (op, key)
  std::map<std::pair<std::string, std::string>, uint64_t> peers;  // (peer, direction)
  std::map<std::string, OpStats> peer_ops;                        // by peer
  std::string metrics_file;
  int port = 0;
  int listen_fd = -1;
};

State& S() {
  static State* s = new State;  // never destroyed: used from atexit and other threads
  return *s;
}

std::atomic<bool> g_enabled{false};
std::atomic<bool> g_timeline{false};
std::atomic<bool> g_metrics{false};

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += ' ';
      continue;
    }
    o += c;
  }
  return o;
}

std::string LabelEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c == '\n' ? ' ' : c;
  }
  return o;
}

void WritePendingLocked(State& s) {
  if (s.trace && !s.pending.empty()) {
    std::fwrite(s.pending.data(), 1, s.pending.size(), s.trace);
    std::fflush(s.trace);
  }
  s.pending.clear();
}

void AtExit() {
  Flush();
  State& s = S();
  std::string file;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    file = s.metrics_file;
  }
  if (file.empty()) return;
  const std::string text = PrometheusText();  // the same text the endpoint serves
  if (FILE* f = std::fopen(file.c_str(), "w")) {
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
}

// One connection of the metrics endpoint: the request head is read until its blank
// line (at most 8 KiB), then the response is written; every step is nonblocking.
struct Conn {
  int fd = -1;
  std::string in, out;
  size_t off = 0;          // bytes of `out` sent
  bool answering = false;  // the request was read: writing `out`
  std::chrono::steady_clock::time_point read_until, close_at;
};

// Serves scrapes without letting one client hold up another: nonblocking sockets
// served together with poll(), at most kMaxConns at once (the oldest still-silent
// one gives way to a new one), 2 s to send the request head (answered anyway after
// that) and 10 s for the whole exchange. The text is built from a snapshot of the
// counters (PrometheusText): operations never wait for a scrape.
void Serve() {
  constexpr size_t kMaxConns = 16;
  constexpr auto kReadFor = std::chrono::seconds(2), kLiveFor = std::chrono::seconds(10);
  State& s = S();
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  // Accepted until EAGAIN below: the listening socket must not block.
  ::fcntl(s.listen_fd, F_SETFL, ::fcntl(s.listen_fd, F_GETFL) | O_NONBLOCK);
  auto answer = [](Conn& c) {
    const std::string body = PrometheusText();
    c.out = "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
            std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    c.answering = true;
    c.in.clear();
  };
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    int wait_ms = 1000;
    for (auto& c : conns) {
      const auto due = c.answering ? c.close_at : std::min(c.read_until, c.close_at);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(due - now).count();
      wait_ms = static_cast<int>(std::clamp<int64_t>(ms + 1, 0, wait_ms));
    }
    fds.assign(1, pollfd{s.listen_fd, POLLIN, 0});
    for (auto& c : conns)
      fds.push_back(pollfd{c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    if (::poll(fds.data(), fds.size(), wait_ms) < 0) continue;
    now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      const short ev = fds[i + 1].revents;
      bool done = false;
      if (!c.answering && (ev & (POLLIN | POLLHUP | POLLERR))) {
        char buf[4096];
        const ssize_t n = ::recv(c.fd, buf, std::min(sizeof buf, 8192 - c.in.size()), 0);
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
        if (n == 0 || c.in.find("\r\n\r\n") != std::string::npos || c.in.size() >= 8192) {
          answer(c);  // every path is answered with the metrics
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
      if (!done && !c.answering && now >= c.read_until) answer(c);  // a silent client
      if (done || now >= c.close_at) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    if (!(fds[0].revents & POLLIN)) continue;
    for (;;) {
      const int fd = ::accept4(s.listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
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
}

// Binds the first free port in [port, port + 64): the processes of a job on one
// host share one PSKV_METRICS_PORT setting.
int Listen(const std::string& host, int port, int* bound) {
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

// "dir/trace.json" -> "dir/trace.<role>.<pid>.json": one file per process.
std::string PerProcess(std::string path, const std::string& role) {
  const auto slash = path.rfind('/');
  auto dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) dot = path.size();
  path.insert(dot, "." + role + "." + std::to_string(::getpid()));
  return path;
}

}  // namespace

uint64_t NowUs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

bool Enabled() {
  return g_enabled.load(std::memory_order_relaxed);
}

void Configure(const Options& options, const std::string& role) {
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.configured) return;
  if (options.timeline_path.empty() && options.metrics_port <= 0 && options.metrics_file.empty())
    return;  // asks for nothing: a later call may still enable something
  s.configured = true;
  s.role = role;
  if (!options.timeline_path.empty()) {
    const std::string path = PerProcess(options.timeline_path, role);
    s.trace = std::fopen(path.c_str(), "w");
    if (!s.trace)
      throw IOError("PSKV_TIMELINE: cannot write " + path + ": " + std::strerror(errno));
    std::fprintf(
        s.trace,
        "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"%s %d\"}}",
        static_cast<int>(::getpid()), JsonEscape(role).c_str(), static_cast<int>(::getpid()));
    s.first_event = false;
    g_timeline = true;
    PSKV_INFO("timeline: " << path);
  }
  if (options.metrics_port > 0 || !options.metrics_file.empty()) {
    g_metrics = true;
    if (!options.metrics_file.empty()) s.metrics_file = PerProcess(options.metrics_file, role);
  }
  if (options.metrics_port > 0) {
    s.listen_fd = Listen(options.metrics_host, options.metrics_port, &s.port);
    if (s.listen_fd < 0)
      throw IOError("PSKV_METRICS_PORT: no free port in " + std::to_string(options.metrics_port) +
                    ".." + std::to_string(options.metrics_port + 63));
    std::thread(Serve).detach();  // lives as long as the process
    PSKV_INFO("metrics: http://" << options.metrics_host << ":" << s.port << "/metrics");
  }
  if (g_timeline || g_metrics) {
    g_enabled = true;
    std::atexit(AtExit);
  }
}

void Span(const char* name, const char* lane, const std::string& key, uint64_t bytes,
          uint64_t t0_us, uint64_t t1_us) {
  if (!g_timeline.load(std::memory_order_relaxed)) return;
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%llu,\"dur\":%llu,\"pid\":%d,"
      "\"tid\":\"%s\",\"args\":{\"key\":\"%s\",\"bytes\":%llu}}",
      name, lane, static_cast<unsigned long long>(t0_us),
      static_cast<unsigned long long>(t1_us > t0_us ? t1_us - t0_us : 0),
      static_cast<int>(::getpid()), lane, JsonEscape(key).c_str(),
      static_cast<unsigned long long>(bytes));
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.trace) return;
  s.pending += buf;
  if (s.pending.size() > (1 << 20)) WritePendingLocked(s);
}

void CountOp(const char* op, const std::string& key, uint64_t bytes, uint64_t latency_us,
             bool failed) {
  if (!g_metrics.load(std::memory_order_relaxed)) return;
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  OpStats& st = s.ops[{op, key}];
  ++st.ops;
  st.failed += failed;
  st.bytes += bytes;
  st.latency.Add(static_cast<double>(latency_us) * 1e-6);
}

namespace {
std::string PeerName(const std::string& peer) {
  return peer.substr(0, peer.find(" at "));  // "worker[1] at host:port"
}
}  // namespace

void CountPeer(const std::string& peer, const char* direction, uint64_t bytes) {
  if (!g_metrics.load(std::memory_order_relaxed)) return;
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  s.peers[{PeerName(peer), direction}] += bytes;
}

void CountPeerOp(const std::string& peer, uint64_t latency_us, bool failed) {
  if (!g_metrics.load(std::memory_order_relaxed)) return;
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  OpStats& st = s.peer_ops[PeerName(peer)];
  ++st.ops;
  st.failed += failed;
  st.latency.Add(static_cast<double>(latency_us) * 1e-6);
}

std::string PrometheusText() {
  State& s = S();
  // A copy of the counters taken under the lock (a few hundred bytes per key), the
  // text built after it: operations count under the same lock and never wait for
  // the formatting of a scrape.
  // Flat vectors, sized first: one allocation each and short (SSO) strings, so the
  // lock is held for little more than a memcpy of the counters.
  std::vector<std::pair<std::pair<std::string, std::string>, OpStats>> ops;
  std::vector<std::pair<std::pair<std::string, std::string>, uint64_t>> peers;
  std::vector<std::pair<std::string, OpStats>> peer_ops;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    ops.reserve(s.ops.size());
    ops.assign(s.ops.begin(), s.ops.end());
    peers.assign(s.peers.begin(), s.peers.end());
    peer_ops.assign(s.peer_ops.begin(), s.peer_ops.end());
  }
  const std::string node = "node=\"" + LabelEscape(LogName()) + "\"";
  std::string o;
  auto label = [&](const std::string& op, const std::string& key) {
    return "{" + node + ",op=\"" + LabelEscape(op) + "\",key=\"" + LabelEscape(key) + "\"";
  };
  o += "# HELP pskv_ops_total Operations completed on this node, by operation and key.\n"
       "# TYPE pskv_ops_total counter\n";
  for (auto& [k, st] : ops)
    o += "pskv_ops_total" + label(k.first, k.second) + "} " + std::to_string(st.ops) + "\n";
  o += "# HELP pskv_op_errors_total Operations that failed, by operation and key.\n"
       "# TYPE pskv_op_errors_total counter\n";
  for (auto& [k, st] : ops)
    o +=
        "pskv_op_errors_total" + label(k.first, k.second) + "} " + std::to_string(st.failed) + "\n";
  o += "# HELP pskv_bytes_total Bytes moved by operations, by operation and key.\n"
       "# TYPE pskv_bytes_total counter\n";
  for (auto& [k, st] : ops)
    o += "pskv_bytes_total" + label(k.first, k.second) + "} " + std::to_string(st.bytes) + "\n";
  // One histogram per (metric, label set): per operation and key, and per peer.
  auto histogram = [&](const std::string& name, const std::string& l, const Histogram& h) {
    char num[64];
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      std::snprintf(num, sizeof num, "%g", kBuckets[i]);
      o += name + "_bucket" + l + ",le=\"" + num + "\"} " + std::to_string(h.counts[i]) + "\n";
    }
    o += name + "_bucket" + l + ",le=\"+Inf\"} " + std::to_string(h.count) + "\n";
    std::snprintf(num, sizeof num, "%.9g", h.sum);
    o += name + "_sum" + l + "} " + num + "\n";
    o += name + "_count" + l + "} " + std::to_string(h.count) + "\n";
  };
  o += "# HELP pskv_op_latency_seconds Latency of operations, by operation and key.\n"
       "# TYPE pskv_op_latency_seconds histogram\n";
  for (auto& [k, st] : ops) {
    histogram("pskv_op_latency_seconds", label(k.first, k.second), st.latency);
  }
  o += "# HELP pskv_peer_bytes_total Bytes exchanged with each peer node.\n"
       "# TYPE pskv_peer_bytes_total counter\n";
  for (auto& [k, v] : peers)
    o += "pskv_peer_bytes_total{" + node + ",peer=\"" + LabelEscape(k.first) + "\",direction=\"" +
         k.second + "\"} " + std::to_string(v) + "\n";
  auto peer_label = [&](const std::string& peer) {
    return "{" + node + ",peer=\"" + LabelEscape(peer) + "\"";
  };
  o += "# HELP pskv_peer_ops_total Requests exchanged with each peer node.\n"
       "# TYPE pskv_peer_ops_total counter\n";
  for (auto& [p, st] : peer_ops)
    o += "pskv_peer_ops_total" + peer_label(p) + "} " + std::to_string(st.ops) + "\n";
  o += "# HELP pskv_peer_errors_total Requests with each peer node that failed.\n"
       "# TYPE pskv_peer_errors_total counter\n";
  for (auto& [p, st] : peer_ops)
    o += "pskv_peer_errors_total" + peer_label(p) + "} " + std::to_string(st.failed) + "\n";
  o += "# HELP pskv_peer_latency_seconds Latency of requests, by peer node (worker: request to "
       "answer; server: receipt to answer).\n"
       "# TYPE pskv_peer_latency_seconds histogram\n";
  for (auto& [p, st] : peer_ops) histogram("pskv_peer_latency_seconds", peer_label(p), st.latency);
  return o;
}

StepScope::StepScope(const char* step, int64_t key, uint64_t bytes, std::string peer,
                     const char* direction)
    : step_(step), key_(key), bytes_(bytes), peer_(std::move(peer)), direction_(direction) {
  if (Enabled()) t0_ = NowUs();
}

StepScope::~StepScope() {
  if (!t0_) return;
  const uint64_t t1 = NowUs();
  const std::string key = std::to_string(key_);
  Span(step_, step_, key, bytes_, t0_, t1);
  CountOp(step_, key, bytes_, t1 - t0_);
  if (!peer_.empty()) CountPeer(peer_, direction_, bytes_);
}

int MetricsPort() {
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.port;
}

void Flush() {
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.trace) return;
  WritePendingLocked(s);
  std::fputs("\n]\n", s.trace);
  std::fclose(s.trace);
  s.trace = nullptr;
  g_timeline = false;
}

}  // namespace pskv::obs
