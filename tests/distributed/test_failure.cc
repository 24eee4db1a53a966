// kill -9 of a worker or a server: every other process of the job reports the
// dead node and exits non-zero within the detection bound (no launcher involved:
// the processes are started directly, so this tests the runtime, not pskv-launch).
#include <gtest/gtest.h>

#include <filesystem>

#include "support/proc.h"
#include "support/test_util.h"

using namespace pskv::test;
using namespace std::chrono_literals;

namespace {

struct Job {
  std::string dir, log;
  pid_t scheduler, server0, server1;
  std::vector<pid_t> workers;
};

std::map<std::string, std::string> Env(int port, const std::string& role, const std::string& dir) {
  return {{"DMLC_ROLE", role},
          {"DMLC_PS_ROOT_URI", "127.0.0.1"},
          {"DMLC_PS_ROOT_PORT", std::to_string(port)},
          {"DMLC_NUM_SERVER", "2"},
          {"DMLC_NUM_WORKER", "2"},
          {"PS_HEARTBEAT_INTERVAL", "0.5"},
          {"PS_HEARTBEAT_TIMEOUT", "3"},
          {"PSKV_TEST_MARKER_DIR", dir},
          {"PSKV_TIMEOUT", "120"}};
}

Job Start(const std::string& name) {
  Job j;
  j.dir =
      (std::filesystem::temp_directory_path() / ("pskv_" + name + "_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(j.dir);
  std::filesystem::create_directories(j.dir);
  j.log = j.dir + "/log";
  const int port = FreePort();
  j.scheduler = Spawn({PSKV_SERVER}, Env(port, "scheduler", j.dir), j.log);
  j.server0 = Spawn({PSKV_SERVER}, Env(port, "server", j.dir), j.log);
  j.server1 = Spawn({PSKV_SERVER}, Env(port, "server", j.dir), j.log);
  for (int w = 0; w < 2; ++w)
    j.workers.push_back(
        Spawn({DIST_WORKER, "loop_until_failure"}, Env(port, "worker", j.dir), j.log));
  return j;
}

void Cleanup(const Job& j) {
  for (pid_t p : {j.scheduler, j.server0, j.server1, j.workers[0], j.workers[1]}) {
    ::kill(-p, SIGKILL);
    ::waitpid(p, nullptr, WNOHANG);
  }
  std::filesystem::remove_all(j.dir);
}

// Every pid in `pids` exits non-zero within `bound`.
void ExpectAllFail(const std::vector<pid_t>& pids, std::chrono::milliseconds bound, const Job& j) {
  const auto end = std::chrono::steady_clock::now() + bound;
  for (pid_t p : pids) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    auto st = WaitExit(p, std::max(left, 1ms));
    ASSERT_TRUE(st.has_value()) << "pid " << p << " still running after the bound; log:\n"
                                << ReadFile(j.log);
    EXPECT_NE(*st, 0) << "pid " << p << " exited 0 after a peer died";
  }
}

}  // namespace

// Detection bound: PS_HEARTBEAT_TIMEOUT (3 s) + PS_HEARTBEAT_INTERVAL (0.5 s) + margin
// for process exit and scheduling on a loaded 2-core machine.
constexpr auto kBound = 15s;

TEST(NodeFailure, KillWorker) {
  Job j = Start("killworker");
  ASSERT_TRUE(WaitFile(j.dir + "/worker0", 30s) && WaitFile(j.dir + "/worker1", 30s))
      << ReadFile(j.log);
  ::kill(j.workers[1], SIGKILL);
  ASSERT_EQ(WaitExit(j.workers[1], 5s).value_or(-1), 128 + SIGKILL);
  ExpectAllFail({j.workers[0], j.server0, j.server1, j.scheduler}, kBound, j);
  std::string log = ReadFile(j.log);
  EXPECT_NE(log.find("worker[1]"), std::string::npos) << log;
  EXPECT_NE(log.find("is dead"), std::string::npos) << log;
  Cleanup(j);
}

TEST(NodeFailure, KillServer) {
  Job j = Start("killserver");
  ASSERT_TRUE(WaitFile(j.dir + "/worker0", 30s) && WaitFile(j.dir + "/worker1", 30s))
      << ReadFile(j.log);
  ::kill(j.server1, SIGKILL);
  ExpectAllFail({j.workers[0], j.workers[1], j.server0, j.scheduler}, kBound, j);
  std::string log = ReadFile(j.log);
  EXPECT_NE(log.find("server["), std::string::npos) << log;
  EXPECT_NE(log.find("is dead"), std::string::npos) << log;
  Cleanup(j);
}

// A worker frozen (SIGSTOP: an overloaded host, a paused VM) for twice its heartbeat
// timeout does not, once resumed, declare the healthy scheduler dead: the time it was
// not running is not the scheduler's silence. (The scheduler and the server watch
// with a long timeout here; to them a frozen node is indistinguishable from a hung
// one.) Before: the worker failed with "scheduler is dead: nothing heard for 4 s".
TEST(NodeFailure, AFrozenWorkerDoesNotBlameTheScheduler) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("pskv_frozen_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/log";
  const int port = FreePort();
  auto env = [&](const std::string& role, const char* timeout) {
    auto e = Env(port, role, dir);
    e["DMLC_NUM_SERVER"] = "1";
    e["DMLC_NUM_WORKER"] = "1";
    e["PS_HEARTBEAT_TIMEOUT"] = timeout;
    return e;
  };
  const pid_t sched = Spawn({PSKV_SERVER}, env("scheduler", "60"), log);
  const pid_t server = Spawn({PSKV_SERVER}, env("server", "60"), log);
  const pid_t worker = Spawn({DIST_WORKER, "steady", "10"}, env("worker", "2"), log);
  const bool started = WaitFile(dir + "/worker0", 60s);
  if (started) {
    std::this_thread::sleep_for(1s);
    ::kill(worker, SIGSTOP);
    std::this_thread::sleep_for(4s);  // 2x the worker's PS_HEARTBEAT_TIMEOUT
    ::kill(worker, SIGCONT);
  }
  for (pid_t p : {worker, server, sched}) {
    auto st = WaitExit(p, 60s);
    EXPECT_EQ(st.value_or(-1), 0) << "pid " << p << "; log:\n" << ReadFile(log);
  }
  EXPECT_TRUE(started) << ReadFile(log);
  for (pid_t p : {sched, server, worker}) {
    ::kill(-p, SIGKILL);
    ::waitpid(p, nullptr, WNOHANG);
  }
  std::filesystem::remove_all(dir);
}
