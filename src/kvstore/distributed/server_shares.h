// How much of each big dense key every server holds (dist_protocol.h, PlaceKey):
// the shares of PSKV_SERVER_WEIGHTS, by default balanced over the hosts' links.
//
// The link model (docs/performance.md, "Across hosts"): every host has one
// full-duplex link of rate B. In a push+pull of a key of M bytes, every worker sends
// M to the servers and receives M back; the part a worker exchanges with a server on
// its own host never crosses a link. A host with a workers whose servers hold the
// fraction W of the key therefore sends (and receives)
//
//     M (a (1 - W) + (n - a) W) = M (a + (n - 2a) W)        (n workers in the job)
//
// and the step takes at least the busiest link's bytes over B. LinkBalancedShares
// chooses the W of each host that minimise that maximum: with n worker hosts that
// each run one server and k hosts that only serve, the co-located servers get
// (n - k) / (n^2 + kn - 2k) of the key each, the others 2(n - 1) / (n^2 + kn - 2k)
// each, and the step's bound becomes t_opt = 2n(n - 1)M / ((n^2 + kn - 2k)B), where
// the even split gives max(S + n - 2, n) M / (S B) with S = n + k servers. Once
// k >= n the co-located servers get nothing and the step needs M / B (every worker's
// own link).
//
// Every worker must compute the same shares (they name which elements each server
// holds): they come from the node table, which the scheduler sends to every node
// alike, and the arithmetic is in whole numbers (no floating point, so compilers and
// CPUs cannot disagree).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvstore/dist_protocol.h"

namespace pskv::dist {

/// Where the job's nodes run: a host label per server rank and per worker rank.
/// Nodes with the same label share a host, hence a link; the label is the address
/// a node advertises in the node table (DMLC_NODE_HOST, DMLC_INTERFACE's address or
/// the first NIC's): nodes reached at one address share that address's link.
struct HostLayout {
  std::vector<std::string> server_hosts;  ///< by server rank
  std::vector<std::string> worker_hosts;  ///< by worker rank
};

/// Shares (whole numbers summing to kShareUnits, by server rank) that minimise the
/// busiest host link's bytes in a push+pull; empty when the even split is as good
/// (within one unit of the optimum: symmetric layouts, one host, unknown hosts).
std::vector<int64_t> LinkBalancedShares(const HostLayout& layout);

/// Relative weights (whole numbers >= 0, at least one positive) as shares: floor of
/// each weight's fraction of kShareUnits, the remainder one unit each to the first
/// servers with a positive weight. Empty (the even split) when the weights are equal.
std::vector<int64_t> SharesFromWeights(const std::vector<int64_t>& weights);

/// The shares Options::server_weights (PSKV_SERVER_WEIGHTS) asks for: "balanced"
/// (LinkBalancedShares), "auto" (LinkBalancedShares where they leave the servers on
/// worker hosts nothing, else even: measured faster so), "even" (empty) or a list of
/// weights, one per server rank (ConfigError if their number differs from the servers').
std::vector<int64_t> ServerShares(const std::string& spec, const HostLayout& layout);

/// The server ranks that replicate server rank `r`'s range in the initial range table
/// (ps/range_table.h, RangeTable::Initial): r + 1 .. r + R mod `servers`, R =
/// `replicas` clamped to [0, servers - 1].
std::vector<int> ReplicaRanks(int r, int servers, int replicas);

/// The busiest host link's bytes in one direction in a push+pull of a key of one byte
/// with `shares` (empty: even): the factor of M / B in the step's bound. With
/// `replicas` = R > 0 (PSKV_REPLICAS) every server r also sends its round of the key,
/// share_r of it, to each of its R replicas, servers r + 1 .. r + R (mod S; the initial
/// range table, ps/range_table.h): a link carries those copies that leave or reach its
/// host on top of the workers' pushes and answers; with R = 1 the copy to a host with
/// workers replaces the primary's answers to them (the replica answers its host's
/// workers' push-pulls: docs/fault-tolerance.md, "Answers from a copy on the worker's
/// host"). Every step is taken as push-pulls of dense keys, as in the rest of this
/// model.
double MaxLinkLoad(const HostLayout& layout, const std::vector<int64_t>& shares, int replicas = 0);

/// Each host's link load (by host label) of which MaxLinkLoad is the largest; empty
/// where a node's host is unknown.
std::map<std::string, double> LinkLoads(const HostLayout& layout,
                                        const std::vector<int64_t>& shares, int replicas = 0);

/// Per server rank r: the rate (bytes per second) at which a worker and server r on
/// different hosts each send to the other, so that every connection's part of a
/// push+pull takes as long as the busiest link's bytes over `link_rate`:
/// link_rate * share_r / MaxLinkLoad(layout, shares, replicas). No link then carries
/// more than `link_rate` (a link's connections add up to its load), the copies to
/// the replicas (`replicas` > 0, unpaced) included, so no queue forms in front of a
/// replica's copy or its acknowledgement.
/// Empty where the layout is unknown.
std::vector<uint64_t> LinkPacingRates(const HostLayout& layout, const std::vector<int64_t>& shares,
                                      uint64_t link_rate, int replicas = 0);

}  // namespace pskv::dist
