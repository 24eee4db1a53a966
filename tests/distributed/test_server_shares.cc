// Shares of big keys per server (kvstore/distributed/server_shares.h) and the
// slices PlaceKey cuts from them (dist_protocol.h).
#include <gtest/gtest.h>

#include <numeric>

#include "kvstore/distributed/server_shares.h"
#include "pskv/error.h"

using namespace pskv;
using namespace pskv::dist;

namespace {

constexpr int64_t U = kShareUnits;

// n worker hosts, each with one worker and one server, and k hosts with one server
// only: the launcher's layout for -n n -s n+k on n+k hosts (servers on every host,
// workers cycling from the first).
HostLayout WorkersAndServerHosts(int n, int k) {
  HostLayout l;
  for (int h = 0; h < n + k; ++h) l.server_hosts.push_back("10.0.0." + std::to_string(h + 1));
  for (int h = 0; h < n; ++h) l.worker_hosts.push_back("10.0.0." + std::to_string(h + 1));
  return l;
}

int64_t Sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

}  // namespace

TEST(ServerShares, ServersOnTheWorkerHostsSplitEvenly) {
  // k = 0: all-reduce's bound 2(n-1)/n, which the even split reaches.
  for (int n : {2, 3, 4, 7}) {
    const HostLayout l = WorkersAndServerHosts(n, 0);
    EXPECT_TRUE(LinkBalancedShares(l).empty()) << n;
    EXPECT_NEAR(MaxLinkLoad(l, {}), 2.0 * (n - 1) / n, 1e-12);
  }
}

TEST(ServerShares, TwoExtraServerHostsHoldThreeTimesACoLocatedServersShare) {
  // n = 4, k = 2: co-located (n-k)/(n^2+kn-2k) = 0.1, the others 2(n-1)/20 = 0.3;
  // to the unit: the least T (busiest link, units of M/U) is 1258292, where the
  // co-located servers may hold 104858 and the others 314573 (2 units of room).
  const HostLayout l = WorkersAndServerHosts(4, 2);
  const auto s = LinkBalancedShares(l);
  EXPECT_EQ(s, (std::vector<int64_t>{104858, 104858, 104858, 104858, 314572, 314572}));
  EXPECT_EQ(Sum(s), U);
  EXPECT_NEAR(MaxLinkLoad(l, s), 1.2, 1e-5);        // t_opt = 2n(n-1)/(n^2+kn-2k) = 24/20
  EXPECT_NEAR(MaxLinkLoad(l, {}), 8.0 / 6, 1e-12);  // even: (S+n-2)/S
}

TEST(ServerShares, AsManyServerHostsAsWorkersTakeEverything) {
  // n = k = 4: the co-located servers get nothing, the step needs M/B (t_opt, 24/24).
  const HostLayout l = WorkersAndServerHosts(4, 4);
  const auto s = LinkBalancedShares(l);
  EXPECT_EQ(s, (std::vector<int64_t>{0, 0, 0, 0, U / 4, U / 4, U / 4, U / 4}));
  EXPECT_DOUBLE_EQ(MaxLinkLoad(l, s), 1.0);
  EXPECT_DOUBLE_EQ(MaxLinkLoad(l, {}), 1.25);
}

TEST(ServerShares, MoreServerHostsThanWorkersShareTheKeyEvenly) {
  // n = 3, k = 5: nothing co-located; the five others alike (not one filled first).
  const HostLayout l = WorkersAndServerHosts(3, 5);
  const auto s = LinkBalancedShares(l);
  EXPECT_EQ(s, (std::vector<int64_t>{0, 0, 0, 209716, 209715, 209715, 209715, 209715}));
  EXPECT_NEAR(MaxLinkLoad(l, s), 1.0, 1e-5);
  // n = 2: every split loads the worker links with M; even is as good.
  EXPECT_TRUE(LinkBalancedShares(WorkersAndServerHosts(2, 4)).empty());
}

