// Observability of a process of a job: a Chrome-trace timeline of every push, pull
// and push-pull per key (PSKV_TIMELINE), and per-key / per-peer counters with latency
// histograms served as Prometheus text (PSKV_METRICS_PORT) and dumped at exit
// (PSKV_METRICS_FILE). Like HOROVOD_TIMELINE, but every node writes its own file.
//
// Self-contained: the KV layer calls the few functions below at clearly marked hooks
// ("// [observe]") and nothing else. Everything is a no-op (one relaxed atomic load)
// until Configure() enabled something.
//
// Threading: the recorder is process-wide (one per process, like the log name) and
// thread-safe; events are buffered under a mutex and written by the calling thread
// when the buffer is large, and at exit. The metrics endpoint runs one thread that
// serves up to 16 connections together (nonblocking, poll), each bounded in time
// (2 s to send the request, 10 s in all): a client that never reads, or many idle
// connections, cannot hold up a scrape. The text is built from a copy of the counters
// taken under the mutex, so operations never wait for a scrape's formatting.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pskv/options.h"

namespace pskv::obs {

/// Enables what `options` asks for (timeline_path, metrics_port, metrics_file) for
/// this process; `role` names it in the trace. Idempotent: the first call that asks
/// for something wins. Process-wide: called by programs (pskv/process.h).
/// The timeline file is `timeline_path` with ".<role>.<pid>" inserted before its
/// extension (several processes of a job may share a directory). Throws IOError when
/// the timeline cannot be written or no port near metrics_port can be bound.
void Configure(const Options& options, const std::string& role);

/// True when a timeline or metrics are being recorded.
bool Enabled();

/// Microseconds since the epoch (the trace's clock: nodes on one host line up).
uint64_t NowUs();

/// A timeline slice [t0, t1) on this process: `name` (e.g. "push"), lane `lane`
/// ("issue", "network", "merge", "update", "reply"; on the scheduler "barrier", from
/// the first node's arrival to the release, key = the group), the key and its bytes.
void Span(const char* name, const char* lane, const std::string& key, uint64_t bytes,
          uint64_t t0_us, uint64_t t1_us);

/// Names this process's node in the timeline once it is known ("worker[1]", after
/// registration): a `process_labels` metadata event, which `python3 -m pskv.timeline
/// merge` uses to name the process's lane in the merged trace of the job.
void NameNode(const std::string& node);

/// Counts one completed operation `op` on `key`: bytes moved and latency.
void CountOp(const char* op, const std::string& key, uint64_t bytes, uint64_t latency_us,
             bool failed = false);

/// Counts bytes exchanged with a peer node ("worker[1]"); direction "in" or "out".
void CountPeer(const std::string& peer, const char* direction, uint64_t bytes);

/// Counts one request exchanged with a peer node and its latency: on a worker, from
/// sending the request to that server's answer; on a server, from receiving a request
/// to answering it (a sync push waits there for its round).
void CountPeerOp(const std::string& peer, uint64_t latency_us, bool failed = false);

/// One gauge sample: metric `name` (pskv_...), its `help` text, `labels` (Prometheus
/// label pairs without braces, e.g. `table="3"`; the node's label is added) and value.
struct GaugeSample {
  std::string name, help, labels;
  double value = 0;
};
/// Appends the current samples of what it watches (called at each scrape and at the
/// metrics file's dump, on the endpoint's thread or at exit; it may take its object's
/// locks, never the recorder's).
using GaugeSource = std::function<void(std::vector<GaugeSample>*)>;

/// Registers a source of gauges for as long as the returned handle lives (its
/// destructor waits for a scrape running it, so the source may point into the
/// handle's owner). Cheap when metrics are off: nothing calls it. Thread-safe.
class Gauges {
 public:
  Gauges() = default;
  explicit Gauges(GaugeSource source);
  ~Gauges();
  Gauges(Gauges&& o) noexcept : id_(o.id_) { o.id_ = 0; }
  Gauges& operator=(Gauges&& o) noexcept;
  Gauges(const Gauges&) = delete;
  Gauges& operator=(const Gauges&) = delete;

 private:
  uint64_t id_ = 0;  // 0: none
};

/// The counters in Prometheus' text exposition format (version 0.0.4).
std::string PrometheusText();

/// The port the metrics endpoint listens on (0: none).
int MetricsPort();

/// Writes pending timeline events and closes the trace (also done at exit).
void Flush();

/// A step of the server on a key, from construction to destruction: a timeline slice
/// in lane `step` ("merge", "update", "reply"), counted as operation `step`, and
/// `bytes` counted for `peer` in `direction` when a peer is given. Nothing when disabled.
class StepScope {
 public:
  StepScope(const char* step, int64_t key, uint64_t bytes, std::string peer = {},
            const char* direction = "in");
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  const char* step_;
  int64_t key_;
  uint64_t bytes_;
  std::string peer_;
  const char* direction_;
  uint64_t t0_ = 0;
};

/// Wraps the completion of a worker's operation started now: records the "issue"
/// slice [issued_us, now) (from the call until the engine starts it; per-key order), and when
/// `done` runs the "network" slice (request to reply) and the counters. Returns `done` unchanged
/// when disabled.
template <typename Done>
Done Track(const char* op, const std::string& key, uint64_t bytes, uint64_t issued_us, Done done) {
  if (!Enabled()) return done;
  const uint64_t start = NowUs();
  if (issued_us) Span(op, "issue", key, bytes, issued_us, start);
  return [op, key, bytes, start, done = std::move(done)](auto e) {
    const uint64_t end = NowUs();
    Span(op, "network", key, bytes, start, end);
    CountOp(op, key, bytes, end - start, static_cast<bool>(e));
    done(e);
  };
}

}  // namespace pskv::obs
