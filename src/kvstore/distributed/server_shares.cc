#include "kvstore/distributed/server_shares.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/env_table.h"
#include "pskv/error.h"

namespace pskv::dist {
namespace {

constexpr int64_t U = kShareUnits;

// A host of the layout: its workers and its servers' ranks.
struct Host {
  int64_t workers = 0;
  std::vector<int> servers;
};

// Hosts in order of first appearance (servers by rank, then workers); false if a
// node's host is unknown.
bool HostsOf(const HostLayout& l, std::vector<Host>* hosts) {
  std::map<std::string, size_t> index;
  auto at = [&](const std::string& label) -> Host& {
    auto it = index.emplace(label, hosts->size()).first;
    if (it->second == hosts->size()) hosts->emplace_back();
    return (*hosts)[it->second];
  };
  for (size_t r = 0; r < l.server_hosts.size(); ++r) {
    if (l.server_hosts[r].empty()) return false;
    at(l.server_hosts[r]).servers.push_back(static_cast<int>(r));
  }
  for (const auto& w : l.worker_hosts) {
    if (w.empty()) return false;
    ++at(w).workers;
  }
  return true;
}

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The units W a host's servers may hold with its link's load
// a U + (n - 2a) W <= T: [*lo, *hi] within [0, U]; false if none.
bool Allowed(const Host& h, int64_t n, int64_t T, int64_t* lo, int64_t* hi) {
  const int64_t base = h.workers * U, c = n - 2 * h.workers;
  *lo = 0;
  *hi = h.servers.empty() ? 0 : U;
  if (c > 0) {
    if (base > T) return false;
    *hi = std::min(*hi, (T - base) / c);
  } else if (c == 0 || h.servers.empty()) {
    if (base > T) return false;
  } else if (base > T) {  // the load falls as the host holds more
    *lo = CeilDiv(base - T, -c);
    if (*lo > U) return false;
  }
  return true;
}

bool Feasible(const std::vector<Host>& hosts, int64_t n, int64_t T, std::vector<int64_t>* lo,
              std::vector<int64_t>* hi) {
  int64_t sum_lo = 0, sum_hi = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (!Allowed(hosts[i], n, T, &(*lo)[i], &(*hi)[i])) return false;
    sum_lo += (*lo)[i];
    sum_hi += (*hi)[i];
  }
  return sum_lo <= U && U <= sum_hi;
}

}  // namespace

std::vector<int64_t> LinkBalancedShares(const HostLayout& layout) {
  std::vector<Host> hosts;
  const auto n = static_cast<int64_t>(layout.worker_hosts.size());
  const auto S = static_cast<int64_t>(layout.server_hosts.size());
  if (n == 0 || S <= 1 || !HostsOf(layout, &hosts)) return {};
  // The least busiest-link load T (in units of M / U) some shares allow: loads are
  // linear in each host's units, so feasibility is monotone in T. T = nU always is.
  std::vector<int64_t> lo(hosts.size()), hi(hosts.size());
  int64_t low = 0, high = n * U;
  while (low < high) {
    const int64_t mid = low + (high - low) / 2;
    if (Feasible(hosts, n, mid, &lo, &hi))
      high = mid;
    else
      low = mid + 1;
  }
  const int64_t T = high;
  // The even split when it is as good: exactly, load_h S = a U S + c U s_h <= T S.
  bool even_ok = true;
  for (const Host& h : hosts) {
    const int64_t s = static_cast<int64_t>(h.servers.size());
    even_ok &= h.workers * U * S + (n - 2 * h.workers) * U * s <= T * S;
  }
  if (even_ok) return {};
  // Any units within [lo, hi] per host reach T; the units beyond the lows go to the
  // hosts in proportion to their room (hosts alike get alike), the floors' remainder
  // one unit each to the first hosts with room left.
  Feasible(hosts, n, T, &lo, &hi);
  std::vector<int64_t> units = lo;
  int64_t left = U, room = 0;
  for (size_t i = 0; i < hosts.size(); ++i) left -= lo[i], room += hi[i] - lo[i];
  const int64_t spread = left;
  for (size_t i = 0; i < hosts.size() && room > 0; ++i) {
    const int64_t add = (hi[i] - lo[i]) * spread / room;  // <= 2^20 * 2^20 before dividing
    units[i] += add;
    left -= add;
  }
  for (size_t i = 0; i < hosts.size() && left > 0; ++i)
    if (units[i] < hi[i]) ++units[i], --left;
  // A host's units split evenly over its servers (the first ones get the remainder).
  std::vector<int64_t> shares(static_cast<size_t>(S), 0);
  for (size_t i = 0; i < hosts.size(); ++i) {
    const auto& sv = hosts[i].servers;
    for (size_t j = 0; j < sv.size(); ++j)
      shares[static_cast<size_t>(sv[j])] =
          units[i] / static_cast<int64_t>(sv.size()) +
          (static_cast<int64_t>(j) < units[i] % static_cast<int64_t>(sv.size()) ? 1 : 0);
  }
  return shares;
}

std::vector<int64_t> SharesFromWeights(const std::vector<int64_t>& weights) {
  int64_t total = 0;
  for (int64_t w : weights) {
    if (w < 0) throw InvalidArgument("server weights must not be negative");
    total += w;
  }
  if (total <= 0) throw InvalidArgument("server weights must not all be 0");
  if (std::all_of(weights.begin(), weights.end(), [&](int64_t w) { return w == weights[0]; }))
    return {};
  std::vector<int64_t> shares;
  int64_t left = U;
  for (int64_t w : weights) {
    shares.push_back(w * U / total);
    left -= shares.back();
  }
  for (size_t i = 0; i < shares.size() && left > 0; ++i)
    if (weights[i] > 0) ++shares[i], --left;
  return shares;
}