TEST(ServerShares, DegenerateLayoutsSplitEvenly) {
  HostLayout one;  // everything on one host: no link at all
  one.server_hosts = {"127.0.0.1", "127.0.0.1", "127.0.0.1"};
  one.worker_hosts = {"127.0.0.1", "127.0.0.1"};
  EXPECT_TRUE(LinkBalancedShares(one).empty());
  HostLayout unknown = WorkersAndServerHosts(4, 4);
  unknown.server_hosts[5] = "";
  EXPECT_TRUE(LinkBalancedShares(unknown).empty());
  HostLayout single = WorkersAndServerHosts(4, 0);
  single.server_hosts.resize(1);
  EXPECT_TRUE(LinkBalancedShares(single).empty());
  EXPECT_TRUE(LinkBalancedShares(HostLayout{{"a", "b"}, {}}).empty());
  // One worker with a server beside it: the co-located server holds everything.
  HostLayout lone{{"a", "b", "c"}, {"a"}};
  EXPECT_EQ(LinkBalancedShares(lone), (std::vector<int64_t>{U, 0, 0}));
  EXPECT_DOUBLE_EQ(MaxLinkLoad(lone, LinkBalancedShares(lone)), 0.0);
}

TEST(ServerShares, TwoServersOnAHostShareItsUnits) {
  // Servers 0 and 2 on the extra host, 1 and 3 on the worker hosts (n = 2 + 1 worker
  // on the extra host's neighbour): whatever the split, a host's units are split
  // evenly over its servers and the total is U.
  HostLayout l{{"x", "a", "x", "b"}, {"a", "b", "c"}};
  const auto s = LinkBalancedShares(l);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(Sum(s), U);
  EXPECT_LE(std::abs(s[0] - s[2]), 1);
  EXPECT_LT(MaxLinkLoad(l, s), MaxLinkLoad(l, {}));
}

TEST(ServerShares, WeightsGivenByTheUser) {
  EXPECT_EQ(SharesFromWeights({1, 0, 3}), (std::vector<int64_t>{U / 4, 0, 3 * U / 4}));
  EXPECT_EQ(SharesFromWeights({1, 2}), (std::vector<int64_t>{349526, 699050}));
  EXPECT_TRUE(SharesFromWeights({5, 5, 5}).empty());  // equal: the even split
  EXPECT_THROW(SharesFromWeights({0, 0}), InvalidArgument);
  EXPECT_THROW(SharesFromWeights({1, -1}), InvalidArgument);
  const HostLayout l = WorkersAndServerHosts(2, 1);
  EXPECT_TRUE(ServerShares("even", l).empty());
  EXPECT_EQ(ServerShares("balanced", l), LinkBalancedShares(l));
  EXPECT_EQ(ServerShares("0,1,1", l), (std::vector<int64_t>{0, U / 2, U / 2}));
  EXPECT_THROW(ServerShares("1,1", l), ConfigError);
}

// auto: the balanced shares only where they take every byte off the worker hosts
// (k >= n); with 0 < k < n the even split (measured faster: docs/performance.md).
TEST(ServerShares, AutoIsBalancedOnlyWhenTheWorkerHostsKeepNothing) {
  for (int k : {1, 2, 3}) {
    const HostLayout l = WorkersAndServerHosts(4, k);
    EXPECT_FALSE(LinkBalancedShares(l).empty()) << k;
    EXPECT_TRUE(ServerShares("auto", l).empty()) << k;
    EXPECT_TRUE(ServerShares("", l).empty()) << k;
  }
  for (int k : {4, 6}) {
    const HostLayout l = WorkersAndServerHosts(4, k);
    EXPECT_FALSE(ServerShares("auto", l).empty()) << k;
    EXPECT_EQ(ServerShares("auto", l), LinkBalancedShares(l)) << k;
  }
  EXPECT_TRUE(ServerShares("auto", WorkersAndServerHosts(4, 0)).empty());
}

