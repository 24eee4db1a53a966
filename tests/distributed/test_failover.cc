// Lose a server, lose nothing (docs/fault-tolerance.md): a dist_sync job with
// PSKV_REPLICAS=1, real processes over real ZeroMQ, one server killed with SIGKILL at
// a chosen round; the job finishes and every worker's final weights are bitwise-equal
// to the undisturbed job's (rank-order sums, Adam with weight decay and a schedule, a
// key sliced over both servers and cut into chunks, fused small keys). With default
// failure detection, the round the kill stalls ends within a few seconds.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/proc.h"
#include "support/replica_job.h"
#include "support/test_util.h"

using namespace pskv::test;
using namespace std::chrono_literals;

namespace {

constexpr int kRounds = 12;

struct Run {
  std::string dir, log;
  pid_t scheduler = 0;
  std::vector<pid_t> servers, workers;
};

// `silent_detect`: heartbeats fast enough for the frozen-server test (a frozen process
// keeps its port open: only its silence tells).
std::map<std::string, std::string> Env(int port, const std::string& role, int replicas,
                                       bool silent_detect) {
  std::map<std::string, std::string> env = {
      {"DMLC_ROLE", role},
      {"DMLC_PS_ROOT_URI", "127.0.0.1"},
      {"DMLC_PS_ROOT_PORT", std::to_string(port)},
      {"DMLC_NUM_SERVER", "2"},
      {"DMLC_NUM_WORKER", "2"},
      {"PSKV_REPLICAS", std::to_string(replicas)},
      {"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"},
      {"PSKV_WIRE_CHUNK_BYTES", "262144"},
      // Otherwise failure detection as by default (PS_HEARTBEAT_TIMEOUT 10 s): the
      // scheduler learns of a killed server from its closed port, not its silence.
      {"PSKV_TIMEOUT", "60"}};
  if (silent_detect) {
    env["PS_HEARTBEAT_INTERVAL"] = "0.2";
    env["PS_HEARTBEAT_TIMEOUT"] = "1.5";
  }
  return env;
}

// Disturbances besides a kill -9.
struct Extra {
  bool freeze = false;            // SIGSTOP, then SIGCONT, instead of SIGKILL
  int exit_after_replicated = 0;  // the victim exits by itself (PSKV_TEST_EXIT_AFTER_...)
};

Run Start(const std::string& name, int reply_delay_ms, int replicas, int victim = -1,
          Extra extra = {}) {
  const bool silent_detect = extra.freeze;
  Run j;
  j.dir = (std::filesystem::temp_directory_path() /
           ("pskv_failover_" + name + "_" + std::to_string(::getpid())))
              .string();
  std::filesystem::remove_all(j.dir);
  std::filesystem::create_directories(j.dir);
  j.log = j.dir + "/log";
  const int port = FreePort();
  j.scheduler = Spawn({PSKV_SERVER}, Env(port, "scheduler", replicas, silent_detect), j.log);
  for (int s = 0; s < 2; ++s) {
    auto env = Env(port, "server", replicas, silent_detect);
    env["DMLC_TASK_ID"] = std::to_string(s);
    if (reply_delay_ms) env["PSKV_TEST_REPLY_DELAY"] = std::to_string(reply_delay_ms);
    if (s == victim && extra.exit_after_replicated)
      env["PSKV_TEST_EXIT_AFTER_REPLICATED_ROUNDS"] = std::to_string(extra.exit_after_replicated);
    j.servers.push_back(Spawn({PSKV_SERVER}, env, j.log));
  }
  for (int w = 0; w < 2; ++w)
    j.workers.push_back(Spawn({FAILOVER_WORKER, std::to_string(kRounds), j.dir},
                              Env(port, "worker", replicas, silent_detect), j.log));
  return j;
}

void Stop(const Run& j) {
  std::vector<pid_t> all = {j.scheduler};
  all.insert(all.end(), j.servers.begin(), j.servers.end());
  all.insert(all.end(), j.workers.begin(), j.workers.end());
  for (pid_t p : all) {
    ::kill(-p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
}

// Runs the job; kills server `victim` (-1: none) once worker 0 finished round
// `after`; returns each worker's final weights (empty on failure, with the test failed).
// With `extra.freeze`, the victim is stopped (SIGSTOP) instead, for longer than the
// heartbeat timeout, then resumed: declared dead meanwhile, it must change nothing
// and exit non-zero saying that it was removed from the job. With
// `extra.exit_after_replicated`, it exits by itself at that point; `log` (if given)
// receives the job's log.
std::vector<std::string> RunJob(const std::string& name, int victim, int after,
                                int reply_delay_ms = 0, double* stall_ms = nullptr,
                                int replicas = 1, Extra extra = {}, std::string* log = nullptr) {
  const bool freeze = extra.freeze;
  Run j = Start(name, reply_delay_ms, replicas, victim, extra);
  std::vector<std::string> weights;
  if (victim >= 0 && !extra.exit_after_replicated) {
    if (!WaitFile(j.dir + "/w0.r" + std::to_string(after), 60s)) {
      ADD_FAILURE() << "round " << after << " never finished; log:\n" << ReadFile(j.log);
      Stop(j);
      return {};
    }
    const pid_t v = j.servers[static_cast<size_t>(victim)];
    if (freeze) {
      ::kill(v, SIGSTOP);
      std::this_thread::sleep_for(4s);  // heartbeat timeout 1.5 s: declared dead by now
      ::kill(v, SIGCONT);
    } else {
      ::kill(v, SIGKILL);
    }
  }
  for (size_t w = 0; w < j.workers.size(); ++w) {
    auto st = WaitExit(j.workers[w], 90s);
    if (!st || *st != 0) {
      ADD_FAILURE() << name << ": worker " << w << " "
                    << (st ? "exited " + std::to_string(*st) : std::string("hung")) << "; log:\n"
                    << ReadFile(j.log);
      Stop(j);
      return {};
    }
    weights.push_back(ReadFile(j.dir + "/w" + std::to_string(w) + ".weights"));
  }
  // The rest of the job ends too: the scheduler and the surviving servers exit 0.
  std::vector<pid_t> rest = {j.scheduler};
  for (size_t s = 0; s < j.servers.size(); ++s)
    if (static_cast<int>(s) != victim) rest.push_back(j.servers[s]);
  for (pid_t p : rest) {
    auto st = WaitExit(p, 30s);
    EXPECT_TRUE(st.has_value() && *st == 0)
        << name << ": pid " << p << " " << (st ? std::to_string(*st) : "hung") << "; log:\n"
        << ReadFile(j.log);
  }
  if (freeze) {
    auto st = WaitExit(j.servers[static_cast<size_t>(victim)], 30s);
    EXPECT_TRUE(st.has_value() && *st != 0)
        << name << ": the resumed server " << (st ? "exited " + std::to_string(*st) : "hung")
        << "; log:\n"
        << ReadFile(j.log);
    EXPECT_NE(ReadFile(j.log).find("server[" + std::to_string(victim) +
                                   "] was removed from the job by the scheduler"),
              std::string::npos)
        << ReadFile(j.log);
  }
  if (log) *log = ReadFile(j.log);
  if (stall_ms) {  // the slowest round of worker 0: the one the kill stalled
    std::ifstream t(j.dir + "/w0.times");
    double ms = 0, worst = 0;
    while (t >> ms) worst = std::max(worst, ms);
    *stall_ms = worst;
  }
  Stop(j);
  std::filesystem::remove_all(j.dir);
  return weights;
}

const std::vector<std::string>& Undisturbed() {
  static const std::vector<std::string> w = RunJob("undisturbed", -1, 0);
  return w;
}

void ExpectEqualWeights(const std::vector<std::string>& got, const std::string& what) {
  ExpectSameWeights(Undisturbed(), got, what);
}

}  // namespace

// Between rounds (the workers are computing the next gradients), each server.
TEST(Failover, KillServerBetweenRoundsLosesNothing) {
  for (int victim : {1, 0}) {
    double stall = 0;
    auto w = RunJob("between" + std::to_string(victim), victim, 3 + victim, 0, &stall);
    ExpectEqualWeights(w, "server " + std::to_string(victim) + " killed after round " +
                              std::to_string(3 + victim));
    std::printf("[ stall ] kill of server %d: slowest round %.0f ms (default detection)\n", victim,
                stall);
    // Generous (2 shared cores): far below the 10 s heartbeat timeout a silence
    // would take to detect.
    EXPECT_LT(stall, 3000) << "the round the kill of server " << victim << " stalled";
  }
}

// Inside rounds: every request waits 30 ms in the servers, so the kill lands while
// pushes, merges, replication or pulls are in flight (push-pull and push-then-pull
// rounds alternate).
TEST(Failover, KillServerInsideRoundsLosesNothing) {
  int n = 0;
  for (int victim : {0, 1})
    for (int after : {2, 5}) {
      auto w = RunJob("inside" + std::to_string(n++), victim, after, 30);
      ExpectEqualWeights(w, "server " + std::to_string(victim) + " killed during round " +
                                std::to_string(after + 1));
    }
}

// The undisturbed job with replicas gives the bits of the job without (replication
// never changes a value).
TEST(Failover, ReplicasDoNotChangeTheResult) {
  ExpectEqualWeights(RunJob("unreplicated", -1, 0, 0, nullptr, 0), "PSKV_REPLICAS=0");
}

// A server frozen (SIGSTOP) long enough to be declared dead, then resumed: the job
// went on without it; whatever it still sends (the round it was replicating, replies,
// barrier arrivals) is dropped, and it stops with an error saying it was removed.
TEST(Failover, FrozenServerDeclaredDeadChangesNothingWhenResumed) {
  int n = 0;
  for (int victim : {0, 1}) {
    auto w = RunJob("frozen" + std::to_string(n++), victim, 3, 30, nullptr, 1, Extra{true, 0});
    ExpectEqualWeights(w, "server " + std::to_string(victim) + " frozen during round 4");
  }
}

// The primary of range 0 dies right after its replica acknowledged a round, before
// answering any of that round's pushes: every worker sends them again to the promoted
// replica, which already holds the round and answers them from its state, without
// applying them a second time (the server says how many it answered so).
TEST(Failover, PushesOfAReplicatedRoundAreAnsweredFromStateNotReapplied) {
  std::string log;
  auto w = RunJob("replicated_then_died", 0, 0, 0, nullptr, 1, Extra{false, 9}, &log);
  ExpectEqualWeights(w, "server 0 exited after its 9th replicated round");
  EXPECT_NE(log.find("exiting after 9 replicated rounds"), std::string::npos) << log;
  const auto at = log.find("retried push(es) from the state without applying them again");
  ASSERT_NE(at, std::string::npos) << log;
  const auto line = log.rfind("answered ", at);
  ASSERT_NE(line, std::string::npos) << log;
  EXPECT_GT(std::stoll(log.substr(line + 9)), 0) << log.substr(line, at - line);
}

// R = 1 with S = 2: both servers killed, key ranges 0 and 1 have no copy left. The job
// fails, every worker within the heartbeat bound, the reason naming the ranges lost.
TEST(Failover, NoLiveCopyLeftFailsTheJobNamingTheRangesLost) {
  auto j = Start("no_copy_left", 0, 1);
  ASSERT_TRUE(WaitFile(j.dir + "/w0.r3", 60s)) << ReadFile(j.log);
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(j.servers[0], SIGKILL);
  ::kill(j.servers[1], SIGKILL);
  for (pid_t p : {j.workers[0], j.workers[1], j.scheduler}) {
    auto st = WaitExit(p, 30s);
    EXPECT_TRUE(st.has_value() && *st != 0)
        << "pid " << p << " " << (st ? "exited " + std::to_string(*st) : std::string("hung"))
        << "; log:\n"
        << ReadFile(j.log);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
  const std::string log = ReadFile(j.log);
  EXPECT_NE(log.find("no live copy left of key range"), std::string::npos) << log;
  Stop(j);
  std::filesystem::remove_all(j.dir);
}