std::vector<int64_t> ServerShares(const std::string& spec, const HostLayout& layout) {
  if (spec == "even") return {};
  if (spec == "balanced") return LinkBalancedShares(layout);
  if (spec.empty() || spec == "auto") {
    // Measured (docs/performance.md, "Across hosts"): the balanced shares win where
    // they move every byte off the worker hosts (k >= n); where a co-located server
    // keeps a smaller share (0 < k < n), TCP's per-flow fairness leaves the bigger
    // flows to the extra hosts last and the step is slower than the even split.
    std::vector<int64_t> shares = LinkBalancedShares(layout);
    const std::set<std::string> worker_hosts(layout.worker_hosts.begin(),
                                             layout.worker_hosts.end());
    for (size_t r = 0; r < shares.size(); ++r)
      if (shares[r] > 0 && worker_hosts.count(layout.server_hosts[r])) return {};
    return shares;
  }
  const std::vector<int64_t> w = ParseServerWeights(spec);
  if (w.size() != layout.server_hosts.size())
    throw ConfigError("PSKV_SERVER_WEIGHTS='" + spec + "' gives " + std::to_string(w.size()) +
                      " weights for " + std::to_string(layout.server_hosts.size()) +
                      " servers: give one per server rank");
  return SharesFromWeights(w);
}

std::vector<int> ReplicaRanks(int r, int servers, int replicas) {
  std::vector<int> out;
  const int R = std::clamp(replicas, 0, std::max(servers - 1, 0));
  for (int k = 1; k <= R; ++k) out.push_back((r + k) % servers);
  return out;
}

double MaxLinkLoad(const HostLayout& layout, const std::vector<int64_t>& shares, int replicas) {
  double worst = 0;
  for (const auto& [host, load] : LinkLoads(layout, shares, replicas))
    worst = std::max(worst, load);
  return worst;
}

std::map<std::string, double> LinkLoads(const HostLayout& layout,
                                        const std::vector<int64_t>& shares, int replicas) {
  std::vector<Host> hosts;
  const auto n = static_cast<int64_t>(layout.worker_hosts.size());
  const size_t S = layout.server_hosts.size();
  if (!HostsOf(layout, &hosts)) return {};
  // The hosts' labels, in HostsOf's order (servers by rank, then workers).
  std::vector<std::string> labels;
  for (const auto* list : {&layout.server_hosts, &layout.worker_hosts})
    for (const auto& h : *list)
      if (std::find(labels.begin(), labels.end(), h) == labels.end()) labels.push_back(h);
  auto share = [&](size_t r) {
    return shares.empty() ? 1.0 / static_cast<double>(S)
                          : static_cast<double>(shares[r]) / static_cast<double>(U);
  };
  // What replication adds to each direction of a link: the copies a host's servers
  // send to replicas on other hosts (out) and those its servers receive from
  // primaries elsewhere (in). With one replica, the replica on a worker's host answers
  // that worker's push-pulls for the primary (docs/fault-tolerance.md, "Answers from a
  // copy on the worker's host"): the primary's answers to that host's workers do not
  // cross the link; the copy takes their place.
  std::vector<size_t> host_of(S);
  for (size_t h = 0; h < hosts.size(); ++h)
    for (int r : hosts[h].servers) host_of[static_cast<size_t>(r)] = h;
  std::vector<double> extra_out(hosts.size(), 0.0), extra_in(hosts.size(), 0.0);
  for (size_t r = 0; r < S; ++r) {
    const std::vector<int> to_ranks =
        ReplicaRanks(static_cast<int>(r), static_cast<int>(S), replicas);
    for (int replica : to_ranks) {
      const size_t from = host_of[r], to = host_of[static_cast<size_t>(replica)];
      if (from == to) continue;
      const double answers = to_ranks.size() == 1 ? static_cast<double>(hosts[to].workers) : 0.0;
      extra_out[from] += share(r) * (1.0 - answers);
      extra_in[to] += share(r) * (1.0 - answers);
    }
  }
  std::map<std::string, double> loads;
  for (size_t h = 0; h < hosts.size(); ++h) {
    double w = 0;
    for (int r : hosts[h].servers) w += share(static_cast<size_t>(r));
    const double a = static_cast<double>(hosts[h].workers);
    const double base = a + static_cast<double>(n - 2 * hosts[h].workers) * w;
    loads[labels[h]] = base + std::max(extra_out[h], extra_in[h]);
  }
  return loads;
}

std::vector<uint64_t> LinkPacingRates(const HostLayout& layout, const std::vector<int64_t>& shares,
                                      uint64_t link_rate, int replicas) {
  const double load = MaxLinkLoad(layout, shares, replicas);
  const size_t S = layout.server_hosts.size();
  if (load <= 0 || S == 0 || link_rate == 0) return {};
  std::vector<uint64_t> rates(S);
  for (size_t r = 0; r < S; ++r) {
    const double share = shares.empty() ? 1.0 / static_cast<double>(S)
                                        : static_cast<double>(shares[r]) / static_cast<double>(U);
    // A server that holds no part of big keys gets only small keys: 1/S of the link.
    const double part = share > 0 ? share : 1.0 / static_cast<double>(S);
    rates[r] = static_cast<uint64_t>(static_cast<double>(link_rate) * part / load);
  }
  return rates;
}

}  // namespace pskv::dist
