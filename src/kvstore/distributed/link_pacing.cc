#include "kvstore/distributed/link_pacing.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "kvstore/distributed/server_shares.h"
#include "ps/node.h"

namespace pskv::dist {
namespace {

// The link rate for which the connections' rates are planned; Apply scales them.
constexpr uint64_t kUnit = uint64_t{1} << 30;

HostLayout LayoutOf(const Node& node) {
  HostLayout layout;
  for (int id : node.ServerIds()) layout.server_hosts.push_back(node.HostOf(id));
  for (int id : node.WorkerIds()) layout.worker_hosts.push_back(node.HostOf(id));
  return layout;
}

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The name of the interface that holds IPv4 address `addr` ("" if none does).
std::string InterfaceOf(const std::string& addr) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string name;
  for (ifaddrs* a = list; a && name.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) && addr == text) name = a->ifa_name;
  }
  ::freeifaddrs(list);
  return name;
}

}  // namespace

bool LinksPaced(const Node& node, const Options& o) {
  if (o.link_rate > 0) return true;
  if (o.link_rate == 0) return false;  // PSKV_LINK_RATE=0: off
  const HostLayout l = LayoutOf(node);
  std::vector<std::string> hosts = l.server_hosts;
  hosts.insert(hosts.end(), l.worker_hosts.begin(), l.worker_hosts.end());
  return std::any_of(hosts.begin(), hosts.end(),
                     [&](const std::string& h) { return !h.empty() && h != hosts.front(); });
}

// ---------------------------------------------------------------- estimator

LinkRateEstimator::LinkRateEstimator(Config c, std::vector<double> parts, double host_part)
    : c_(c), parts_(std::move(parts)), host_part_(host_part > 0 ? host_part : 1.0) {}

uint64_t LinkRateEstimator::Add(int64_t slot, const std::vector<ConnCounters>& now,
                                uint64_t link_tx_bytes, uint64_t elapsed_us) {
  bool consecutive = now.size() == parts_.size() && prev_.size() == now.size() &&
                     slot == prev_slot_ + 1 && link_tx_bytes >= prev_tx_;
  for (size_t i = 0; consecutive && i < now.size(); ++i)
    consecutive = now[i].bytes_acked >= prev_[i].bytes_acked && now[i].busy_us >= prev_[i].busy_us;
  last_sample_ = 0;
  bool backlogged = false;
  if (consecutive) {
    const auto window = static_cast<double>(elapsed_us > 0 ? elapsed_us : c_.window.count());
    double acked = 0, part = 0;
    size_t busy = 0;
    for (size_t i = 0; i < now.size(); ++i) {
      if (static_cast<double>(now[i].busy_us - prev_[i].busy_us) < c_.busy_fraction * window)
        continue;
      acked += static_cast<double>(now[i].bytes_acked - prev_[i].bytes_acked);
      part += parts_[i];
      ++busy;
    }
    // Without the interface's counter, unpaced, a connection that is backlogged alone
    // takes the whole link, far more than its part: only windows with all of them
    // backlogged count. Paced, each delivers at most its cap (a part of the estimate
    // times the gain), so any backlogged ones do; so do they where the interface
    // counts the link's bytes.
    backlogged = busy > 0 && (estimate_ > 0 || link_tx_bytes > 0 || busy == now.size());
    // The link's bytes (every process of the host) where the interface is known,
    // else this process's connections' share of them.
    const double sample = link_tx_bytes > 0 ? static_cast<double>(link_tx_bytes - prev_tx_) *
                                                  c_.payload * 1e6 / window / host_part_
                          : part > 0 ? acked * 1e6 / window / part
                                     : 0;
    // Where the backlogged connections delivered (nearly) their caps, their caps held
    // them, not the link: the link carried at least the caps' rate (above the estimate:
    // a sample that raises it).
    const double est = static_cast<double>(estimate_), gain = Gain();
    const double base = paced_at_ > 0 ? static_cast<double>(paced_at_) : est;
    const bool capped = base > 0 && acked >= c_.capped * base * gain * part * window / 1e6;
    // Capped, but the host's link carried less than the caps' rate: another process of
    // the host left room; the window shows nothing of the link.
    const bool unshown = capped && sample < c_.capped_link * base * gain;
    // The window after an idle one may carry a burst the rate limiter saved up.
    if (unshown) {
      // no sample
    } else if (backlogged && prev_backlogged_ && sample > 0) {
      last_sample_ = static_cast<uint64_t>(sample);
      samples_.push_back({slot, last_sample_});
      // A start-up again only where the host's link, too, carried the caps' rate: a
      // process's connections alone at their caps took room the host's other process
      // left (measured: restarts every few seconds at 100 Mbit/s, each a window of
      // caps at twice the link, its queue delaying the step's answers).
      capped_run_ = capped && sample >= c_.capped * base * gain ? capped_run_ + 1 : 0;
    }
  }
  prev_backlogged_ = backlogged;
  prev_tx_ = link_tx_bytes;
  prev_ = now;
  prev_slot_ = slot;
  Follow(slot);
  return estimate_;
}

