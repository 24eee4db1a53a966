// A replicated job started by pskv-launch survives a server's death
// (docs/fault-tolerance.md, "The launcher"): the failover worker's dist_sync job
// (tests/distributed/failover_worker.cc) with PSKV_REPLICAS=1 and default failure detection;
// one server process killed with SIGKILL mid-job: the launcher exits 0 and every
// worker's final weights are bitwise-equal to the undisturbed job's. Both servers
// killed: the job stops within a bounded time, naming the key ranges lost. No process
// of either job outlives the launcher.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "support/proc.h"
#include "support/test_util.h"

using namespace pskv::test;
using namespace std::chrono_literals;

namespace {

constexpr int kRounds = 12;

struct Job {
  std::string dir, out, tag;
  pid_t launcher = 0;
};

// `extra`: more pskv-launch options.
Job Start(const std::string& name, std::vector<std::string> extra = {}) {
  Job j;
  j.dir = (std::filesystem::temp_directory_path() /
           ("pskv_failover_launch_" + name + "_" + std::to_string(::getpid())))
              .string();
  std::filesystem::remove_all(j.dir);
  std::filesystem::create_directories(j.dir);
  j.out = j.dir + "/out";
  j.tag = "PSKV_TEST_TAG=failover_launch_" + name + "_" + std::to_string(::getpid());
  const auto eq = j.tag.find('=');
  std::vector<std::string> argv = {
      PSKV_LAUNCH, "-n", "2", "-s", "2", "--timeout", "120", "--env", "PSKV_REPLICAS=1", "--env",
      "MXNET_KVSTORE_BIGARRAY_BOUND=1000", "--env", "PSKV_WIRE_CHUNK_BYTES=262144",
      // 30 ms per request in the servers: the rounds after the marker the test
      // waits for last long enough (about 0.1 s each) for its kill to land
      // inside the job on loaded cores, not after the final barrier.
      "--env", "PSKV_TEST_REPLY_DELAY=30",
      // pskv-server with the fail points of tests/support/env_fail_points.h
      "--server-command", std::string("exec ") + TEST_SERVER};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {"--", FAILOVER_WORKER, std::to_string(kRounds), j.dir});
  // Only loopback is touched (the mpi launcher would pick the host's address).
  j.launcher =
      Spawn(argv, {{j.tag.substr(0, eq), j.tag.substr(eq + 1)}, {"DMLC_PS_ROOT_URI", "127.0.0.1"}},
            j.out);
  return j;
}

// Pids of the job's server processes (DMLC_ROLE=server in their environment, running
// the test server: not the mpirun that started one), spares (PSKV_SPARE_SERVER=1) only
// if `spares`.
std::vector<pid_t> Servers(const Job& j, bool spares = false) {
  std::vector<pid_t> out;
  for (pid_t p : PidsWithEnv(j.tag)) {
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(p) + "/exe", ec);
    if (ec || exe.filename() != std::filesystem::path(TEST_SERVER).filename()) continue;
    const std::string env = ReadFile("/proc/" + std::to_string(p) + "/environ");
    const bool spare = env.find(std::string("PSKV_SPARE_SERVER=1") + '\0') != std::string::npos;
    if (env.find(std::string("DMLC_ROLE=server") + '\0') != std::string::npos && spare == spares)
      out.push_back(p);
  }
  return out;
}

bool WaitGone(const std::string& tag, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!PidsWithEnv(tag).empty()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

// The launcher's exit status (-1: it hung and was killed) and how long it ran after `t0`.
std::pair<int, double> Finish(const Job& j, std::chrono::steady_clock::time_point t0) {
  auto st = WaitExit(j.launcher, 150s);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st) {
    ::kill(-j.launcher, SIGKILL);
    WaitExit(j.launcher, 5s);
  }
  EXPECT_TRUE(WaitGone(j.tag, 10s)) << "processes of the job outlived the launcher";
  return {st.value_or(-1), secs};
}

std::vector<std::string> Weights(const Job& j) {
  return {ReadFile(j.dir + "/w0.weights"), ReadFile(j.dir + "/w1.weights")};
}

// The undisturbed job's weights and wall time (run once).
const std::pair<std::vector<std::string>, double>& Undisturbed() {
  static const auto r = [] {
    Job u = Start("undisturbed");
    auto [st, secs] = Finish(u, std::chrono::steady_clock::now());
    EXPECT_EQ(st, 0) << ReadFile(u.out);
    auto w = Weights(u);
    std::filesystem::remove_all(u.dir);
    return std::make_pair(w, secs);
  }();
  return r;
}

bool HaveMpirun() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t b = 0, e; b <= dirs.size(); b = e + 1) {
    e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    if (::access((dirs.substr(b, e - b) + "/mpirun").c_str(), X_OK) == 0) return true;
  }
  return false;
}

