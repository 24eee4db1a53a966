// Failovers beyond one kill of a job that only pushes and pulls (docs/fault-tolerance.md):
// real processes over real ZeroMQ (tests/support/replica_job.h, failover_worker.cc:
// Adam with weight decay and a schedule, a key sliced over every server and cut into
// wire chunks, fused small keys); every worker's final weights must be bitwise-equal
// to the undisturbed job's.
//  * FailoverCommands: every round starts with a Barrier() (two command fan-outs to
//    every server), so a kill lands amid commands.
#include <gtest/gtest.h>

#include <map>

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
