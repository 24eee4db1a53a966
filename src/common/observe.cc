#include "common/observe.h"

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
#include "common/metrics_endpoint.h"
#include "pskv/device.h"
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
    s.listen_fd = ListenForMetrics(options.metrics_host, options.metrics_port, &s.port);
    if (s.listen_fd < 0)
      throw IOError("PSKV_METRICS_PORT: no free port in " + std::to_string(options.metrics_port) +
                    ".." + std::to_string(options.metrics_port + 63));
    std::thread([fd = s.listen_fd] {
      ServeMetrics(fd, PrometheusText);
    }).detach();  // lives as long as the process
    PSKV_INFO("metrics: http://" << options.metrics_host << ":" << s.port << "/metrics");
  }
  if (g_timeline || g_metrics) {
    g_enabled = true;
    std::atexit(AtExit);
  }
}

void NameNode(const std::string& node) {
  if (!g_timeline.load(std::memory_order_relaxed)) return;
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      ",\n{\"name\":\"process_labels\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"labels\":\"%s\"}}",
      static_cast<int>(::getpid()), JsonEscape(node).c_str());
  State& s = S();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.trace) s.pending += buf;
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

namespace {

using KeyedOps = std::vector<std::pair<std::pair<std::string, std::string>, OpStats>>;
using PeerBytes = std::vector<std::pair<std::pair<std::string, std::string>, uint64_t>>;
using PeerOps = std::vector<std::pair<std::string, OpStats>>;

// One histogram per (metric, label set): per operation and key, and per peer.
void AppendHistogram(std::string& o, const std::string& name, const std::string& l,
                     const Histogram& h) {
  char num[64];
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    std::snprintf(num, sizeof num, "%g", kBuckets[i]);
    o += name + "_bucket" + l + ",le=\"" + num + "\"} " + std::to_string(h.counts[i]) + "\n";
  }
  o += name + "_bucket" + l + ",le=\"+Inf\"} " + std::to_string(h.count) + "\n";
  std::snprintf(num, sizeof num, "%.9g", h.sum);
  o += name + "_sum" + l + "} " + num + "\n";
  o += name + "_count" + l + "} " + std::to_string(h.count) + "\n";
}

// The metrics by operation and key.
void AppendOps(std::string& o, const std::string& node, const KeyedOps& ops) {
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
  o += "# HELP pskv_op_latency_seconds Latency of operations, by operation and key.\n"
       "# TYPE pskv_op_latency_seconds histogram\n";
  for (auto& [k, st] : ops) {
    AppendHistogram(o, "pskv_op_latency_seconds", label(k.first, k.second), st.latency);
  }
}

// The metrics by peer node.
void AppendPeers(std::string& o, const std::string& node, const PeerBytes& peers,
                 const PeerOps& peer_ops) {
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
  for (auto& [p, st] : peer_ops)
    AppendHistogram(o, "pskv_peer_latency_seconds", peer_label(p), st.latency);
}

// The device runtime's copy counters (pskv/device.h), always on.
void AppendDeviceCopies(std::string& o, const std::string& node) {
  const cuda::Counters c = cuda::Stats();
  const std::pair<const char*, std::pair<uint64_t, uint64_t>> kinds[] = {
      {"d2h", {c.d2h_bytes, c.d2h_count}},
      {"h2d", {c.h2d_bytes, c.h2d_count}},
      {"d2d", {c.d2d_bytes, c.d2d_count}},
      {"peer", {c.peer_bytes, c.peer_count}}};
  o += "# HELP pskv_device_copy_bytes_total Bytes copied by the device runtime, by kind "
       "(d2h, h2d, d2d, peer).\n# TYPE pskv_device_copy_bytes_total counter\n";
  for (auto& [kind, v] : kinds)
    o += "pskv_device_copy_bytes_total{" + node + ",kind=\"" + kind + "\"} " +
         std::to_string(v.first) + "\n";
  o += "# HELP pskv_device_copies_total Copies made by the device runtime, by kind.\n"
       "# TYPE pskv_device_copies_total counter\n";
  for (auto& [kind, v] : kinds)
    o += "pskv_device_copies_total{" + node + ",kind=\"" + kind + "\"} " +
         std::to_string(v.second) + "\n";
  o += "# HELP pskv_device_kernel_launches_total Kernels launched by the device runtime.\n"
       "# TYPE pskv_device_kernel_launches_total counter\n"
       "pskv_device_kernel_launches_total{" +
       node + "} " + std::to_string(c.kernel_launches) + "\n";
}

