// Lose a server, lose nothing, with row_sparse keys (docs/fault-tolerance.md): a
// dist_sync job with PSKV_REPLICAS=1 (sparse_failover_worker.cc: Adam with lazy row
// updates, weight decay and a schedule; a row_sparse table sliced over both servers,
// one held by one server, a dense key), real processes over real ZeroMQ
// (tests/support/replica_job.h), one server killed with SIGKILL at a chosen round;
// every worker's final weights are bitwise-equal to the undisturbed job's.
#include <gtest/gtest.h>

#include "support/replica_job.h"

using namespace pskv::test;

namespace {

constexpr int kRounds = 10;

ReplicaJobSpec Spec(const std::string& name, int reply_delay_ms, int replicas = 1) {
  ReplicaJobSpec s;
  s.name = name;
  s.server = PSKV_SERVER;
  s.worker = {SPARSE_FAILOVER_WORKER, std::to_string(kRounds)};
  s.replicas = replicas;
  s.reply_delay_ms = reply_delay_ms;
  return s;
}

const std::vector<std::string>& Undisturbed() {
  static const std::vector<std::string> w = RunReplicaJob(Spec("sparse_undisturbed", 0)).weights;
  return w;
}

void ExpectEqualWeights(const ReplicaJobResult& got, const std::string& what) {
  ExpectSameWeights(Undisturbed(), got.weights, what);
}

}  // namespace

// The undisturbed job with replicas gives the bits of the job without.
TEST(FailoverSparse, ReplicasDoNotChangeTheResult) {
  ExpectEqualWeights(RunReplicaJob(Spec("sparse_unreplicated", 0, 0)), "PSKV_REPLICAS=0");
}

// Each server, killed while the job runs (5 ms per request in the servers: the rounds
// are slow enough for the kill to land before the job ends) and inside rounds (30 ms
// per request: the kill lands amid pushes, a round's merge, its replication and the
// pulls).
TEST(FailoverSparse, KillServerLosesNothing) {
  int n = 0;
  for (int delay : {5, 30})
    for (int victim : {0, 1})
      for (int after : {2, 5}) {
        const std::string what = "server " + std::to_string(victim) + " killed after round " +
                                 std::to_string(after) + " (" + std::to_string(delay) +
                                 " ms per request)";
        auto r = RunReplicaJob(Spec("sparse_kill" + std::to_string(n++), delay), victim,
                               "w0.r" + std::to_string(after));
        ExpectEqualWeights(r, what);
        std::printf("[ stall ] %s: slowest round %.0f ms (heartbeat timeout 1.5 s)\n", what.c_str(),
                    r.slowest_ms);
      }
}

// PSKV_REPLICAS=2 with three servers: the primary of key range 1 sends a row_sparse
// round to one of its two replicas only and exits once that one acknowledged it
// (PSKV_TEST_EXIT_AMID_REPLICATION). Server 2, promoted, is a round ahead of server 0
// and sends that round again (ResendLastRounds) before its own; then server 2 is
// killed too and server 0 leads every range: the copies agreed, the weights are the
// undisturbed job's. Without the round sent again, server 0 refuses server 2's next
// round ("round r + 1 before round r") and the job fails.
TEST(FailoverSparse, APromotedReplicaAheadOfTheOtherSendsItsLastRoundAgain) {
  auto spec = [](const std::string& name) {
    auto s = Spec(name, 5, 2);  // 5 ms per request: the second kill lands amid the job
    s.servers = 3;
    return s;
  };
  const auto want = RunReplicaJob(spec("sparse_r2_undisturbed")).weights;
  auto s = spec("sparse_r2_ahead");
  s.server_env[1]["PSKV_TEST_EXIT_AMID_REPLICATION"] = "8";
  const auto got = RunReplicaJob(s, {{1, "w0.r6", {}}, {2, "w0.r7", {}}});
  ExpectSameWeights(want, got.weights,
                    "server 1 died amid a row_sparse round, then server 2 killed");
  EXPECT_NE(got.log.find("(a row_sparse round) to server[2]"), std::string::npos) << got.log;
  EXPECT_NE(got.log.find("again to its other copies"), std::string::npos) << got.log;
  EXPECT_NE(got.log.find("range 1 server[0]"), std::string::npos) << "server 0 led at the end\n"
                                                                  << got.log;
}
