// dist_async with replicated servers (docs/fault-tolerance.md): every push is applied
// exactly once, whichever server is killed (SIGKILL) and when. Real processes over
// real ZeroMQ (tests/support/replica_job.h); two workers push integer-valued gradients
// under SGD at learning rate 1 (async_count_worker.cc), so the final weights are
// exactly minus the sum of all pushes: a push lost, or retried after the failover
// and applied twice, changes them.
#include <gtest/gtest.h>

#include <cstring>

#include "async_count.h"
#include "support/replica_job.h"

using namespace pskv::test;

namespace {

constexpr int kPushes = 24;
// A reply delay (ms) that keeps a job running well past the marker a kill waits for
// (WaitFile looks every 20 ms).
constexpr int kMarkerLag = 20;

ReplicaJobSpec Spec(const std::string& name, int reply_delay_ms, int replicas = 1,
                    int pushes = kPushes) {
  ReplicaJobSpec s;
  s.name = name;
  s.server = PSKV_SERVER;
  s.worker = {ASYNC_COUNT_WORKER, std::to_string(pushes)};
  s.replicas = replicas;
  s.reply_delay_ms = reply_delay_ms;
  return s;
}

// Every worker's final weights are the exact sum of every push (`pushes` per
// worker), applied once.
void ExpectEveryPushOnce(const ReplicaJobResult& r, const std::string& what, int pushes = kPushes) {
  ASSERT_EQ(r.weights.size(), 2u) << what;
  for (size_t w = 0; w < r.weights.size(); ++w) {
    size_t total = 0;
    for (auto n : async_count::kSizes) total += static_cast<size_t>(n) * sizeof(float);
    ASSERT_EQ(r.weights[w].size(), total) << what << ": worker " << w;
    const char* p = r.weights[w].data();
    int wrong = 0;
    for (size_t k = 0; k < async_count::kKeys.size(); ++k) {
      const int key = async_count::kKeys[k];
      for (int64_t i = 0; i < async_count::kSizes[k]; ++i, p += sizeof(float)) {
        float got;
        std::memcpy(&got, p, sizeof got);
        const float want = async_count::Expected(2, pushes, key, i);
        if (got != want && wrong++ < 3)
          ADD_FAILURE() << what << ": worker " << w << ", key " << key << "[" << i << "] is " << got
                        << ", expected " << want << " (every push applied exactly once)";
      }
    }
    EXPECT_EQ(wrong, 0) << what << ": worker " << w << ": elements off the exact sum";
  }
}

}  // namespace

// Undisturbed, with and without replicas: the exact sum.
TEST(FailoverAsync, UndisturbedJobsApplyEveryPushOnce) {
  ExpectEveryPushOnce(RunReplicaJob(Spec("async_plain", 0, 0)), "PSKV_REPLICAS=0");
  ExpectEveryPushOnce(RunReplicaJob(Spec("async_replicated", 0)), "PSKV_REPLICAS=1");
}

// Between pushes and inside them: with 30 ms per request in the servers (the primary
// before it applies a push, the replica before it applies the copy), a kill lands
// while a push waits on the primary, after the primary applied it but before the
// replica did (the retry must be applied), or after the replica applied it but before
// the worker got the answer (the retry must not be applied again).
TEST(FailoverAsync, KillServerAppliesEveryPushExactlyOnce) {
  int n = 0;
  for (int delay : {0, 30})
    for (int victim : {0, 1})
      for (int after : {3, 10}) {
        const std::string what = "server " + std::to_string(victim) + " killed after push " +
                                 std::to_string(after) + (delay ? " (30 ms per request)" : "");
        auto r = RunReplicaJob(Spec("async_kill" + std::to_string(n++), delay), victim,
                               "w0.p" + std::to_string(after));
        ExpectEveryPushOnce(r, what);
        std::printf("[ stall ] %s: slowest push %.0f ms (heartbeat timeout 1.5 s)\n", what.c_str(),
                    r.slowest_ms);
      }
}

