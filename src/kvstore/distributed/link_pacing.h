// Kernel pacing of the connections between workers and servers on different hosts
// (Options::link_rate, PSKV_LINK_RATE; docs/performance.md, "Across hosts").
//
// A host's uplink is one FIFO queue for all its connections. Unpaced, each TCP
// connection hands it its data in bursts, so a piece one server waits for queues
// behind the bursts to the others, and the small flows (a co-located server's
// part, its answers) finish early while the big ones finish last. Paced, each
// connection between worker w and server r sends at link_rate * share_r / L (L:
// the busiest link's bytes per byte of a key; server_shares.h, LinkPacingRates):
// every connection's part of a push+pull takes the same time, and no link is
// offered more than its rate, so no queue forms. With PSKV_REPLICAS = R, L counts the
// copies of the primaries' rounds to their replicas (the initial range table's), so
// the workers' connections slow down to leave the copies their room: the replica's
// copy and its acknowledgement queue behind nothing (docs/performance.md, "Replicated
// servers"). Worker-worker, server-server and same-host connections are not paced;
// after a failover the rates stay those of the initial table.
//
// By default (PSKV_LINK_RATE unset or 1) the link's rate is learned while the job runs
// (LinkRateEstimator): at the end of every window of 100 ms the node reads its paced
// connections' TCP_INFO (bytes acknowledged, time backlogged) and its host interface's
// transmitted bytes (/proc/net/dev), over the window's real length. While its
// connections are backlogged, the bytes the interface sent, over the host's planned
// part of the busiest link's load, are a sample of the link's rate: the interface
// counts every process of the host (a worker's pushes and its co-located server's
// answers), so no process mistakes the room another one left for a faster link.
// (Without the interface's counter: the connections' own bytes over their planned
// part.) The estimate is the largest sample of the last `horizon` windows. Starting,
// the caps are startup_gain x the estimate, loose, so that the samples show the link,
// until full_windows samples in a row grow it by less than full_growth (BBR's full
// pipe); then every window is paced a little above the estimate (gain), so that the
// link, not the caps, holds the connections and every backlogged window is a sample
// of it; windows the caps held (a link that became faster) raise the estimate, and
// `regrow` of them in a row where the host's link carried the caps' rate too start up
// again. Where the host's cores, not its link, hold
// the connections (1 Gbit/s links on 2 cores), the samples show what the cores
// deliver and the caps stay just above it: the flows keep their planned proportions,
// which made such jobs faster than unpaced (measured: 1.30 x t_opt against 1.53).
// Until the first sample nothing is paced. Once started, every node paces at one rate
// for the job, the median of the nodes' estimates, shared through the
// heartbeats (ps/link_rate_share.h; the parts are planned for one rate on every link:
// nodes pacing at rates of their own, 11.3-13.1 MB/s on links of 12.25, offer a link
// flows out of proportion). A job whose nodes are all on one host learns nothing and
// paces nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pskv/options.h"

namespace pskv {
class Node;
namespace dist {

/// Whether the store's connections are paced, by a stated rate or a learned one:
/// PSKV_LINK_RATE > 0, or 1 (learned) and the job's nodes on more than one host.
/// Alike on every worker (the node table), as the wire's chunking needs it to be
/// (worker/wire_shape.h).
bool LinksPaced(const Node& node, const Options& o);

/// One paced connection's counters at the end of a window, as the kernel gives them
/// (Transport::SendStats): cumulative.
struct ConnCounters {
  uint64_t bytes_acked = 0;
  uint64_t busy_us = 0;
};

/// The link's rate from windows of a node's paced connections' counters. No clock and
/// no I/O: the caller feeds the windows (unit-tested with recorded counters).
class LinkRateEstimator {
 public:
  struct Config {
    /// 100 ms: steps of 0.4 s (4 MiB at 100 Mbit/s) hold a few windows; with 200 ms
    /// ones they held few backlogged pairs and the job ran 1.26-1.40 x the bound (100
    /// ms: 1.05-1.13 x; 50 ms read a token bucket's bursts as 15-20 % more link).
    std::chrono::microseconds window{100'000};
    /// A connection counts as backlogged in a window when busy this fraction of it.
    double busy_fraction = 0.8;
    /// Windows a sample counts towards the estimate.
    int horizon = 20;
    /// Past the start-up every window is paced this much above the estimate, so that the
    /// link, not the caps, holds the backlogged connections: every backlogged window is
    /// a sample of the link, and a faster link shows as windows the caps held, each
    /// raising the estimate by the gain. (A cycle of probes above the estimate and drains
    /// below it, as BBR's, with a cruise below it, cost a sync job 3-8 % a step, measured
    /// at 4 MiB: a drain window slows a step's last flows, a cruise below the link all.)
    double gain = 1.04;
    /// `regrow` windows in a row that the caps held, the host's link carrying their
    /// rate too (`capped` of it), start up again: a raised limit (a competing flow gone)
    /// is found in a few windows.
    int regrow = 3;
    /// Starting (and after `regrow` capped windows), every window is paced at the
    /// estimate times startup_gain, so that the caps do not hide the link, until
    /// `full_windows` samples in a row grow the highest estimate by less than
    /// full_growth (the link holds them: the pipe is full, as BBR's start-up).
    double startup_gain = 2.0;
    double full_growth = 0.1;
    int full_windows = 3;
    /// The most the estimate falls per window, and the least it falls to: this part of
    /// the highest estimate of the job (a link held by another one reads low).
    double most_drop = 0.1;
    double least_of_peak = 0.25;
    /// The least estimate (bytes/s): a connection is never paced to a stop.
    uint64_t floor = 125'000;
    /// Backlogged connections that delivered this fraction of their caps were held by
    /// the caps, not by the link.
    double capped = 0.98;
    /// ... and such a window counts for the estimate only where the host's link carried
    /// this fraction of the capped rate: else another process of the host (its server
    /// or worker) left room that the capped ones could not take, and the link was not
    /// shown to carry the estimate (measured: held estimates 10-20 % above the link).
    double capped_link = 0.9;
    /// TCP payload per byte on the wire (an interface counts Ethernet, IP and TCP
    /// headers: 1448 of 1514 bytes of a full segment).
    double payload = 0.956;
  };

