// A server lost while the job starts and while workers Init their keys
// (docs/fault-tolerance.md, "What is survived, and what is not"): real processes over
// real ZeroMQ (tests/support/replica_job.h, failover_worker.cc: rank 0 inits a small
// key, a key sliced over every server and cut into wire chunks, and two small keys;
// each primary forwards an init to its replicas before answering it). Every worker's
// final weights must be bitwise-equal to the undisturbed job's.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "support/replica_job.h"

using namespace pskv::test;

namespace {

constexpr int kRounds = 8;

ReplicaJobSpec Spec(const std::string& name, int reply_delay_ms = 0) {
  ReplicaJobSpec s;
  s.name = "init_" + name;
  s.server = PSKV_SERVER;
  s.worker = {FAILOVER_WORKER, std::to_string(kRounds)};
  s.reply_delay_ms = reply_delay_ms;
  return s;
}

const std::vector<std::string>& Undisturbed() {
  static const std::vector<std::string> w = RunReplicaJob(Spec("undisturbed")).weights;
  return w;
}

}  // namespace

// The primary of a range exits right after its replica acknowledged the init it
// forwarded, before answering it (PSKV_TEST_EXIT_AFTER_FORWARDED_INITS): rank 0 sends
// the init again to the promoted replica, which holds the key already. It answers the
// retry from its state instead of failing it as a second init of the key (or applying
// it again).
TEST(FailoverInit, AnInitTheReplicaHoldsIsAnsweredNotAppliedAgain) {
  const auto& want = Undisturbed();
  for (int victim : {0, 1})
    for (int n : {1, 2}) {
      const std::string what = "server " + std::to_string(victim) + " exited after its " +
                               std::to_string(n) + ". forwarded init";
      auto s = Spec("forwarded" + std::to_string(victim) + std::to_string(n));
      s.server_env[victim]["PSKV_TEST_EXIT_AFTER_FORWARDED_INITS"] = std::to_string(n);
      const auto got =
          RunReplicaJob(s, {{victim, "", AfterLogLine("forwarded inits (test hook)")}});
      ExpectSameWeights(want, got.weights, what);
      EXPECT_NE(got.log.find("retried init(s) answered from state"), std::string::npos)
          << what << "\n"
          << got.log;
    }
}

// The same for row_sparse keys (sparse_failover_worker.cc: its first init is of a
// table sliced over both servers): the promoted replica answers the retried init of
// the table it holds.
TEST(FailoverInit, ARowSparseInitTheReplicaHoldsIsAnsweredNotAppliedAgain) {
  auto spec = [](const std::string& name) {
    ReplicaJobSpec s;
    s.name = "init_sparse_" + name;
    s.server = PSKV_SERVER;
    s.worker = {SPARSE_FAILOVER_WORKER, std::to_string(kRounds)};
    return s;
  };
  const auto want = RunReplicaJob(spec("undisturbed")).weights;
  for (int victim : {0, 1}) {
    auto s = spec(std::to_string(victim));
    s.server_env[victim]["PSKV_TEST_EXIT_AFTER_FORWARDED_INITS"] = "1";
    const auto got = RunReplicaJob(s, {{victim, "", AfterLogLine("forwarded inits (test hook)")}});
    ExpectSameWeights(
        want, got.weights,
        "server " + std::to_string(victim) + " exited after its first forwarded init");
  }
}

// Each server killed while rank 0's inits are in flight (30 ms per request on the
// servers: after the first key's init, amid the sliced key's), and after the last
// init, amid the optimizer's setting and the first round.
TEST(FailoverInit, KillDuringInitLosesNothing) {
  const auto& want = Undisturbed();
  int n = 0;
  for (int victim : {0, 1})
    for (const char* marker : {"w0.i0", "w0.i3"}) {
      const std::string what =
          "server " + std::to_string(victim) + " killed once " + marker + " was written";
      const auto got = RunReplicaJob(Spec("kill" + std::to_string(n++), 30), victim, marker);
      ExpectSameWeights(want, got.weights, what);
    }
}

// A server lost after its node table arrived (every node computed the first range
// table) and before the job's start barrier completed (PSKV_TEST_EXIT_AT_START): the
// barrier goes on without it, and the inits go to the promoted replica.
TEST(FailoverInit, AServerLostBeforeTheStartBarrierLosesNothing) {
  const auto& want = Undisturbed();
  for (int victim : {0, 1}) {
    auto s = Spec("start" + std::to_string(victim));
    s.server_env[victim]["PSKV_TEST_EXIT_AT_START"] = "1";
    const auto got =
        RunReplicaJob(s, {{victim, "", AfterLogLine("exiting before the start barrier")}});
    ExpectSameWeights(want, got.weights, "server " + std::to_string(victim) + " lost at start");
  }
}

// A spare joins the ranges of a server killed amid the inits (the copy is taken while
// rank 0's later inits arrive, which the spare gets forwarded as a replica being
// copied); once it is a replica of both ranges the other server is killed too, and the
// job finishes on the spare alone.
TEST(FailoverInit, ASpareJoinsWhileInitsArriveAndASecondLossIsSurvived) {
  const auto& want = Undisturbed();
  auto s = Spec("spare", 30);
  s.spares = 1;
  double ms = 0;
  const auto got =
      RunReplicaJob(s, {{0, "w0.i0", {}}, {1, "", AfterFullStrength(2, kRounds, &ms)}});
  ExpectSameWeights(want, got.weights, "server 0 killed amid the inits, then server 1");
}

// The workers' init reports and the check that they agree go to every live server of
// a replicated job: with server 0 lost at start, two workers that init a key with
// different shapes still both fail with a ShapeError naming both (dist_worker's
// shape_mismatch scenario), instead of the check being skipped with the server.
TEST(FailoverInit, InitReportsOutliveServerZero) {
  ReplicaJobSpec s;
  s.name = "init_reports";
  s.server = PSKV_SERVER;
  s.worker = {DIST_WORKER, "shape_mismatch"};
  s.server_env[0]["PSKV_TEST_EXIT_AT_START"] = "1";
  const auto got = RunReplicaJob(s, {{0, "", AfterLogLine("exiting before the start barrier")}});
  EXPECT_TRUE(got.ok) << got.log;
}