// Back to full strength in dist_async (docs/fault-tolerance.md): server 0 killed after
// push 3; a spare server is sent a copy of both key ranges (values, each key's apply
// sequence and push counts, the optimizer's update count) while the pushes go on, and
// becomes their replica; then server 1 is killed after another push: the job finishes
// on the spare alone with every push applied exactly once. The spare installs each
// copy only once 8 async changes of the range followed it
// (PSKV_TEST_COPY_HOLD_CHANGES): they are applied after the install.
TEST(FailoverAsync, ASpareJoinsAndASecondLossLosesNoPush) {
  constexpr int kSparePushes = 40;
  auto spec = Spec("async_spare", 15, 1, kSparePushes);
  spec.spares = 1;
  spec.server_env[2]["PSKV_TEST_COPY_HOLD_CHANGES"] = "8";
  double full_strength_ms = 0;
  auto r =
      RunReplicaJob(spec, {{0, "w0.p3", nullptr},
                           {1, "", AfterFullStrength(2, kSparePushes, &full_strength_ms, "w0.p")}});
  ExpectEveryPushOnce(r, "server 0, then server 1 killed, the spare in between", kSparePushes);
  std::printf("[ measured ] kill of server 0 -> both key ranges replicated again: %.0f ms\n",
              full_strength_ms);
}

// PSKV_REPLICAS=2 with three servers: the primary of key range 1 sends the copy of an
// async push to one of its two replicas only and exits once that one acknowledged it
// (PSKV_TEST_EXIT_AMID_REPLICATION). Server 2, promoted, holds a push that server 0
// lacks and sends its last copies again (ResendLastRounds) before it applies any
// push of its own; then server 2 is killed too and server 0 leads every range: every
// push applied exactly once. Without the copies sent again, server 0 refuses server
// 2's next copy of that key ("push s + 1 before push s") and the job fails.
// (20 ms per request in the servers, here and below: server 2 is killed once worker 0
// wrote its 16th push's marker, which the test sees within 20 ms; undelayed, the 8
// pushes left, the barrier and the pulls could end the job first, and no range table
// after server 2's death was logged.)
TEST(FailoverAsync, APromotedReplicaAheadOfTheOtherSendsItsLastPushesAgain) {
  auto s = Spec("async_r2_ahead", kMarkerLag, 2);
  s.servers = 3;
  s.server_env[1]["PSKV_TEST_EXIT_AMID_REPLICATION"] = "12";
  auto r = RunReplicaJob(s, {{1, "w0.p10", {}}, {2, "w0.p16", {}}});
  ExpectEveryPushOnce(r, "server 1 died amid an async copy, then server 2 killed");
  EXPECT_NE(r.log.find("(async pushes) to server[2]"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("again to its other copies"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("range 1 server[0]"), std::string::npos) << "server 0 led at the end\n"
                                                                << r.log;
}

// The other way round: the primary of key range 1 sends an async copy to its last
// replica only (server 0) and exits, so server 0 is a push ahead of server 2, which
// is promoted. Another worker's push of that key may reach server 2 before the
// retried one and take its sequence: server 0 must apply it all the same (it does
// not hold it) and not apply the retried push again when it comes under the next
// sequence. Then server 2 is killed and server 0 finishes: every push applied
// exactly once.
TEST(FailoverAsync, ACopyAheadOfThePromotedReplicaAppliesEveryPushOnce) {
  for (int run = 0; run < 3; ++run) {
    auto s = Spec("async_r2_behind" + std::to_string(run), kMarkerLag, 2);
    s.servers = 3;
    s.server_env[1]["PSKV_TEST_EXIT_AMID_REPLICATION"] = std::to_string(-(12 + 2 * run));
    auto r = RunReplicaJob(s, {{1, "w0.p10", {}}, {2, "w0.p16", {}}});
    ExpectEveryPushOnce(r,
                        "server 1 died amid an async copy sent to server 0 only, then server "
                        "2 killed (run " +
                            std::to_string(run) + ")");
    EXPECT_NE(r.log.find("(async pushes) to server[0]"), std::string::npos) << r.log;
    EXPECT_NE(r.log.find("range 1 server[0]"), std::string::npos) << "server 0 led at the end\n"
                                                                  << r.log;
  }
}