// The job started with `extra` (a launcher), one server killed mid-job: it finishes
// with exit status 0 and the undisturbed job's weights.
void KillOneServer(const std::string& name, const std::vector<std::string>& extra) {
  const auto& [want, usecs] = Undisturbed();
  ASSERT_FALSE(want[0].empty());
  ASSERT_EQ(want[0], want[1]);

  Job j = Start(name, extra);
  ASSERT_TRUE(WaitFile(j.dir + "/w0.r4", 60s)) << ReadFile(j.out);
  auto servers = Servers(j);
  ASSERT_EQ(servers.size(), 2u) << ReadFile(j.out);
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(servers[1], SIGKILL);
  auto [st, secs] = Finish(j, t0);
  const std::string out = ReadFile(j.out);
  EXPECT_EQ(st, 0) << out;
  // "... killed by signal 9 (Killed); the job goes on without it", or, where the
  // process the launcher started outlives the server by a moment (mpirun reporting
  // it), "... was declared dead by the scheduler, which goes on without it".
  EXPECT_NE(out.find("goes on without it"), std::string::npos) << out;
  EXPECT_NE(out.find("surviving the loss of server"), std::string::npos) << out;
  const auto got = Weights(j);
  for (size_t w = 0; w < 2; ++w)
    EXPECT_TRUE(got[w] == want[w]) << "worker " << w << "'s final weights differ from the "
                                   << "undisturbed job's";
  std::printf(
      "[ launch ] %s: server killed: job finished %.2f s after the kill (undisturbed job: "
      "%.2f s in all)\n",
      name.c_str(), secs, usecs);
  std::filesystem::remove_all(j.dir);
}

}  // namespace

TEST(FailoverLaunch, AKilledServerDoesNotStopTheJobAndLosesNothing) {
  KillOneServer("kill1", {});
}

// --launcher mpi starts each server as an mpirun of its own (issue 42, hole 1): Open MPI
// aborts a whole mpirun job when one of its processes dies, so servers in one mpirun
// all went with the first ("no live copy left"). Now a killed server ends only its own
// mpirun, and the job goes on as under the local launcher.
TEST(FailoverLaunch, UnderMpiAKilledServerDoesNotStopTheJob) {
  if (!HaveMpirun()) GTEST_SKIP() << "mpirun not installed (openmpi-bin)";
  KillOneServer("mpi", {"--launcher", "mpi"});
}

TEST(FailoverLaunch, KillingEveryCopyStopsTheJobNamingTheRangesLost) {
  Job j = Start("killall");
  ASSERT_TRUE(WaitFile(j.dir + "/w0.r3", 60s)) << ReadFile(j.out);
  auto servers = Servers(j);
  ASSERT_EQ(servers.size(), 2u) << ReadFile(j.out);
  const auto t0 = std::chrono::steady_clock::now();
  for (pid_t p : servers) ::kill(p, SIGKILL);
  auto [st, secs] = Finish(j, t0);
  const std::string out = ReadFile(j.out);
  EXPECT_NE(st, 0) << out;
  EXPECT_NE(out.find("and the scheduler failed the job: NodeFailure: "), std::string::npos) << out;
  EXPECT_NE(out.find("no live copy left of key range"), std::string::npos) << out;
  // Default detection (PS_HEARTBEAT_TIMEOUT 10 s, interval 1 s) bounds it.
  EXPECT_LT(secs, 30) << out;
  std::printf("[ launch ] both servers killed: job stopped %.2f s after the kill\n", secs);
  std::filesystem::remove_all(j.dir);
}

namespace {

// pskv-launch --spare-servers 1 (and `extra`): a server killed mid-job; the spare joins
// the key ranges left short of a copy while the job goes on, the launcher says so, and
// the job ends with exit status 0 and the undisturbed job's weights.
void SpareJoins(const std::string& name, std::vector<std::string> extra) {
  const auto& [want, usecs] = Undisturbed();
  ASSERT_FALSE(want[0].empty());
  extra.insert(extra.end(), {"--spare-servers", "1"});
  Job j = Start(name, extra);
  ASSERT_TRUE(WaitFile(j.dir + "/w0.r4", 60s)) << ReadFile(j.out);
  auto servers = Servers(j);
  ASSERT_EQ(servers.size(), 2u) << ReadFile(j.out);
  ASSERT_EQ(Servers(j, true).size(), 1u) << ReadFile(j.out);
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(servers[0], SIGKILL);
  auto [st, secs] = Finish(j, t0);
  const std::string out = ReadFile(j.out);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("goes on without it"), std::string::npos) << out;  // as KillOneServer
  EXPECT_NE(out.find(", a spare server, joined the key ranges left short of a copy"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(", a spare, joined)"), std::string::npos) << out;
  const auto got = Weights(j);
  for (size_t w = 0; w < 2; ++w)
    EXPECT_TRUE(got[w] == want[w]) << "worker " << w << "'s final weights differ from the "
                                   << "undisturbed job's";
  std::printf(
      "[ launch ] %s: server killed, spare joined: job finished %.2f s after the kill "
      "(undisturbed job: %.2f s in all)\n",
      name.c_str(), secs, usecs);
  std::filesystem::remove_all(j.dir);
}

}  // namespace

TEST(FailoverLaunch, ASpareJoinsAfterAServerIsKilled) {
  SpareJoins("spare", {});
}

// --launcher mpi: the spare is one more mpirun of its own, after the servers.
TEST(FailoverLaunch, UnderMpiASpareJoinsAfterAServerIsKilled) {
  if (!HaveMpirun()) GTEST_SKIP() << "mpirun not installed (openmpi-bin)";
  SpareJoins("mpi_spare", {"--launcher", "mpi"});
}