TEST(ServerShares, PlaceKeyCutsContiguousSlicesByShare) {
  const std::vector<int64_t> shares = {104858, 104858, 104858, 104858, 314572, 314572};
  for (int64_t n : {int64_t{1000}, int64_t{16} << 20, (int64_t{1} << 40) + 12345}) {
    const auto slices = PlaceKey(7, n, 6, 1000, shares);
    ASSERT_EQ(slices.size(), 6u);
    int64_t at = 0;
    for (size_t i = 0; i < slices.size(); ++i) {
      EXPECT_EQ(slices[i].server, static_cast<int>(i));
      EXPECT_EQ(slices[i].offset, at);
      // floor(n C / U) at both ends: within one element of the share.
      EXPECT_NEAR(static_cast<double>(slices[i].len),
                  static_cast<double>(n) * static_cast<double>(shares[i]) / U, 1.0);
      at += slices[i].len;
    }
    EXPECT_EQ(at, n);
  }
  // A share of 0 is an empty slice, which ChunkSlices leaves out.
  const auto slices = PlaceKey(7, 4000, 4, 1000, {0, U / 2, 0, U / 2});
  EXPECT_EQ(slices[0].len, 0);
  EXPECT_EQ(slices[2].len, 0);
  EXPECT_EQ(slices[1].len + slices[3].len, 4000);
  const auto chunks = ChunkSlices(slices, 4, 1024, 4);
  for (const Chunk& c : chunks) EXPECT_TRUE(c.server == 1 || c.server == 3);
  // Small keys ignore the shares; no shares is the even split.
  EXPECT_EQ(PlaceKey(7, 999, 4, 1000, {0, U / 2, 0, U / 2}).size(), 1u);
  const auto even = PlaceKey(7, 4000, 4, 1000);
  for (const Slice& s : even) EXPECT_EQ(s.len, 1000);
}

