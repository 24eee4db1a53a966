// Lose a server, lose no row of a dynamic embedding table (docs/fault-tolerance.md,
// "Dynamic embedding tables"): dist_sync and dist_async jobs with PSKV_REPLICAS=1
// (embedding_failover_worker.cc: two tables, Zipf u64 ids, admission, TTL and LRU
// eviction, AdaGrad and Adam; each step pulls the rows it pushes gradients of), real
// processes over real ZeroMQ (tests/support/replica_job.h), a server killed with
// SIGKILL mid-training; every worker's final rows and versions are bitwise-equal to
// those of the same job without replicas, undisturbed.
#include <gtest/gtest.h>

#include <map>

#include "support/replica_job.h"

using namespace pskv::test;

namespace {

constexpr int kRounds = 10;

ReplicaJobSpec Spec(const std::string& name, const std::string& mode, int servers, int workers,
                    int replicas, int reply_delay_ms) {
  ReplicaJobSpec s;
  s.name = name;
  s.server = PSKV_SERVER;
  s.worker = {EMBEDDING_FAILOVER_WORKER, mode, std::to_string(kRounds)};
  s.servers = servers;
  s.workers = workers;
  s.replicas = replicas;
  s.reply_delay_ms = reply_delay_ms;
  return s;
}

// The same job without replicas, undisturbed (per mode, servers and workers; run once).
const std::vector<std::string>& Unreplicated(const std::string& mode, int servers, int workers) {
  static std::map<std::string, std::vector<std::string>> done;
  const std::string name = "emb_plain_" + mode + std::to_string(servers) + std::to_string(workers);
  auto it = done.find(name);
  if (it == done.end())
    it = done.emplace(name, RunReplicaJob(Spec(name, mode, servers, workers, 0, 0)).weights).first;
  return it->second;
}

}  // namespace

// Each server killed amid the rounds (30 ms per request on the servers: the kill lands
// amid pulls, pushes, a round's update and its replication), 2 workers, 2 servers.
TEST(FailoverEmbedding, SyncKillEitherServerLosesNoRow) {
  const auto& want = Unreplicated("sync", 2, 2);
  ExpectSameWeights(want, RunReplicaJob(Spec("emb_sync_r1", "sync", 2, 2, 1, 0)).weights,
                    "PSKV_REPLICAS=1, undisturbed");
  for (int victim : {0, 1}) {
    const std::string what = "server " + std::to_string(victim) + " killed after round 3";
    auto r = RunReplicaJob(Spec("emb_sync_kill" + std::to_string(victim), "sync", 2, 2, 1, 30),
                           victim, "w0.r3");
    ExpectSameWeights(want, r.weights, what);
    std::printf("[ stall ] %s: slowest round %.0f ms\n", what.c_str(), r.slowest_ms);
  }
}

// Three servers (range r on servers r and r + 1): server 1, primary of range 1 and the
// replica of range 0, killed amid the rounds.
TEST(FailoverEmbedding, SyncThreeServersKillAPrimaryLosesNoRow) {
  const auto& want = Unreplicated("sync", 3, 2);
  auto r = RunReplicaJob(Spec("emb_sync3_kill", "sync", 3, 2, 1, 30), 1, "w0.r4");
  ExpectSameWeights(want, r.weights, "3 servers, server 1 killed after round 4");
}

// dist_async, one worker (its pushes' order is the tables'): each server killed amid
// the pushes; every push applied once, at the same step.
TEST(FailoverEmbedding, AsyncKillEitherServerLosesNoPush) {
  const auto& want = Unreplicated("async", 2, 1);
  for (int victim : {0, 1}) {
    const std::string what =
        "dist_async, server " + std::to_string(victim) + " killed after step 3";
    auto r = RunReplicaJob(Spec("emb_async_kill" + std::to_string(victim), "async", 2, 1, 1, 30),
                           victim, "w0.r3");
    ExpectSameWeights(want, r.weights, what);
  }
}

// The primary of range 0 exits right after its replica acknowledged the create of
// the first table (PSKV_TEST_EXIT_AFTER_FORWARDED_INITS), or an update, before answering
// it (PSKV_TEST_EXIT_AFTER_REPLICATED_ROUNDS: the 6th): the workers send the create or
// the round's pushes again to the promoted replica, which holds them and answers them
// without applying them again (without the push counts the round is applied twice).
TEST(FailoverEmbedding, AnUpdateTheReplicaHoldsIsAnsweredNotAppliedAgain) {
  struct Case {
    std::string mode, hook, value, line;
  };
  const Case cases[] = {
      {"sync", "PSKV_TEST_EXIT_AFTER_FORWARDED_INITS", "1", "exiting after 1 forwarded inits"},
      {"sync", "PSKV_TEST_EXIT_AFTER_REPLICATED_ROUNDS", "6", "exiting after 6 replicated rounds"},
      {"async", "PSKV_TEST_EXIT_AFTER_REPLICATED_ROUNDS", "6",
       "exiting after 6 replicated rounds"}};
  for (const Case& c : cases) {
    const int workers = c.mode == "sync" ? 2 : 1;
    auto s = Spec("emb_held_" + c.mode + c.value, c.mode, 2, workers, 1, 0);
    s.server_env[0][c.hook] = c.value;
    const auto r = RunReplicaJob(s, {{0, "", AfterLogLine(c.line)}});
    ExpectSameWeights(Unreplicated(c.mode, 2, workers), r.weights,
                      c.mode + ": server 0 exits: " + c.line);
    if (c.line.find("rounds") != std::string::npos) {
      EXPECT_NE(r.log.find("answered without applying it again"), std::string::npos) << r.log;
    }
  }
}