// Registered gauge sources (Gauges), by id. Their own mutex, held while they run, so
// that a Gauges' destructor waits for a scrape using it; never taken with State::mu.
struct GaugeRegistry {
  std::mutex mu;
  uint64_t next = 1;
  std::map<uint64_t, GaugeSource> sources;
};
GaugeRegistry& G() {
  static GaugeRegistry* g = new GaugeRegistry;  // never destroyed: used from atexit
  return *g;
}

// The gauges' samples, grouped by metric name (one HELP and TYPE line each).
void AppendGauges(std::string& o, const std::string& node) {
  std::vector<GaugeSample> samples;
  {
    GaugeRegistry& g = G();
    std::lock_guard<std::mutex> lk(g.mu);
    for (auto& [id, source] : g.sources) {
      try {
        source(&samples);
      } catch (const std::exception& e) {
        PSKV_WARN("metrics: a gauge source failed: " << e.what());
      }
    }
  }
  std::stable_sort(samples.begin(), samples.end(),
                   [](const GaugeSample& a, const GaugeSample& b) { return a.name < b.name; });
  char num[64];
  for (size_t i = 0; i < samples.size(); ++i) {
    const GaugeSample& x = samples[i];
    if (i == 0 || samples[i - 1].name != x.name)
      o += "# HELP " + x.name + " " + x.help + "\n# TYPE " + x.name + " gauge\n";
    std::snprintf(num, sizeof num, "%.17g", x.value);
    o += x.name + "{" + node + (x.labels.empty() ? "" : "," + x.labels) + "} " + num + "\n";
  }
}

}  // namespace

Gauges::Gauges(GaugeSource source) {
  GaugeRegistry& g = G();
  std::lock_guard<std::mutex> lk(g.mu);
  id_ = g.next++;
  g.sources.emplace(id_, std::move(source));
}

Gauges::~Gauges() {
  if (!id_) return;
  GaugeRegistry& g = G();
  std::lock_guard<std::mutex> lk(g.mu);  // waits for a scrape running it
  g.sources.erase(id_);
}

Gauges& Gauges::operator=(Gauges&& o) noexcept {
  if (this != &o) {
    Gauges gone(std::move(*this));
    id_ = o.id_;
    o.id_ = 0;
  }
  return *this;
}

std::string PrometheusText() {
  State& s = S();
  // A copy of the counters taken under the lock (a few hundred bytes per key), the
  // text built after it: operations count under the same lock and never wait for
  // the formatting of a scrape.
  // Flat vectors, sized first: one allocation each and short (SSO) strings, so the
  // lock is held for little more than a memcpy of the counters.
  KeyedOps ops;
  PeerBytes peers;
  PeerOps peer_ops;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    ops.reserve(s.ops.size());
    ops.assign(s.ops.begin(), s.ops.end());
    peers.assign(s.peers.begin(), s.peers.end());
    peer_ops.assign(s.peer_ops.begin(), s.peer_ops.end());
  }
  const std::string node = "node=\"" + LabelEscape(LogName()) + "\"";
  std::string o;
  AppendOps(o, node, ops);
  AppendPeers(o, node, peers, peer_ops);
  if (cuda::Initialized()) AppendDeviceCopies(o, node);
  AppendGauges(o, node);
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
