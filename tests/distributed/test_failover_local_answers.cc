// Answers from a copy on the worker's host (docs/fault-tolerance.md): with a server and
// a worker on each "host" (tests/support/replica_job.h, paired_hosts: each pair
// advertises its own 127.0.0.x), a worker names the replica on its host as the answerer
// of its one-key push-pulls, and the primary leaves those answers to that replica,
// which answers once it applied the round. Real processes over real ZeroMQ
// (failover_worker.cc: Adam with weight decay and a schedule, a key sliced over both
// servers and cut into wire chunks, fused small keys; push-pull and push-then-pull
// rounds alternate); every worker's final weights must be bitwise-equal to those of
// the job whose primaries answer everything.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>

#include "support/replica_job.h"

using namespace pskv::test;

namespace {

constexpr int kRounds = 12;

ReplicaJobSpec Spec(const std::string& name, bool paired_hosts, int reply_delay_ms = 0) {
  ReplicaJobSpec s;
  s.name = name;
  s.server = PSKV_SERVER;
  s.worker = {FAILOVER_WORKER, std::to_string(kRounds)};
  s.replicas = 1;
  s.reply_delay_ms = reply_delay_ms;
  s.paired_hosts = paired_hosts;
  return s;
}

// The job on one host: every primary answers its own requests.
const std::vector<std::string>& OneHost() {
  static const std::vector<std::string> w = [] {
    auto res = RunReplicaJob(Spec("local_answers_one_host", false));
    EXPECT_EQ(res.log.find("for the range's primary"), std::string::npos)
        << "a replica answered for its primary with every node on one host:\n"
        << res.log;
    return res.weights;
  }();
  return w;
}

// How many push-pulls the servers' exit lines say they answered for their primaries.
long long AnsweredForPrimaries(const std::string& log) {
  long long n = 0;
  const std::string tail = " push-pull(s) of workers on this host for the range's primary";
  for (size_t at = 0; (at = log.find(tail, at)) != std::string::npos; at += tail.size()) {
    const size_t from = log.rfind("answered ", at);
    if (from != std::string::npos) n += std::stoll(log.substr(from + 9, at - from - 9));
  }
  return n;
}

}  // namespace

// Undisturbed: the replicas answer the push-pulls of the workers on their hosts (the
// servers say how many at exit: more than 0) and the weights are the one-host job's.
TEST(LocalAnswers, ReplicaOnTheWorkersHostAnswersWithTheSameBits) {
  const auto res = RunReplicaJob(Spec("local_answers", true));
  ExpectSameWeights(OneHost(), res.weights, "answers from the replicas on the workers' hosts");
  EXPECT_GT(AnsweredForPrimaries(res.log), 0) << res.log;
}

// Each server killed inside rounds (30 ms per request on the servers: the kill lands
// amid pushes, replication and answers, the answering replica's included): nothing lost.
TEST(LocalAnswers, KillInsideRoundsLosesNothing) {
  int n = 0;
  for (int victim : {0, 1})
    for (int after : {2, 5}) {
      const std::string what =
          "server " + std::to_string(victim) + " killed during round " + std::to_string(after + 1);
      const auto res = RunReplicaJob(Spec("local_answers_kill" + std::to_string(n++), true, 30),
                                     victim, "w0.r" + std::to_string(after));
      ExpectSameWeights(OneHost(), res.weights, what);
    }
}

// The primary of range 0 (server 0) exits right after its replica acknowledged a round
// whose answers it left to that replica, before answering the rest
// (PSKV_TEST_EXIT_AFTER_REPLICATED_ROUNDS): the replica answers the worker on its host,
// the promoted replica answers the other worker's retry from its state.
TEST(LocalAnswers, PrimaryDiesAfterLeavingAnswersToItsReplica) {
  auto s = Spec("local_answers_primary_exit", true);
  s.server_env[0]["PSKV_TEST_EXIT_AFTER_REPLICATED_ROUNDS"] = "9";
  const auto res = RunReplicaJob(s, {{0, "", AfterLogLine("exiting after 9 replicated rounds")}});
  ExpectSameWeights(OneHost(), res.weights, "server 0 exited after its 9th replicated round");
  EXPECT_NE(res.log.find("retried push(es) from the state without applying them again"),
            std::string::npos)
      << res.log;
}

// The answering replica (server 1) acknowledges a round whose answers its primary left
// to it, then dies before answering (PSKV_TEST_EXIT_BEFORE_DELEGATED_ANSWER): the worker
// on its host sends its push-pull again to the primary, which answers it from its state.
TEST(LocalAnswers, AnsweringReplicaDiesBeforeItAnswered) {
  for (int nth : {3, 10}) {
    auto s = Spec("local_answers_exit" + std::to_string(nth), true);
    s.server_env[1]["PSKV_TEST_EXIT_BEFORE_DELEGATED_ANSWER"] = std::to_string(nth);
    const auto res = RunReplicaJob(s, {{1, "", AfterLogLine("exiting before answering")}});
    ExpectSameWeights(
        OneHost(), res.weights,
        "server 1 died before answering its " + std::to_string(nth) + "th delegated round");
    EXPECT_NE(res.log.find("exiting before answering"), std::string::npos) << res.log;
    // The primary had the replica's acknowledgement (so it left the answers to it): the
    // worker's retry found the round applied and was answered from the state.
    EXPECT_NE(res.log.find("retried push(es) from the state without applying them again"),
              std::string::npos)
        << res.log;
  }
}

// PSKV_REPLICAS=2 (three servers, server i and worker i paired on a host, server 2
// alone): the primary of range 1 (server 1) sends a round to its last replica only
// (server 0, on worker 0's host) and exits (PSKV_TEST_EXIT_AMID_REPLICATION=-n). Server
// 2, promoted, completes that round again from the retried pushes while server 0
// already holds it. No copy answers for its primary with two replicas (a copy holding
// the round acknowledges it without applying it again, and could not tell its new
// primary's answers apart), so no retried push-pull is left unanswered: the job ends
// with the one-host job's bits.
TEST(LocalAnswers, TwoReplicasLeaveNoAnswerToACopyAheadOfTheNewPrimary) {
  auto spec = [](const std::string& name, bool paired) {
    auto s = Spec(name, paired);
    s.servers = 3;
    s.replicas = 2;
    s.env["PSKV_TIMEOUT"] = "20";
    return s;
  };
  const auto want = RunReplicaJob(spec("local_answers_r2_one_host", false)).weights;
  for (int nth : {19, 20}) {
    auto s = spec("local_answers_r2_ahead" + std::to_string(nth), true);
    s.server_env[1]["PSKV_TEST_EXIT_AMID_REPLICATION"] = "-" + std::to_string(nth);
    const auto res = RunReplicaJob(s, {{1, "", AfterLogLine("exiting amid a replicated change")}});
    ExpectSameWeights(want, res.weights,
                      "server 1 sent its " + std::to_string(nth) +
                          "th replicated change to server 0 only and exited");
    EXPECT_NE(res.log.find("exiting amid a replicated change, sent to server[0]"),
              std::string::npos)
        << res.log;
    EXPECT_EQ(AnsweredForPrimaries(res.log), 0) << res.log;
  }
}
