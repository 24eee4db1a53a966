// Failovers beyond one kill of a job that only pushes and pulls (docs/fault-tolerance.md):
// real processes over real ZeroMQ (tests/support/replica_job.h, failover_worker.cc:
// Adam with weight decay and a schedule, a key sliced over every server and cut into
// wire chunks, fused small keys); every worker's final weights must be bitwise-equal
// to the undisturbed job's.
//  * FailoverCommands: every round starts with a Barrier() (two command fan-outs to
//    every server), so a kill lands amid commands.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "support/replica_job.h"

using namespace pskv::test;

namespace {

constexpr int kRounds = 12;

ReplicaJobSpec Spec(const std::string& name, int servers, int replicas, bool barriers,
                    int reply_delay_ms = 0) {
  ReplicaJobSpec s;
  s.name = name;
  s.server = PSKV_SERVER;
  s.worker = {FAILOVER_WORKER};
  if (barriers) s.worker.push_back("--barriers");
  s.worker.push_back(std::to_string(kRounds));
  s.servers = servers;
  s.replicas = replicas;
  s.reply_delay_ms = reply_delay_ms;
  return s;
}

}  // namespace

// Each server killed right after a round, when the next round's Barrier() fans its
// commands out: the commands complete (a server known gone counts as answered) and
// the job loses nothing.
TEST(FailoverCommands, KillAmidBarriersLosesNothing) {
  const auto want = RunReplicaJob(Spec("barriers_undisturbed", 2, 1, true)).weights;
  int n = 0;
  for (int victim : {0, 1})
    for (int after : {3, 8}) {
      const std::string what =
          "server " + std::to_string(victim) + " killed after round " + std::to_string(after);
      const auto got = RunReplicaJob(Spec("barriers_kill" + std::to_string(n++), 2, 1, true),
                                     victim, "w0.r" + std::to_string(after));
      ExpectSameWeights(want, got.weights, what);
    }
}

// A round whose replicas the primary chose before the range table removed one of them
// (the replica was killed meanwhile) and sent after: server 0 holds the replication of
// every key's round 5 (PSKV_TEST_HOLD_REPLICATION_ROUND) until the table changes, and
// server 1, its replica, is killed during that round. The round goes on without the
// dead replica instead of waiting for its answer forever (the workers' PSKV_TIMEOUT).
TEST(FailoverChain, RoundSentAfterItsReplicaWasRemovedIsNotWaitedFor) {
  const auto want = RunReplicaJob(Spec("held_undisturbed", 2, 1, false)).weights;
  auto s = Spec("held_kill", 2, 1, false);
  s.server_env[0]["PSKV_TEST_HOLD_REPLICATION_ROUND"] = "5";
  s.env["PSKV_TIMEOUT"] = "20";
  const auto got = RunReplicaJob(s, {{1, "w0.r4", [](const ReplicaJobRun&) {
                                        // server 0 holds round 5 by now
                                        std::this_thread::sleep_for(std::chrono::milliseconds(300));
                                        return std::string();
                                      }}});
  ExpectSameWeights(want, got.weights, "server 1 killed while server 0 held round 5");
  EXPECT_NE(got.log.find("chosen before range table v2 (test hook)"), std::string::npos) << got.log;
}

// The undisturbed job with three servers and PSKV_REPLICAS=2.
const std::vector<std::string>& R2Undisturbed() {
  static const std::vector<std::string> w =
      RunReplicaJob(Spec("r2_undisturbed", 3, 2, false)).weights;
  return w;
}

// PSKV_REPLICAS=2 with three servers: every range on all three. Two servers killed one
// after the other while requests are in flight (30 ms per request on the servers): the
// job finishes on the last server with the undisturbed job's bits.
TEST(FailoverChain, TwoReplicasSurviveTwoKillsInsideRounds) {
  const auto& want = R2Undisturbed();
  const std::vector<std::pair<int, int>> orders = {{1, 2}, {0, 1}};
  int n = 0;
  for (auto [first, second] : orders) {
    const std::string what = "server " + std::to_string(first) + " killed during round 4, server " +
                             std::to_string(second) + " during round 8";
    const auto got = RunReplicaJob(Spec("r2_kills" + std::to_string(n++), 3, 2, false, 30),
                                   {{first, "w0.r3", {}}, {second, "w0.r7", {}}});
    ExpectSameWeights(want, got.weights, what);
  }
}

// The primary of range 1 dies between sending a round to its two replicas: it sends
// its 20th replicated change to server 2 only and exits once server 2 acknowledged it
// (PSKV_TEST_EXIT_AMID_REPLICATION). Server 2, promoted, is a round ahead of server 0
// and sends that round again before its own; then server 2 is killed too, and server 0
// leads every range: the copies agreed, the weights are the undisturbed job's.
TEST(FailoverChain, APromotedReplicaAheadOfTheOtherSendsItsLastRoundAgain) {
  const auto& want = R2Undisturbed();
  auto s = Spec("r2_ahead", 3, 2, false);
  s.server_env[1]["PSKV_TEST_EXIT_AMID_REPLICATION"] = "20";
  const auto got =
      RunReplicaJob(s, {{1, "w0.r8", {}}, {2, "w0.r9", {}}});  // server 1 is gone by round 8
  ExpectSameWeights(want, got.weights, "server 1 died amid a replication, then server 2 killed");
  EXPECT_NE(got.log.find("exiting amid a replicated change, sent to server[2]"), std::string::npos)
      << got.log;
  EXPECT_NE(got.log.find("again to its other copies"), std::string::npos) << got.log;
}
