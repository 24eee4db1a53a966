// Failure points (ps/fail_points.h): a node's are no-ops unless a test installed its
// own; the PSKV_TEST_* ones of the processes tests start (support/env_fail_points.h)
// come from their variables only, and hold or narrow what they are asked to.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ps/fail_points.h"
#include "ps/node.h"
#include "pskv/error.h"
#include "pskv/options.h"
#include "support/env_fail_points.h"
#include "support/env_guard.h"
#include "support/test_util.h"

using namespace pskv;
using namespace std::chrono_literals;

namespace {

// The variables a test set, and the fail points it installed, end with it.
struct EnvGuard : test::EnvGuard {
  ~EnvGuard() { InstallFailPoints(nullptr); }
};

Options ServerOptions() {
  return test::NodeOptions(Role::kServer, 9, 2, 1);
}

TEST(FailPoints, AProductionNodesDoNothing) {
  EnvGuard g;
  g.Set("PSKV_TEST_REPLY_DELAY", "250");  // read by no production code
  g.Set("PSKV_TEST_EXIT_AMID_REPLICATION", "1");
  Node node(ServerOptions());
  FailPoints& f = node.fail_points();
  EXPECT_EQ(f.ReplyDelay().count(), 0);
  EXPECT_FALSE(f.Wire().duplicate_replies);
  EXPECT_FALSE(f.Wire().bogus_credits);
  EXPECT_EQ(f.CopyHoldChanges(), 0u);
  std::vector<int> to = {1, 2, 3};
  f.ReplicationFanout(&to, "a dense round");
  EXPECT_EQ(to, (std::vector<int>{1, 2, 3}));
  std::function<void()> send = [] {};
  EXPECT_FALSE(f.HoldReplicatedRound(
      0, 1, [] { return uint64_t{1}; }, send));
  EXPECT_TRUE(send) << "not taken";
  f.Registered();  // returns
  f.RoundReplicated(0);
  f.InitForwarded(0);
  f.DelegatedRoundAcknowledged(0, 3);
  EXPECT_NO_THROW(Options::FromEnv());  // not Options' business either
}

TEST(FailPoints, InstalledOnesComeFromTheirVariablesOnly) {
  EnvGuard g;
  test::InstallEnvFailPoints();
  {
    Node none(ServerOptions());
    EXPECT_EQ(none.fail_points().ReplyDelay().count(), 0);
    EXPECT_FALSE(none.fail_points().Wire().bogus_credits);
  }
  g.Set("PSKV_TEST_REPLY_DELAY", "250");
  g.Set("PSKV_TEST_DUPLICATE_REPLIES", "1");
  g.Set("PSKV_TEST_BOGUS_CREDITS", "1");
  g.Set("PSKV_TEST_COPY_HOLD_CHANGES", "8");
  Node node(ServerOptions());
  FailPoints& f = node.fail_points();
  EXPECT_EQ(f.ReplyDelay().count(), 250);
  EXPECT_TRUE(f.Wire().duplicate_replies);
  EXPECT_TRUE(f.Wire().bogus_credits);
  EXPECT_EQ(f.CopyHoldChanges(), 8u);
  g.Set("PSKV_TEST_REPLY_DELAY", "soon");
  EXPECT_THROW(test::InstallEnvFailPoints(), ConfigError);
  g.Set("PSKV_TEST_REPLY_DELAY", "-1");
  EXPECT_THROW(test::InstallEnvFailPoints(), ConfigError);
  InstallFailPoints(nullptr);
  Node after(ServerOptions());
  EXPECT_EQ(after.fail_points().CopyHoldChanges(), 0u) << "uninstalled: no-ops again";
}

// The n-th change with several targets goes to the first (n) or the last (-n) only.
TEST(FailPoints, AmidReplicationNarrowsTheNthFanout) {
  for (const char* n : {"2", "-2"}) {
    EnvGuard g;
    g.Set("PSKV_TEST_EXIT_AMID_REPLICATION", n);
    test::InstallEnvFailPoints();
    Node node(ServerOptions());
    std::vector<int> first = {8, 10, 12}, second = first, third = first;
    node.fail_points().ReplicationFanout(&first, "a dense round");
    node.fail_points().ReplicationFanout(&second, "a dense round");
    node.fail_points().ReplicationFanout(&third, "a dense round");
    EXPECT_EQ(first.size(), 3u);
    EXPECT_EQ(second, std::vector<int>{n[0] == '-' ? 12 : 8});
    EXPECT_EQ(third.size(), 3u);
  }
}

// A held round is sent from the fail point's thread once the table changed; Quiesce
// waits for it. Another round, or a later table, is sent at once.
TEST(FailPoints, AHeldRoundIsSentWhenTheTableChanged) {
  EnvGuard g;
  g.Set("PSKV_TEST_HOLD_REPLICATION_ROUND", "5");
  test::InstallEnvFailPoints();
  Node node(ServerOptions());
  FailPoints& f = node.fail_points();
  std::atomic<uint64_t> version{1};
  std::atomic<int> sent{0};
  std::function<void()> send = [&] { sent++; };
  EXPECT_FALSE(f.HoldReplicatedRound(
      0, 4, [&] { return version.load(); }, send));
  version = 2;
  EXPECT_FALSE(f.HoldReplicatedRound(
      0, 5, [&] { return version.load(); }, send));
  version = 1;
  ASSERT_TRUE(f.HoldReplicatedRound(
      0, 5, [&] { return version.load(); }, send));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(sent.load(), 0) << "held while the table is the first";
  version = 2;
  f.Quiesce();
  EXPECT_EQ(sent.load(), 1);
}

}  // namespace