  /// `parts`: per connection, its planned part of the link (rate / link rate;
  /// > 0); the counters fed to Add come in the same order. `host_part`: the host's
  /// planned load over the busiest link's (server_shares.h, LinkLoads; 1 where this
  /// host's link is the busiest).
  LinkRateEstimator(Config c, std::vector<double> parts, double host_part = 1.0);

  /// The counters at the end of window `slot` (consecutive windows have consecutive
  /// slots; a gap restarts the comparison) and the bytes the host's interface has
  /// transmitted (cumulative; 0: unknown). Returns the estimate after it.
  /// `elapsed_us`: the time since the previous counters were read, where the caller
  /// knows it (0: the window's length; a thread woken late reads a longer window).
  uint64_t Add(int64_t slot, const std::vector<ConnCounters>& now, uint64_t link_tx_bytes = 0,
               uint64_t elapsed_us = 0);
  /// The rate the caps of the coming windows are a part of, where it is not the
  /// estimate (the job's shared rate, ps/link_rate_share.h; 0: the estimate).
  void PacedAt(uint64_t rate) { paced_at_ = rate; }
  /// The link's rate learned so far (bytes/s); 0 before the first sample.
  uint64_t estimate() const { return estimate_; }
  /// The pacing gain: startup_gain while starting, else gain.
  double Gain() const { return starting_ ? c_.startup_gain : c_.gain; }
  /// Whether it is starting (its caps loose: startup_gain).
  bool starting() const { return starting_; }
  /// The sample the last Add took (0: none: the connections were not backlogged).
  uint64_t last_sample() const { return last_sample_; }

 private:
  void Follow(int64_t slot);
  Config c_;
  std::vector<double> parts_;
  double host_part_;
  std::vector<ConnCounters> prev_;
  uint64_t prev_tx_ = 0;
  int64_t prev_slot_ = -2;
  bool prev_backlogged_ = false;  // the window before the last one
  struct Sample {
    int64_t slot;
    uint64_t rate;
  };
  std::vector<Sample> samples_;  // within the horizon, oldest first
  uint64_t estimate_ = 0, last_sample_ = 0, paced_at_ = 0;
  bool starting_ = true;
  uint64_t peak_ = 0;   // the highest max-filter value so far
  int plateau_ = 0;     // samples in a row that grew the estimate by less than full_growth
  int capped_run_ = 0;  // samples in a row from windows the caps held
};

/// Paces `node`'s connections to the workers (a server of rank < S; spares are not
/// paced) or to the servers (a worker) on other hosts: at the stated `o.link_rate`
/// (> 0) once, or (PSKV_LINK_RATE unset or 1) at the rate a thread of its own learns
/// while the object lives; nothing on one host or with PSKV_LINK_RATE=0. After Node::Start; one
/// per node (a process's stores share a node: the first store's).
class LinkPacer {
 public:
  LinkPacer(Node& node, const Options& o);
  ~LinkPacer();
  LinkPacer(const LinkPacer&) = delete;
  LinkPacer& operator=(const LinkPacer&) = delete;
  /// The rate learned so far (0: none yet, or not learning).
  uint64_t learned() const;

 private:
  struct Conn {
    int peer;
    uint64_t rate;  // its pacing rate for a link of kUnit bytes/s
  };
  void Learn();
  void Apply(double link_rate);
  uint64_t LinkTxBytes() const;  // 0: unknown
  Node& node_;
  const Options o_;
  std::vector<Conn> conns_;  // the measured ones first
  size_t measured_ = 0;
  std::string interface_;  // the host's interface carrying the node's address ("": unknown)
  double host_part_ = 1.0;
  const LinkRateEstimator::Config cfg_{};
  std::unique_ptr<LinkRateEstimator> est_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dist
}  // namespace pskv