TEST(ServerShares, PacingRatesFillTheBusiestLinkAndNoMore) {
  // k = 2, n = 4, balanced: co-located servers 0.1 of the key, extra hosts 0.3; the
  // busiest link carries 1.2 M, so a connection moves share/1.2 of the link rate.
  const HostLayout l = WorkersAndServerHosts(4, 2);
  const std::vector<int64_t> s = LinkBalancedShares(l);
  const uint64_t B = 12000000;
  const std::vector<uint64_t> r = LinkPacingRates(l, s, B);
  ASSERT_EQ(r.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_NEAR(static_cast<double>(r[i]),
                static_cast<double>(B) * static_cast<double>(s[i]) / static_cast<double>(U) / 1.2,
                B * 1e-4)
        << i;
  // A worker host's uplink: its pushes to the 3 other co-located servers and the 2
  // extra hosts, and its server's answers to the 3 other workers, add up to the link.
  const double uplink = 3.0 * static_cast<double>(r[1]) + static_cast<double>(r[4] + r[5]) +
                        3.0 * static_cast<double>(r[0]);
  EXPECT_NEAR(uplink, static_cast<double>(B), B * 1e-4);
  // An extra host answers 4 workers at its rate: the link again.
  EXPECT_NEAR(4.0 * static_cast<double>(r[4]), static_cast<double>(B), B * 1e-4);
  // Even split over 6 servers (load 8/6 of M): every connection 1/6 / (8/6) = 1/8 of B.
  for (uint64_t x : LinkPacingRates(l, {}, B)) EXPECT_NEAR(static_cast<double>(x), B / 8.0, 1.0);
  // A server holding no part of big keys still gets 1/S of the link over the load.
  const HostLayout k4 = WorkersAndServerHosts(4, 4);
  const std::vector<uint64_t> r4 = LinkPacingRates(k4, LinkBalancedShares(k4), B);
  ASSERT_EQ(r4.size(), 8u);
  EXPECT_NEAR(static_cast<double>(r4[0]), B / 8.0, 2.0);
  EXPECT_NEAR(static_cast<double>(r4[7]), B / 4.0, B * 1e-4);
  // Unknown hosts or no rate: no pacing.
  EXPECT_TRUE(LinkPacingRates(l, s, 0).empty());
  HostLayout unknown = l;
  unknown.worker_hosts[0].clear();
  EXPECT_TRUE(LinkPacingRates(unknown, s, B).empty());
}

TEST(ServerShares, PacingLeavesTheReplicasCopiesTheirRoomOnEveryLink) {
  const uint64_t B = 12000000;
  // Servers on hosts of their own (2x2): a server link carries the 2 workers' halves
  // and its range's copy to the other server, 1.5 M; the copy and the workers'
  // connections each get a third of the link.
  HostLayout own;
  own.server_hosts = {"s0", "s1"};
  own.worker_hosts = {"w0", "w1"};
  EXPECT_DOUBLE_EQ(MaxLinkLoad(own, {}), 1.0);
  EXPECT_DOUBLE_EQ(MaxLinkLoad(own, {}, 1), 1.5);
  const std::vector<uint64_t> r = LinkPacingRates(own, {}, B, 1);
  ASSERT_EQ(r.size(), 2u);
  for (uint64_t x : r) EXPECT_NEAR(static_cast<double>(x), B / 3.0, 1.0);
  // Server 0's uplink: answers to both workers and its copy to server 1; its downlink:
  // both workers' pushes and server 1's copy. Each adds up to the link, no more.
  EXPECT_NEAR(2.0 * static_cast<double>(r[0]) + static_cast<double>(r[0]), B, 3.0);
  EXPECT_NEAR(2.0 * static_cast<double>(r[0]) + static_cast<double>(r[1]), B, 3.0);
  // Without replicas the plan is unchanged (half the link per connection).
  for (uint64_t x : LinkPacingRates(own, {}, B)) EXPECT_NEAR(static_cast<double>(x), B / 2.0, 1.0);
  // More replicas than other servers count as S - 1.
  EXPECT_DOUBLE_EQ(MaxLinkLoad(own, {}, 5), 1.5);
  // The floors of docs/performance.md ("Replicated servers"). A server on every
  // worker host, R = 1: the copy replaces the primary's answer to the replica's
  // worker, nothing more crosses a link (2x2, 4x4: R=0's load); with R = 2 nobody
  // answers for the primary, and each host sends 2 copies of 1/4 more: 1.5 + 0.5.
  for (int n : {2, 4})
    EXPECT_NEAR(MaxLinkLoad(WorkersAndServerHosts(n, 0), {}, 1),
                MaxLinkLoad(WorkersAndServerHosts(n, 0), {}), 1e-12)
        << n;
  EXPECT_NEAR(MaxLinkLoad(WorkersAndServerHosts(4, 0), {}, 2), 2.0, 1e-12);
  // Own hosts: 4x4 +25 %.
  HostLayout own4;
  for (int h = 0; h < 4; ++h) own4.server_hosts.push_back("s" + std::to_string(h));
  for (int h = 0; h < 4; ++h) own4.worker_hosts.push_back("w" + std::to_string(h));
  EXPECT_NEAR(MaxLinkLoad(own4, {}, 1), 1.25, 1e-12);
  EXPECT_NEAR(MaxLinkLoad(own4, {}, 2), 1.5, 1e-12);
  // A replica on its primary's host crosses no link: nothing to leave room for.
  HostLayout together;
  together.server_hosts = {"s", "s"};
  together.worker_hosts = {"w0", "w1"};
  EXPECT_DOUBLE_EQ(MaxLinkLoad(together, {}, 1), MaxLinkLoad(together, {}));
  // Weighted shares: server 0 holds 3/4, so its copy (3/4 M) makes server 1's downlink
  // the busiest: 2 x 1/4 + 3/4 = 1.25, and server 0's uplink 2 x 3/4 + 3/4 = 2.25.
  const std::vector<int64_t> s = SharesFromWeights({3, 1});
  EXPECT_NEAR(MaxLinkLoad(own, s, 1), 2.25, 1e-5);
}

TEST(ServerShares, ReplicaRanksFollowTheInitialRangeTable) {
  EXPECT_EQ(ReplicaRanks(0, 2, 1), (std::vector<int>{1}));
  EXPECT_EQ(ReplicaRanks(3, 4, 2), (std::vector<int>{0, 1}));
  EXPECT_EQ(ReplicaRanks(1, 3, 7), (std::vector<int>{2, 0}));
  EXPECT_TRUE(ReplicaRanks(0, 1, 1).empty());
  EXPECT_TRUE(ReplicaRanks(2, 4, 0).empty());
}