// The estimate after window `slot`'s sample (if any): the largest sample of the
// horizon, falling at most most_drop per window, and the start-up's state.
void LinkRateEstimator::Follow(int64_t slot) {
  while (!samples_.empty() && samples_.front().slot <= slot - c_.horizon)
    samples_.erase(samples_.begin());
  // No sample within the horizon (an idle job): the estimate stays.
  uint64_t best = 0;
  for (const Sample& s : samples_) best = std::max(best, s.rate);
  const uint64_t before = estimate_, peak_before = peak_;  // before this sample
  if (best > 0) {
    // A host's samples are its own link's rate only where that link is the limit;
    // where another link holds its connections (a slower host they send to) they show
    // what it sends, and capped at that the job would slow further: the estimate falls
    // by at most most_drop per window and never below least_of_peak of the job's
    // highest (measured: a link halved mid-job stalled a step for 63 s without this).
    peak_ = std::max(peak_, best);
    const double slowest = std::max(static_cast<double>(estimate_) * (1 - c_.most_drop),
                                    static_cast<double>(peak_) * c_.least_of_peak);
    estimate_ = std::max({best, static_cast<uint64_t>(slowest), c_.floor});
  }
  if (last_sample_ > 0) {
    // Starting: the caps are loose (startup_gain), so a sample shows what the link
    // takes; once `full_windows` samples in a row grew the highest estimate so far by
    // less than full_growth, the link (or the job) is the limit. (Against the highest,
    // not the current one: a node whose samples are sparse, a server's answers filling
    // a part of each step, sees its estimate fall between them, and every sample looked
    // like growth: measured, servers starting for a whole job, their caps loose.)
    // Past it, `regrow` windows in a row that the caps held start it again.
    if (starting_) {
      const uint64_t top = std::max(before, peak_before);
      const double grew =
          top > 0 ? static_cast<double>(last_sample_) / static_cast<double>(top) : 1e9;
      plateau_ = grew < 1 + c_.full_growth ? plateau_ + 1 : 0;
      if (plateau_ >= c_.full_windows) starting_ = false;
    } else if (capped_run_ >= c_.regrow) {
      starting_ = true;  // the caps, not the link, held the last windows: more room
      plateau_ = capped_run_ = 0;
    }
  }
}

// ---------------------------------------------------------------- pacer

LinkPacer::LinkPacer(Node& node, const Options& o) : node_(node), o_(o) {
  if (o.link_rate == 0) return;  // PSKV_LINK_RATE=0: off
  const HostLayout layout = LayoutOf(node);
  const std::vector<int64_t> shares = ServerShares(o.server_weights, layout);
  const std::vector<uint64_t> rates = LinkPacingRates(layout, shares, kUnit, o.replicas);
  if (rates.empty()) return;
  const std::vector<int> servers = node.ServerIds(), workers = node.WorkerIds();
  const std::string here = node.HostOf(node.id());
  // The estimator counts only connections that carry a part of big keys; a server
  // without one gets small keys only (its connections paced, not measured).
  std::vector<double> parts;
  std::vector<int> measured;
  auto add = [&](int peer, size_t rank) {
    if (node.HostOf(peer) == here) return;
    conns_.push_back({peer, rates[rank]});
    if (shares.empty() || shares[rank] > 0) {
      parts.push_back(static_cast<double>(rates[rank]) / static_cast<double>(kUnit));
      measured.push_back(static_cast<int>(conns_.size() - 1));
    }
  };
  if (o.role == Role::kServer && node.rank() < static_cast<int>(servers.size())) {
    for (int w : workers) add(w, static_cast<size_t>(node.rank()));
    // The connections to the replicas stay unpaced: the rates leave the copies their
    // room on every link, and a copy leaves no faster than the paced pushes complete
    // its round; a cap sized for a dense round starves a row_sparse one (the union of
    // the workers' rows), measured in docs/performance.md, "Replicated servers".
  } else if (o.role == Role::kWorker) {
    for (size_t r = 0; r < servers.size(); ++r) add(servers[r], r);
  }
  if (conns_.empty()) return;
  if (o.link_rate > 0) {
    Apply(static_cast<double>(o.link_rate));
    if (o.verbose >= 1)
      PSKV_INFO(node.Tag() << ": connections to other hosts paced for a link of " << o.link_rate
                           << " B/s");
    return;
  }
  if (!LinksPaced(node, o) || parts.empty()) return;
  // Measured connections first: Learn feeds their counters in this order.
  std::vector<Conn> ordered;
  for (int i : measured) ordered.push_back(conns_[static_cast<size_t>(i)]);
  for (size_t i = 0; i < conns_.size(); ++i)
    if (std::find(measured.begin(), measured.end(), static_cast<int>(i)) == measured.end())
      ordered.push_back(conns_[i]);
  conns_ = std::move(ordered);
  measured_ = measured.size();
  // The host's part of the busiest link's load, and the interface whose bytes show it.
  const std::map<std::string, double> loads = LinkLoads(layout, shares, o.replicas);
  double busiest = 0;
  for (const auto& [h, load] : loads) busiest = std::max(busiest, load);
  if (loads.count(here) && busiest > 0 && loads.at(here) > 0) host_part_ = loads.at(here) / busiest;
  interface_ = InterfaceOf(here);
  if (o.verbose >= 1)
    PSKV_INFO(node.Tag() << ": learning the link rate (interface "
                         << (interface_.empty() ? "unknown" : interface_) << ", this host "
                         << host_part_ << " of the busiest link's load)");
  est_ = std::make_unique<LinkRateEstimator>(cfg_, std::move(parts), host_part_);
  thread_ = std::thread([this] { Learn(); });
}

