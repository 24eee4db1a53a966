// The scheduler is no single point of failure (docs/fault-tolerance.md, "The
// scheduler"): a dist_sync job started by hand with a standby scheduler
// (PSKV_SCHEDULER_STANDBY), real processes over real ZeroMQ, authenticated; the
// scheduler is killed with SIGKILL before the job formed, between rounds, inside a
// barrier, and amid a server's failover; the job finishes, every process but the
// victim exits 0, and every worker's final weights are bitwise-equal to the
// undisturbed job's. Default failure detection (10 s heartbeat timeout): the standby
// learns of the kill from the scheduler's closed port.
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

constexpr int kRounds = 10;

struct Run {
  std::string dir, log;
  pid_t scheduler = 0, standby = 0;
  std::vector<pid_t> servers, workers;
};

struct Spec {
  std::string name;
  bool barriers = false;  // failover_worker --barriers --late-barrier 4
  int replicas = 0;
  bool standby = true;
  int rounds = kRounds;
  int pace_ms = 0;                                   // failover_worker --pace
  std::map<std::string, std::string> env{};          // for every process
  std::map<std::string, std::string> standby_env{};  // the standby's: it runs pskv-test-server
};

std::map<std::string, std::string> Env(const Spec& s, int port, int standby_port,
                                       const std::string& role) {
  std::map<std::string, std::string> env = {{"DMLC_ROLE", role},
                                            {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                                            {"DMLC_PS_ROOT_PORT", std::to_string(port)},
                                            {"DMLC_NUM_SERVER", "2"},
                                            {"DMLC_NUM_WORKER", "2"},
                                            {"PSKV_JOB_SECRET", "0123456789abcdef0123456789abcdef"},
                                            {"PSKV_REPLICAS", std::to_string(s.replicas)},
                                            {"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"},
                                            {"PSKV_WIRE_CHUNK_BYTES", "262144"},
                                            {"PSKV_TIMEOUT", "60"}};
  if (s.standby) env["PSKV_SCHEDULER_STANDBY"] = "127.0.0.1:" + std::to_string(standby_port);
  for (auto& [k, v] : s.env) env[k] = v;
  return env;
}

Run StartSchedulers(const Spec& s, int* port, int* standby_port) {
  Run j;
  j.dir = (std::filesystem::temp_directory_path() /
           ("pskv_schedfail_" + s.name + "_" + std::to_string(::getpid())))
              .string();
  std::filesystem::remove_all(j.dir);
  std::filesystem::create_directories(j.dir);
  j.log = j.dir + "/log";
  *port = FreePort();
  do *standby_port = FreePort();
  while (*standby_port == *port);
  j.scheduler = Spawn({PSKV_SERVER}, Env(s, *port, *standby_port, "scheduler"), j.log);
  if (s.standby) {
    auto env = Env(s, *port, *standby_port, "scheduler");
    env["PSKV_STANDBY"] = "1";
    for (auto& [k, v] : s.standby_env) env[k] = v;
    j.standby = Spawn({s.standby_env.empty() ? PSKV_SERVER : PSKV_TEST_SERVER}, env, j.log);
  }
  return j;
}

void StartServers(const Spec& s, Run& j, int port, int standby_port) {
  for (int r = 0; r < 2; ++r) {
    auto env = Env(s, port, standby_port, "server");
    env["DMLC_TASK_ID"] = std::to_string(r);
    j.servers.push_back(Spawn({PSKV_SERVER}, env, j.log));
  }
}

void StartWorkers(const Spec& s, Run& j, int port, int standby_port) {
  for (int w = 0; w < 2; ++w) {
    std::vector<std::string> argv = {FAILOVER_WORKER};
    if (s.barriers) argv.insert(argv.end(), {"--barriers", "--late-barrier", "4"});
    if (s.pace_ms) argv.insert(argv.end(), {"--pace", std::to_string(s.pace_ms)});
    argv.insert(argv.end(), {std::to_string(s.rounds), j.dir});
    auto env = Env(s, port, standby_port, "worker");
    env["DMLC_TASK_ID"] = std::to_string(w);
    j.workers.push_back(Spawn(argv, env, j.log));
  }
}

void Stop(const Run& j) {
  std::vector<pid_t> all = {j.scheduler};
  if (j.standby) all.push_back(j.standby);
  all.insert(all.end(), j.servers.begin(), j.servers.end());
  all.insert(all.end(), j.workers.begin(), j.workers.end());
  for (pid_t p : all) {
    ::kill(-p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
}

// When to kill the scheduler (and, `server_too`, server 1 with it).
enum class Kill { kNone, kBeforeRegistration, kBetweenRounds, kInsideBarrier };

struct Result {
  std::vector<std::string> weights;
  double slowest_round_ms = 0;
  double kill_to_rejoined_ms = -1;  // the kill until the standby logged every node back
  std::string log;
};

Result RunJob(const Spec& s, Kill kill, bool server_too = false) {
  int port = 0, standby_port = 0;
  Run j = StartSchedulers(s, &port, &standby_port);
  Result res;
  auto fail = [&](const std::string& what) {
    ADD_FAILURE() << s.name << ": " << what << "; log:\n" << ReadFile(j.log);
    Stop(j);
    return Result{};
  };
  StartServers(s, j, port, standby_port);
  if (kill == Kill::kBeforeRegistration) {
    // The servers and the standby registered (the job has not formed: no worker yet).
    std::this_thread::sleep_for(700ms);
    ::kill(j.scheduler, SIGKILL);
    std::this_thread::sleep_for(300ms);
  }
  StartWorkers(s, j, port, standby_port);
  if (kill == Kill::kBetweenRounds) {
    if (!WaitFile(j.dir + "/w0.r3", 30s)) return fail("round 3 never finished");
    ::kill(j.scheduler, SIGKILL);
    if (server_too) ::kill(j.servers[1], SIGKILL);
  } else if (kill == Kill::kInsideBarrier) {
    // Worker 0 is in the barrier of round 4; worker 1 enters it 1.5 s later.
    if (!WaitFile(j.dir + "/w0.b4", 30s)) return fail("round 4's barrier never began");
    std::this_thread::sleep_for(300ms);
    ::kill(j.scheduler, SIGKILL);
  }
  if (kill == Kill::kBetweenRounds || kill == Kill::kInsideBarrier) {
    // Detection (the standby sees the closed port) + takeover + every node's rejoin.
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < 10s) {
      if (ReadFile(j.log).find("every node rejoined") != std::string::npos) {
        res.kill_to_rejoined_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
  }
  for (size_t w = 0; w < j.workers.size(); ++w) {
    auto st = WaitExit(j.workers[w], 40s);
    if (!st || *st != 0)
      return fail("worker " + std::to_string(w) + " " +
                  (st ? "exited " + std::to_string(*st) : std::string("hung")));
    res.weights.push_back(ReadFile(j.dir + "/w" + std::to_string(w) + ".weights"));
  }
  // The rest of the job ends cleanly: the surviving scheduler (the standby, if the
  // scheduler was killed) and servers exit 0.
  std::vector<pid_t> rest;
  if (kill == Kill::kNone) rest.push_back(j.scheduler);
  if (j.standby) rest.push_back(j.standby);
  for (size_t r = 0; r < j.servers.size(); ++r)
    if (!(server_too && r == 1)) rest.push_back(j.servers[r]);
  for (pid_t p : rest) {
    auto st = WaitExit(p, 20s);
    EXPECT_TRUE(st.has_value() && *st == 0)
        << s.name << ": pid " << p << " " << (st ? std::to_string(*st) : "hung") << "; log:\n"
        << ReadFile(j.log);
  }
  std::ifstream t(j.dir + "/w0.times");
  for (double ms = 0; t >> ms;) res.slowest_round_ms = std::max(res.slowest_round_ms, ms);
  res.log = ReadFile(j.log);
  Stop(j);
  std::filesystem::remove_all(j.dir);
  return res;
}

// The undisturbed job of `rounds` rounds (no standby: a standby changes nothing either).
const std::vector<std::string>& Undisturbed(bool barriers, int rounds = kRounds) {
  static std::map<std::pair<bool, int>, std::vector<std::string>> w;
  const auto key = std::make_pair(barriers, rounds);
  if (!w.count(key)) {
    Spec s{"undisturbed" + std::to_string(barriers), barriers, 0, false};
    s.rounds = rounds;
    w[key] = RunJob(s, Kill::kNone).weights;
  }
  return w[key];
}

// Milliseconds the log says the takeover took until every node rejoined (-1: none).
long RejoinMs(const std::string& log) {
  const auto at = log.find(" ms after the takeover");
  if (at == std::string::npos) return -1;
  const auto from = log.rfind(", ", at);
  return std::stol(log.substr(from + 2, at - from - 2));
}

}  // namespace

// With a standby that is never needed: the same weights, and the standby exits 0 with
// the job (it saw the scheduler's final release).
TEST(SchedulerFailover, StandbyChangesNothingUndisturbed) {
  auto r = RunJob({"standby_only"}, Kill::kNone);
  ExpectSameWeights(Undisturbed(false), r.weights, "a standby that never took over");
  EXPECT_EQ(r.log.find("takes over"), std::string::npos) << r.log;
}

// Mid-training, between barriers: the workers never notice (data does not pass through
// the scheduler); the standby takes over within the scheduler's reconnection attempt.
TEST(SchedulerFailover, KillBetweenRoundsLosesNothing) {
  auto r = RunJob({"between"}, Kill::kBetweenRounds);
  ExpectSameWeights(Undisturbed(false), r.weights, "scheduler killed after round 3");
  const long ms = RejoinMs(r.log);
  std::printf(
      "[ stall ] scheduler killed between rounds: slowest round %.0f ms; kill -> every "
      "node rejoined the standby %.0f ms (of which the takeover -> rejoined %ld ms)\n",
      r.slowest_round_ms, r.kill_to_rejoined_ms, ms);
  EXPECT_GE(ms, 0) << r.log;
  EXPECT_LT(ms, 1000) << r.log;
  // Generous (2 shared cores): the closed port is seen within ZeroMQ's reconnection
  // attempt, far below the 10 s a silence would take.
  EXPECT_GE(r.kill_to_rejoined_ms, 0) << r.log;
  EXPECT_LT(r.kill_to_rejoined_ms, 3000) << r.log;
}

// Inside a barrier: worker 0 arrived at the dead scheduler, worker 1 arrives after the
// takeover; the standby counts worker 0's resent arrival once and releases both.
TEST(SchedulerFailover, KillInsideBarrierLosesNothing) {
  auto r = RunJob({"barrier", true}, Kill::kInsideBarrier);
  ExpectSameWeights(Undisturbed(true), r.weights, "scheduler killed inside round 4's barrier");
  std::printf(
      "[ stall ] scheduler killed inside a barrier: slowest round %.0f ms (1.5 s of it "
      "the late worker's); kill -> every node rejoined %.0f ms\n",
      r.slowest_round_ms, r.kill_to_rejoined_ms);
  EXPECT_LT(r.slowest_round_ms, 3500) << r.log;
}

// Before the job formed: the servers and the standby registered, no worker yet. The
// nodes register again with the standby, which forms the job.
TEST(SchedulerFailover, KillBeforeRegistrationCompletes) {
  auto r = RunJob({"before"}, Kill::kBeforeRegistration);
  ExpectSameWeights(Undisturbed(false), r.weights, "scheduler killed before registration ended");
  EXPECT_NE(r.log.find("collects the registrations"), std::string::npos) << r.log;
}

// With replicated servers, the scheduler and a server killed together: the standby
// takes over, then decides on the dead server (its ranges continue on their replicas).
TEST(SchedulerFailover, KillWithAServerLosesNothingReplicated) {
  auto r = RunJob({"with_server", false, 1}, Kill::kBetweenRounds, /*server_too=*/true);
  ExpectSameWeights(Undisturbed(false), r.weights, "scheduler and server 1 killed after round 3");
  EXPECT_NE(r.log.find("continue on their replicas"), std::string::npos) << r.log;
  // The takeover ends although the dead server never rejoins: it left the job instead
  // (this line once never came, and the measure below waited its whole bound).
  EXPECT_NE(r.log.find("(1 left the job instead)"), std::string::npos) << r.log;
  std::printf(
      "[ stall ] scheduler and server 1 killed between rounds: slowest round %.0f ms; kill "
      "-> every node rejoined or left %.0f ms (of which the takeover -> settled %ld ms)\n",
      r.slowest_round_ms, r.kill_to_rejoined_ms, RejoinMs(r.log));
}

// Split brain (docs/fault-tolerance.md, "Split brain"): the standby's link to a live
// scheduler is cut (its messages to the scheduler vanish, a test fail point of
// pskv-test-server); the nodes still reach the scheduler. The standby finds the
// scheduler silent and asks every node; each says it still reaches it, so the standby
// does not take over: it stops with an error naming the partition, and the job ends
// under its one scheduler with the undisturbed job's weights. (Before this rule the
// standby took over and the nodes followed it: two schedulers.)
TEST(SchedulerFailover, StandbyCutOffFromALiveSchedulerDoesNotTakeOver) {
  Spec s{"cut_standby"};
  s.rounds = 40;
  s.pace_ms = 100;  // ~4 s: the standby's detection and its question fall inside the job
  s.env = {{"PS_HEARTBEAT_TIMEOUT", "1"}, {"PS_HEARTBEAT_INTERVAL", "0.25"}};
  s.standby_env = {{"PSKV_TEST_CUT_SCHEDULER_AFTER", "300"}};
  int port = 0, standby_port = 0;
  ::Run j = StartSchedulers(s, &port, &standby_port);
  StartServers(s, j, port, standby_port);
  StartWorkers(s, j, port, standby_port);
  std::vector<std::string> weights;
  auto finish = [&](pid_t p) {  // the exit status, -1 if it hangs
    auto st = WaitExit(p, 60s);
    return st ? *st : -1;
  };
  for (size_t w = 0; w < j.workers.size(); ++w) {
    const int st = finish(j.workers[w]);
    EXPECT_EQ(st, 0) << "worker " << w << "; log:\n" << ReadFile(j.log);
    weights.push_back(ReadFile(j.dir + "/w" + std::to_string(w) + ".weights"));
  }
  // The scheduler and the servers end the job cleanly; the standby stopped with an error.
  EXPECT_EQ(finish(j.scheduler), 0) << ReadFile(j.log);
  for (pid_t p : j.servers) EXPECT_EQ(finish(p), 0) << ReadFile(j.log);
  const int standby_status = finish(j.standby);
  const std::string log = ReadFile(j.log);
  EXPECT_NE(standby_status, 0) << log;
  EXPECT_NE(log.find("cuts its link to the scheduler"), std::string::npos) << log;
  EXPECT_NE(log.find("asking every node whether it lost the scheduler too"), std::string::npos)
      << log;
  EXPECT_NE(log.find("still reach it"), std::string::npos) << log;
  EXPECT_NE(log.find("does not take over"), std::string::npos) << log;
  EXPECT_EQ(log.find("takes over as the job's scheduler"), std::string::npos) << log;
  EXPECT_EQ(log.find("took over"), std::string::npos) << log;
  ExpectSameWeights(Undisturbed(false, s.rounds), weights,
                    "the standby cut off from the scheduler");
  Stop(j);
  std::filesystem::remove_all(j.dir);
}

// Under pskv-launch (a standby by default): the schedulers `kills` names killed with
// SIGKILL mid-training, one after the other — kSchedulerTwice: the scheduler after round
// 3, then the standby that took over, once the fresh standby the launcher started for it
// has registered, after round 12; kStandbyThenScheduler: the standby after round 3,
// then, once its fresh replacement registered, the scheduler after round 12. The
// launcher exits 0 and says what happened; the weights are the undisturbed job's.
struct LaunchRun {
  std::string out;
  std::vector<std::string> weights;
};
enum class Kills { kScheduler, kSchedulerTwice, kStandbyThenScheduler };
LaunchRun LaunchAndKillSchedulers(const std::string& name, std::vector<std::string> flags,
                                  Kills kills, bool barriers = false) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("pskv_schedfail_" + name + "_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/log", tag = "sched-failover-" + name + std::to_string(::getpid());
  std::vector<std::string> argv = {PSKV_LAUNCH, "-n", "2", "-s", "2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  // 30 rounds of >= 60 ms: ~2 s, time for a fresh standby to register in between.
  argv.push_back(FAILOVER_WORKER);
  if (barriers) argv.push_back("--barriers");
  argv.insert(argv.end(), {"--pace", "60", "30", dir});
  const pid_t launcher = Spawn(argv,
                               {{"PSKV_TEST_TAG", tag},
                                {"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"},
                                {"PSKV_WIRE_CHUNK_BYTES", "262144"},
                                {"PSKV_TIMEOUT", "60"}},
                               log);
  LaunchRun r;
  auto fail = [&](const std::string& what) {
    ADD_FAILURE() << name << ": " << what << "\n" << ReadFile(log);
    ::kill(-launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
    return r;
  };
  if (!WaitFile(dir + "/w0.r3", 30s)) return fail("round 3 never finished");
  auto pids = [&](const std::string& needle) {
    auto v = PidsWithEnv(needle);
    std::sort(v.begin(), v.end());
    return v;
  };
  auto both = [](const std::vector<pid_t>& a, const std::vector<pid_t>& b) {
    std::vector<pid_t> v;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(v));
    return v;
  };
  const std::vector<pid_t> ours = pids("PSKV_TEST_TAG=" + tag),
                           scheds = both(ours, pids("DMLC_ROLE=scheduler")),
                           standbys = both(ours, pids("PSKV_STANDBY=1"));
  std::vector<pid_t> primary;
  std::set_difference(scheds.begin(), scheds.end(), standbys.begin(), standbys.end(),
                      std::back_inserter(primary));
  if (primary.size() != 1u) return fail("not one scheduler besides the standbys");
  if (standbys.size() != 1u) return fail("not one standby scheduler");
  const bool standby_first = kills == Kills::kStandbyThenScheduler;
  ::kill(standby_first ? standbys[0] : primary[0], SIGKILL);
  if (kills != Kills::kScheduler) {
    // The fresh standby registered with the standby that took over (its log line).
    const auto t0 = std::chrono::steady_clock::now();
    while (ReadFile(log).find("follows this scheduler as its standby") == std::string::npos) {
      if (std::chrono::steady_clock::now() - t0 > 20s) return fail("no fresh standby registered");
      std::this_thread::sleep_for(20ms);
    }
    if (!WaitFile(dir + "/w0.r12", 30s)) return fail("round 12 never finished");
    if (std::filesystem::exists(dir + "/w0.r29")) return fail("the job ended before the 2nd kill");
    ::kill(standby_first ? primary[0] : standbys[0], SIGKILL);
  }
  auto st = WaitExit(launcher, 60s);
  r.out = ReadFile(log);
  if (!st) return fail("the launcher hung");
  EXPECT_EQ(*st, 0) << name << ": the launcher exited " << *st << "\n" << r.out;
  for (int w = 0; w < 2; ++w)
    r.weights.push_back(ReadFile(dir + "/w" + std::to_string(w) + ".weights"));
  std::filesystem::remove_all(dir);
  if (kills == Kills::kScheduler) return r;
  // The console's "HH:MM:SS.mmm" of the first line containing `needle`, in ms (-1: none).
  auto at = [&](const std::string& needle) -> long {
    const auto p = r.out.find(needle);
    if (p == std::string::npos) return -1;
    const auto bol = r.out.rfind('\n', p) + 1;
    const std::string t = r.out.substr(bol, 12);
    return ((std::stol(t.substr(0, 2)) * 60 + std::stol(t.substr(3, 2))) * 60 +
            std::stol(t.substr(6, 2))) *
               1000 +
           std::stol(t.substr(9, 3));
  };
  const long started = at(") started: it follows"),
             registered = at("registered: it follows this scheduler as its standby");
  EXPECT_GE(started, 0) << r.out;
  EXPECT_GE(registered, started) << r.out;
  std::printf("[ stall ] the fresh standby registered %ld ms after the launcher started it\n",
              registered - started);
  std::printf(
      "[ stall ] takeovers, every node rejoined after: %s\n",
      [&] {
        std::string v;
        for (size_t p = 0; (p = r.out.find(" ms after the takeover", p)) != std::string::npos; ++p)
          v += r.out.substr(r.out.rfind(", ", p) + 2, p - r.out.rfind(", ", p) - 2) + " ms ";
        return v;
      }()
          .c_str());
  return r;
}

// With the default standby: the scheduler killed between rounds; the launcher lets the
// standby take over, starts a fresh standby, and the job ends with status 0 and the
// weights of the undisturbed job.
TEST(SchedulerFailover, KillUnderPskvLaunchLosesNothing) {
  const LaunchRun r = LaunchAndKillSchedulers("launch", {}, Kills::kScheduler);
  EXPECT_NE(r.out.find("the standby scheduler takes over and the job goes on"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("a fresh standby is started to follow it"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a standby scheduler took over"), std::string::npos) << r.out;
  ExpectSameWeights(Undisturbed(false, 30), r.weights, "scheduler killed under pskv-launch");
}

// --standby-scheduler (the default, stated) is still accepted and does the same.
TEST(SchedulerFailover, KillUnderPskvLaunchWithStandbyFlag) {
  const LaunchRun r =
      LaunchAndKillSchedulers("launch_flag", {"--standby-scheduler"}, Kills::kScheduler);
  EXPECT_NE(r.out.find("the standby scheduler takes over and the job goes on"), std::string::npos)
      << r.out;
  ExpectSameWeights(Undisturbed(false, 30), r.weights, "scheduler killed (--standby-scheduler)");
}

// Two scheduler deaths: the scheduler, then the standby that took over from it. The
// fresh standby the launcher started got the job's state (node table, range table,
// barrier releases) from the new scheduler and takes over the second time.
TEST(SchedulerFailover, TwoSchedulerDeathsUnderPskvLaunchLoseNothing) {
  const LaunchRun r = LaunchAndKillSchedulers("launch_twice", {}, Kills::kSchedulerTwice);
  size_t takeovers = 0;
  for (size_t at = 0; (at = r.out.find("the standby scheduler takes over and the job goes on",
                                       at)) != std::string::npos;
       ++at)
    ++takeovers;
  EXPECT_EQ(takeovers, 2u) << r.out;
  EXPECT_NE(r.out.find("standby scheduler 2 (pid "), std::string::npos) << r.out;
  ExpectSameWeights(Undisturbed(false, 30), r.weights, "two schedulers killed under pskv-launch");
}

// --no-standby-scheduler: the old behaviour, the scheduler's death ends the job at once.
TEST(SchedulerFailover, NoStandbyUnderPskvLaunchStopsTheJob) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("pskv_schedfail_nostandby_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/log", tag = "sched-nostandby-" + std::to_string(::getpid());
  const pid_t launcher = Spawn({PSKV_LAUNCH, "-n", "1", "-s", "1", "--no-standby-scheduler",
                                FAILOVER_WORKER, "--pace", "100", "60", dir},
                               {{"PSKV_TEST_TAG", tag}, {"PSKV_TIMEOUT", "60"}}, log);
  ASSERT_TRUE(WaitFile(dir + "/w0.r3", 30s)) << ReadFile(log);
  std::vector<pid_t> scheds = PidsWithEnv("DMLC_ROLE=scheduler"),
                     ours = PidsWithEnv("PSKV_TEST_TAG=" + tag),
                     standbys = PidsWithEnv("PSKV_STANDBY=1");
  std::vector<pid_t> mine;
  for (pid_t p : ours)
    if (std::count(scheds.begin(), scheds.end(), p)) mine.push_back(p);
  ASSERT_EQ(mine.size(), 1u) << "one scheduler, no standby\n" << ReadFile(log);
  for (pid_t p : ours) EXPECT_EQ(std::count(standbys.begin(), standbys.end(), p), 0);
  ::kill(mine[0], SIGKILL);
  auto st = WaitExit(launcher, 30s);
  if (!st) ::kill(-launcher, SIGKILL);
  ASSERT_TRUE(st.has_value()) << ReadFile(log);
  EXPECT_NE(*st, 0) << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("scheduler (pid "), std::string::npos) << ReadFile(log);
  std::filesystem::remove_all(dir);
}

// The standby dies first: the launcher starts a fresh standby, which registers with the
// scheduler once it forgot the dead one; then the scheduler dies and the fresh standby
// takes over.
TEST(SchedulerFailover, StandbyThenSchedulerDieUnderPskvLaunchLoseNothing) {
  const LaunchRun r = LaunchAndKillSchedulers("standby_first", {}, Kills::kStandbyThenScheduler);
  EXPECT_NE(r.out.find("until a fresh one, started now, follows the scheduler"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the standby scheduler takes over and the job goes on"), std::string::npos)
      << r.out;
  ExpectSameWeights(Undisturbed(false, 30), r.weights, "the standby, then the scheduler killed");
}

// As StandbyThenSchedulerDieUnderPskvLaunchLoseNothing, with PS_RESEND=1 (sequence
// numbers per peer) and a Barrier() in every round: the fresh standby is another process
// under the dead standby's id, so the scheduler numbers what it sends it (the job's
// barrier releases, its range table, the workers that left) from 1 again. When the
// scheduler went on with the dead standby's numbers, the fresh one held all of it behind
// a gap that never filled and took over the job with no release counted: the workers'
// next barrier, after a dozen releases, was refused as a protocol error and the job hung.
TEST(SchedulerFailover, StandbyThenSchedulerDieWithResendLoseNothing) {
  const LaunchRun r = LaunchAndKillSchedulers(
      "standby_first_resend", {"--env", "PS_RESEND=1", "--env", "PS_RESEND_TIMEOUT=300"},
      Kills::kStandbyThenScheduler, /*barriers=*/true);
  EXPECT_NE(r.out.find("the standby scheduler takes over and the job goes on"), std::string::npos)
      << r.out;
  ExpectSameWeights(Undisturbed(true, 30), r.weights,
                    "the standby, then the scheduler killed, PS_RESEND=1");
}
