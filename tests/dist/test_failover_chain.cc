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