// dist_async, 3 workers pushing at once, rows of 512 floats (updates of about 64 KiB,
// some above, some below) and a send window of one message (PSKV_WIRE_WINDOW_BYTES=1),
// server 0 killed after round 5: the job finishes without a replication error and the
// workers read the same rows. A big update overtaken by a smaller one on the way to
// the replica would be kept until its step comes (it prints how many were; none in
// the runs so far: the case is not provoked deterministically).
TEST(FailoverEmbedding, AsyncThreeWorkersWideRowsSurviveAKill) {
  auto s = Spec("emb_async_wide", "async-wide", 2, 3, 1, 0);
  s.env["PSKV_WIRE_WINDOW_BYTES"] = "1";
  s.env["PSKV_LOG_LEVEL"] = "info,kvstore=debug";  // says each update kept
  const auto r = RunReplicaJob(s, 0, "w0.r5");
  ASSERT_EQ(r.weights.size(), 3u);
  ExpectSameWeights(r.weights, r.weights, "dist_async, wide rows, server 0 killed");
  size_t kept = 0;
  for (size_t at = 0; (at = r.log.find("kept until the one at step", at)) != std::string::npos;
       ++at)
    ++kept;
  std::printf("[ overtaken ] %zu update(s) kept by a replica until their step came\n", kept);
}

// PSKV_REPLICAS=2 with three servers (every range on all three): two servers killed one
// after the other amid the rounds (30 ms per request on the servers); the job finishes
// on the last server with the unreplicated job's bits. A promoted replica sends its
// last change again to the other copy, which may have missed it (EmbeddingServer::
// TakeLastChanges; refused at create before).
TEST(FailoverEmbedding, TwoReplicasSurviveTwoKills) {
  const auto& want = Unreplicated("sync", 3, 2);
  ExpectSameWeights(want, RunReplicaJob(Spec("emb_r2", "sync", 3, 2, 2, 0)).weights,
                    "PSKV_REPLICAS=2, undisturbed");
  const std::vector<std::pair<int, int>> orders = {{1, 2}, {0, 1}};
  int n = 0;
  for (auto [first, second] : orders) {
    const std::string what = "PSKV_REPLICAS=2: server " + std::to_string(first) +
                             " killed after round 3, server " + std::to_string(second) +
                             " after round 7";
    const auto r = RunReplicaJob(Spec("emb_r2_kills" + std::to_string(n++), "sync", 3, 2, 2, 30),
                                 {{first, "w0.r3", {}}, {second, "w0.r7", {}}});
    ExpectSameWeights(want, r.weights, what);
  }
}

// A restore of replicated tables reaches the replicas (before it, only the primaries
// restored, so it was refused): the tables are saved after round 4 and restored after
// round 6; a primary killed after round 7 leaves the rows of the unreplicated job
// (whose rounds 5 and 6 were undone too). Without the replicas' restore the promoted
// copy serves rows that kept rounds 5 and 6.
TEST(FailoverEmbedding, ARestoreReachesTheReplicas) {
  const auto& want = Unreplicated("sync-restore", 2, 2);
  ASSERT_NE(want, Unreplicated("sync", 2, 2)) << "the restore changed nothing";
  for (int victim : {0, 1}) {
    const auto r = RunReplicaJob(
        Spec("emb_restore_kill" + std::to_string(victim), "sync-restore", 2, 2, 1, 30), victim,
        "w0.r7");
    ExpectSameWeights(
        want, r.weights,
        "restored after round 6, server " + std::to_string(victim) + " killed after round 7");
  }
}

// The primary of range 1 sends its 10th replicated change (a create or an update of
// a table) to server 2 only and exits once server 2 acknowledged it
// (PSKV_TEST_EXIT_AMID_REPLICATION). Server 2, promoted, holds a change server 0
// lacks: it sends it again before running the retried pushes (which it answers
// without applying them again); then server 2 is killed too and server 0 leads every
// range with the unreplicated job's bits. Without the change sent again, server 0
// lacks it for good.
TEST(FailoverEmbedding, APromotedReplicaAheadOfTheOtherSendsItsLastChangeAgain) {
  const auto& want = Unreplicated("sync", 3, 2);
  auto s = Spec("emb_r2_ahead", "sync", 3, 2, 2, 0);
  s.server_env[1]["PSKV_TEST_EXIT_AMID_REPLICATION"] = "10";
  const auto r = RunReplicaJob(s, {{1, "w0.r8", {}}, {2, "w0.r9", {}}});
  ExpectSameWeights(want, r.weights, "server 1 died amid a replication, then server 2 killed");
  EXPECT_NE(r.log.find("exiting amid a replicated change, sent to server[2]"), std::string::npos)
      << r.log;
  EXPECT_NE(r.log.find("again to its other copies"), std::string::npos) << r.log;
}
