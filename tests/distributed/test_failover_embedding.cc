// Lose a server, lose no row of a dynamic embedding table (docs/fault-tolerance.md,
// "Dynamic embedding tables"): dist_sync and dist_async jobs with PSKV_REPLICAS=1
// (embedding_failover_worker.cc: two tables, Zipf u64 ids, admission, TTL and LRU
// eviction, AdaGrad and Adam; each step pulls the rows it pushes gradients of), real
// processes over real ZeroMQ (tests/support/replica_job.h), a server killed with
// SIGKILL mid-training; every worker's final rows and versions are bitwise-equal to
// those of the same job without replicas, undisturbed.
#include <gtest/gtest.h>

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

// The same job without replicas, undisturbed (per mode, servers and workers).
std::vector<std::string> Unreplicated(const std::string& mode, int servers, int workers) {
  return RunReplicaJob(
             Spec("emb_plain_" + mode + std::to_string(servers), mode, servers, workers, 0, 0))
      .weights;
}

}  // namespace

// Each server killed amid the rounds (30 ms per request on the servers: the kill lands
// amid pulls, pushes, a round's update and its replication), 2 workers, 2 servers.
TEST(FailoverEmbedding, SyncKillEitherServerLosesNoRow) {
  const auto want = Unreplicated("sync", 2, 2);
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
  const auto want = Unreplicated("sync", 3, 2);
  auto r = RunReplicaJob(Spec("emb_sync3_kill", "sync", 3, 2, 1, 30), 1, "w0.r4");
  ExpectSameWeights(want, r.weights, "3 servers, server 1 killed after round 4");
}

// dist_async, one worker (its pushes' order is the tables'): each server killed amid
// the pushes; every push applied once, at the same step.
TEST(FailoverEmbedding, AsyncKillEitherServerLosesNoPush) {
  const auto want = Unreplicated("async", 2, 1);
  for (int victim : {0, 1}) {
    const std::string what =
        "dist_async, server " + std::to_string(victim) + " killed after step 3";
    auto r = RunReplicaJob(Spec("emb_async_kill" + std::to_string(victim), "async", 2, 1, 1, 30),
                           victim, "w0.r3");
    ExpectSameWeights(want, r.weights, what);
  }
}
