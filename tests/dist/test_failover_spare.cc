// Back to full strength (docs/fault-tolerance.md): a dist_sync job with
// PSKV_REPLICAS=1, two servers and one spare server (PSKV_SPARE_SERVERS=1), real
// processes over real ZeroMQ. Server 0 is killed with SIGKILL; the spare is sent a
// copy of the key ranges left with one copy (both: server 0 was range 0's primary and
// range 1's replica) while training goes on, and becomes their replica; then server
// 1, the last original server, is killed too. The job finishes on the spare alone,
// and every worker's final weights are bitwise-equal to the undisturbed job's (Adam
// with weight decay and a step schedule, a key sliced over both servers and cut into
// wire chunks, fused small keys: tests/dist/failover_worker.cc).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "support/proc.h"
#include "support/replica_job.h"
#include "support/test_util.h"

using namespace pskv::test;
using namespace std::chrono_literals;

namespace {

constexpr int kRounds = 24;

std::map<std::string, std::string> Env(int port, const std::string& role, int spares) {
  return {{"DMLC_ROLE", role},
          {"DMLC_PS_ROOT_URI", "127.0.0.1"},
          {"DMLC_PS_ROOT_PORT", std::to_string(port)},
          {"DMLC_NUM_SERVER", "2"},
          {"DMLC_NUM_WORKER", "2"},
          {"PSKV_REPLICAS", "1"},
          {"PSKV_SPARE_SERVERS", std::to_string(spares)},
          {"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"},
          {"PSKV_WIRE_CHUNK_BYTES", "262144"},
          {"PSKV_TIMEOUT", "60"}};
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Result {
  std::vector<std::string> weights;  // each worker's final weights; empty on failure
  std::string log;
  double full_strength_ms = 0;  // from the kill of server 0 to both copies installed
};

// Runs the job with `spares` spare servers (15 ms per request on every server, so
// that the job's rounds outlast the copy). `kill_twice`: server 0 is killed after
// round 3, and server 1 once the scheduler reported the spare a replica of both
// ranges ("back to full strength") and worker 0 finished another round.
Result RunJob(const std::string& name, int spares, bool kill_twice) {
  Result res;
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("pskv_spare_" + name + "_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/log";
  const int port = FreePort();
  const pid_t scheduler = Spawn({PSKV_SERVER}, Env(port, "scheduler", spares), log);
  std::vector<pid_t> servers, workers;
  for (int s = 0; s < 2 + spares; ++s) {
    auto env = Env(port, "server", spares);
    env["DMLC_TASK_ID"] = std::to_string(s);
    env["PSKV_TEST_REPLY_DELAY"] = "15";
    if (s >= 2) env["PSKV_SPARE_SERVER"] = "1";
    servers.push_back(Spawn({PSKV_SERVER}, env, log));
  }
  for (int w = 0; w < 2; ++w)
    workers.push_back(
        Spawn({FAILOVER_WORKER, std::to_string(kRounds), dir}, Env(port, "worker", spares), log));
  auto stop = [&] {
    std::vector<pid_t> all = {scheduler};
    all.insert(all.end(), servers.begin(), servers.end());
    all.insert(all.end(), workers.begin(), workers.end());
    for (pid_t p : all) {
      ::kill(-p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  };
  auto fail = [&](const std::string& why) {
    ADD_FAILURE() << name << ": " << why << "; log:\n" << ReadFile(log);
    stop();
    return res;
  };
  auto round_done = [&](int r) {
    return std::filesystem::exists(dir + "/w0.r" + std::to_string(r));
  };
  if (kill_twice) {
    if (!WaitFile(dir + "/w0.r3", 60s)) return fail("round 3 never finished");
    ::kill(servers[0], SIGKILL);
    const auto killed = std::chrono::steady_clock::now();
    // Full strength again: both ranges list the spare as their replica.
    const auto until = std::chrono::steady_clock::now() + 30s;
    int copied = 0;
    while (std::chrono::steady_clock::now() < until) {
      const std::string text = ReadFile(log);
      copied = 0;
      for (size_t at = 0; (at = text.find("and is now its replica", at)) != std::string::npos; ++at)
        ++copied;
      if (copied >= 2) break;
      std::this_thread::sleep_for(20ms);
    }
    if (copied < 2) return fail("the spare did not become the replica of both key ranges");
    res.full_strength_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed)
            .count();
    int next = 1;
    while (round_done(next)) ++next;
    if (next >= kRounds) return fail("the job finished before the spare was a replica");
    if (!WaitFile(dir + "/w0.r" + std::to_string(next), 60s))
      return fail("no round finished after the spare joined");
    ::kill(servers[1], SIGKILL);
  }
  for (size_t w = 0; w < workers.size(); ++w) {
    auto st = WaitExit(workers[w], 90s);
    if (!st || *st != 0)
      return fail("worker " + std::to_string(w) + " " +
                  (st ? "exited " + std::to_string(*st) : std::string("hung")));
    res.weights.push_back(Slurp(dir + "/w" + std::to_string(w) + ".weights"));
  }
  // The rest of the job ends too: the scheduler and the surviving servers exit 0.
  std::vector<pid_t> rest = {scheduler};
  for (size_t s = kill_twice ? 2 : 0; s < servers.size(); ++s) rest.push_back(servers[s]);
  for (pid_t p : rest) {
    auto st = WaitExit(p, 30s);
    EXPECT_TRUE(st.has_value() && *st == 0)
        << name << ": pid " << p << " " << (st ? std::to_string(*st) : "hung") << "; log:\n"
        << ReadFile(log);
  }
  res.log = ReadFile(log);
  stop();
  std::filesystem::remove_all(dir);
  return res;
}

void ExpectEqual(const Result& want, const Result& got, const std::string& what) {
  ExpectSameWeights(want.weights, got.weights, what);
}

}  // namespace

TEST(FailoverSpare, SpareBringsTheJobBackToFullStrengthAndASecondLossIsSurvived) {
  const Result undisturbed = RunJob("undisturbed", 0, false);
  // An idle spare changes nothing (it holds no range; placement counts DMLC_NUM_SERVER).
  ExpectEqual(undisturbed, RunJob("idle_spare", 1, false), "with an idle spare");
  const Result twice = RunJob("twice", 1, true);
  ExpectEqual(undisturbed, twice, "server 0, then server 1 killed, the spare in between");
  // Measured: from the kill of server 0 to the spare listed as both ranges' replica
  // (seen by this test in the log, polled every 20 ms), from the scheduler's verdict on
  // server 0 to each range's new replica, and the bytes of each copy (the scheduler's
  // log lines).
  std::printf("[ measured ] kill of server 0 -> both key ranges replicated again: %.0f ms\n",
              twice.full_strength_ms);
  const std::regex back(
      R"(installed its copy of key range (\d) \((\d+) bytes from .*?\) and is now its replica, (\d+) ms after)");
  for (auto it = std::sregex_iterator(twice.log.begin(), twice.log.end(), back);
       it != std::sregex_iterator(); ++it)
    std::printf(
        "[ measured ] key range %s: %s bytes copied, a replica again %s ms after the "
        "scheduler declared server 0 dead\n",
        (*it)[1].str().c_str(), (*it)[2].str().c_str(), (*it)[3].str().c_str());
  std::istringstream lines(twice.log);
  for (std::string l; std::getline(lines, l);)
    if (l.find("copy of key range") != std::string::npos) std::printf("[ log ] %s\n", l.c_str());
}
