// Issue 11 (KV layer): round integrity, prompt collective errors, reply matching,
// stall reports, large optimizer states, reproducible sums, late replies. Real
// processes (scheduler, servers, workers) started directly so each process can get
// its own environment and every exit status is checked.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/job.h"

using namespace pskv::test;
using namespace std::chrono_literals;

// A: a skipped push fails at the extra pull, a second push in one round at that push.
TEST(Rounds, StrictModeSkippedPushFailsAtTheExtraPull) {
  Spec s;
  s.scenario = "strict_rounds";
  s.rounds = 5;
  s.env = {{"PSKV_STRICT_ROUNDS", "1"}};
  Result r = RunJob(s);
  ExpectWorkersPassed(r);
  for (int st : r.others) EXPECT_EQ(st, 0) << r.log;
}

// A: different shapes of one key are refused on every worker, naming both.
TEST(Rounds, InitShapeMismatchFailsEveryWorker) {
  Spec s;
  s.scenario = "shape_mismatch";
  Result r = RunJob(s);
  ExpectWorkersPassed(r);
}

// A: barrier-vs-push deadlock becomes an error naming both sides within the stall
// bound (PSKV_TIMEOUT is 60 s: the test's bound of 40 s shows it was not waited out).
TEST(Rounds, BarrierVersusPushDeadlockIsReported) {
  Spec s;
  s.scenario = "barrier_deadlock";
  s.env = {{"PSKV_STALL_WARNING", "2"}};
  s.bound = 40s;
  Result r = RunJob(s);
  ExpectWorkersPassed(r);
}

// C: duplicated replies never complete a sliced pull early.
TEST(Rounds, DuplicateRepliesAreIgnored) {
  Spec s;
  s.scenario = "duplicate_replies";
  s.servers = 2;
  s.rounds = 6;
  s.server_env = {{0, {{"PSKV_TEST_DUPLICATE_REPLIES", "1"}}},
                  {1, {{"PSKV_TEST_REPLY_DELAY", "200"}}}};
  Result r = RunJob(s);
  ExpectWorkersPassed(r);
}

// D: a stalled round is logged on the server and the waiting worker, naming the
// worker it waits for.
TEST(Rounds, StallIsLoggedNamingTheMissingWorker) {
  Spec s;
  s.scenario = "stall";
  s.env = {{"PSKV_STALL_WARNING", "1"}, {"PSKV_TEST_SLEEP_MS", "4500"}};
  Result r = RunJob(s);
  ExpectWorkersPassed(r);
  EXPECT_TRUE(Has(r.log, "key 3 round 1: waiting for worker[1]")) << r.log;  // server
  EXPECT_TRUE(Has(r.log, "waiting for worker[1]")) << r.log;
  EXPECT_TRUE(Has(r.log, "push of ps key")) << r.log;  // the worker's own report
}

// D: the TimeoutError names the missing worker, and close() then returns at once.
TEST(Rounds, TimeoutNamesTheMissingWorkerAndCloseIsImmediate) {
  Spec s;
  s.scenario = "stall";
  s.env = {{"PSKV_STALL_WARNING", "1"},
           {"PSKV_TIMEOUT", "3"},
           {"PSKV_TEST_SLEEP_MS", "8000"},
           {"PSKV_TEST_EXPECT_TIMEOUT", "1"}};
  s.bound = 25s;  // PSKV_TIMEOUT 3 s; worker 1 pushes after 8 s and must then fail at once
  Result r = RunJob(s);
  EXPECT_EQ(r.workers[0], 0) << r.log;
  EXPECT_NE(r.workers[1], -1) << "worker 1 was not stopped after worker 0 failed; log:\n" << r.log;
}

// F: sums are taken in rank order, whatever the arrival order.
TEST(Rounds, SyncSumIsInRankOrder) {
  Spec s;
  s.scenario = "rank_order_sum";
  s.workers = 4;
  s.servers = 2;
  s.rounds = 3;
  Result r = RunJob(s);
  ExpectWorkersPassed(r);
}

// G: a reply arriving after the worker's timeout is dropped (no write to a dead frame).
TEST(Rounds, LateReplyAfterTimeoutIsSafe) {
  Spec s;
  s.scenario = "late_reply";
  s.workers = 1;
  s.env = {{"PSKV_TIMEOUT", "1"}, {"ASAN_OPTIONS", "detect_stack_use_after_return=1"}};
  s.server_env = {{0, {{"PSKV_TEST_REPLY_DELAY", "1500"}}}};
  Result r = RunJob(s);
  EXPECT_EQ(r.workers[0], 0) << r.log;
  EXPECT_TRUE(Has(r.log, "survived the late reply")) << r.log;
  EXPECT_FALSE(Has(r.log, "AddressSanitizer")) << r.log;
}

// G: loading states checks every size, the multi-precision master copy included.
TEST(Rounds, LoadingMismatchedStatesIsAShapeError) {
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("pskv_states_mismatch_" + std::to_string(::getpid())))
                               .string();
  Spec s;
  s.scenario = "states_mismatch";
  s.workers = 1;
  s.env = {{"PSKV_TEST_PHASE", "save"}, {"PSKV_TEST_STATES_FILE", file}};
  Result r = RunJob(s);
  ASSERT_EQ(r.workers[0], 0) << r.log;
  s.env["PSKV_TEST_PHASE"] = "load";
  r = RunJob(s);
  EXPECT_EQ(r.workers[0], 0) << r.log;
  std::filesystem::remove(file);
}

// C: a multi-key request with one bad key changes nothing (validated whole first).
TEST(Rounds, MultiKeyRequestIsValidatedWhole) {
  Spec s;
  s.scenario = "raw_multikey";
  s.program = KV_RAW_CLIENT;
  s.workers = 1;
  Result r = RunJob(s);
  ExpectWorkersPassed(r);
}

// Fusion is used: one call of 66 keys (64 small) travels as fused messages (the
// workers' metrics count them as operation "fused", besides every key's own); with
// PSKV_FUSION_KEY_BYTES=0 nothing is fused. Values are checked by the scenario.
TEST(Rounds, SmallKeysOfOneCallAreFused) {
  for (bool on : {true, false}) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("pskv_fusion_metrics_" + std::to_string(::getpid()) + (on ? "_on" : "_off"));
    std::filesystem::create_directories(dir);
    Spec s;
    s.scenario = "fused";
    s.workers = 2;
    s.rounds = 2;
    s.env = {{"PSKV_METRICS_FILE", (dir / "m.prom").string()}};
    if (!on) s.env["PSKV_FUSION_KEY_BYTES"] = "0";
    Result r = RunJob(s);
    ExpectWorkersPassed(r);
    std::string metrics;
    for (auto& f : std::filesystem::directory_iterator(dir)) metrics += ReadFile(f.path().string());
    EXPECT_FALSE(metrics.empty()) << "no metrics file was written; log:\n" << r.log;
    EXPECT_EQ(Has(metrics, "op=\"fused\""), on) << (on ? "fusion on" : "fusion off");
    EXPECT_TRUE(Has(metrics, "op=\"pushpull\",key=\"10\"")) << "key 10 is counted as itself";
    std::filesystem::remove_all(dir);
  }
}