LinkPacer::~LinkPacer() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t LinkPacer::learned() const {
  std::lock_guard<std::mutex> lk(mu_);
  return est_ ? est_->estimate() : 0;
}

uint64_t LinkPacer::LinkTxBytes() const {
  if (interface_.empty()) return 0;
  // "  name: rx_bytes packets errs drop fifo frame compressed multicast tx_bytes ..."
  std::ifstream f("/proc/net/dev");
  std::string line;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto first = line.find_first_not_of(' ');
    if (line.compare(first, colon - first, interface_) != 0) continue;
    std::istringstream in(line.substr(colon + 1));
    uint64_t v = 0;
    for (int i = 0; i < 9; ++i)
      if (!(in >> v)) return 0;
    return v;
  }
  return 0;
}

void LinkPacer::Apply(double link_rate) {
  if (link_rate <= 0) {  // unpaced: the kernel's "no cap"
    for (const Conn& c : conns_) node_.SetPacingRate(c.peer, ~uint64_t{0});
    return;
  }
  for (const Conn& c : conns_)
    node_.SetPacingRate(
        c.peer,
        std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(c.rate) * link_rate /
                                                    static_cast<double>(kUnit))));
}

// The learning thread: at the end of every window (a slot of the wall clock) it reads
// the measured connections' counters, feeds the estimator and paces every connection
// for the next window at the job's rate (or, starting, its own estimate) times the gain.
void LinkPacer::Learn() {
  const int64_t window = cfg_.window.count();
  std::vector<ConnCounters> now;
  double applied = 0;
  uint64_t logged = 0;
  int64_t windows = 0, missing = 0, sampled = 0;
  auto last_read = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    const int64_t next = (NowUs() / window + 1) * window;
    cv_.wait_for(lk, std::chrono::microseconds(std::max<int64_t>(next - NowUs(), 0)),
                 [&] { return stop_; });
    if (stop_) break;
    const int64_t slot = next / window - 1;  // the window that just ended
    now.clear();
    bool all = true;
    for (size_t i = 0; i < measured_ && all; ++i) {
      TcpSendStats st;
      all = node_.SendStats(conns_[i].peer, &st);
      now.push_back({st.bytes_acked, st.busy_us});
    }
    ++windows;
    if (o_.verbose >= 1 && windows % 10 == 0)
      PSKV_INFO(node_.Tag() << ": link pacing: " << windows << " windows, " << missing
                            << " without counters, " << sampled << " sampled, estimate "
                            << est_->estimate() << " B/s, the job's " << node_.link_rates().Job()
                            << " B/s");
    if (!all) {  // a connection not up yet (or not on TCP): no window
      ++missing;
      continue;
    }
    const uint64_t tx = LinkTxBytes();
    const auto read_at = std::chrono::steady_clock::now();
    const auto elapsed = read_at - last_read;
    last_read = read_at;
    const uint64_t b =
        est_->Add(slot, now, tx,
                  static_cast<uint64_t>(
                      std::chrono::duration_cast<std::chrono::microseconds>(elapsed).count()));
    if (est_->last_sample() > 0) ++sampled;
    if (b == 0) continue;
    // Paced at the job's rate (every node at one: ps/link_rate_share.h) once the
    // scheduler answered with one, else at this node's own.
    // A node starting (its caps loose, its estimate still growing) reports nothing.
    node_.link_rates().Report(est_->starting() ? 0 : b);
    const uint64_t job = node_.link_rates().Job();
    const uint64_t base = job > 0 && !est_->starting() ? job : b;
    est_->PacedAt(base);
    node_.link_rates().PacedFor(base);
    const double target = static_cast<double>(base) * est_->Gain();
    if (o_.verbose >= 2)  // every window: what it saw and what it paces at (kB/s)
      PSKV_INFO(node_.Tag() << ": link pacing window " << slot << ": sample "
                            << est_->last_sample() / 1000 << ", estimate " << b / 1000
                            << (est_->starting() ? " (starting)" : "") << ", the job's "
                            << job / 1000 << ", caps for " << static_cast<uint64_t>(target) / 1000
                            << " kB/s");
    if (target != applied) {
      Apply(target);
      applied = target;
    }
    if (o_.verbose >= 1 && (base > logged * 11 / 10 || base < logged * 9 / 10)) {
      PSKV_INFO(node_.Tag() << ": link rate learned " << b << " B/s, the job's " << job << " B/s");
      logged = base;
    }
  }
}

}  // namespace pskv::dist
