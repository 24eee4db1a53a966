// pskv-launch: real jobs on this host; exit codes, output prefixes, failure
// propagation, signals, and that no process of a job outlives the launcher
// (checked by scanning every pid's environment for a per-test tag, not by name).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/env_table.h"
#include "support/proc.h"

using namespace pskv::test;
using namespace std::chrono_literals;

namespace {

std::string TmpDir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("pskv_launch_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

struct RunResult {
  int status = -1;
  std::string out;
  double seconds = 0;
};

RunResult Launch(const std::vector<std::string>& args, std::chrono::milliseconds limit = 120s,
                 const std::map<std::string, std::string>& env = {}) {
  std::string dir = TmpDir("run");
  std::vector<std::string> argv = {PSKV_LAUNCH};
  argv.insert(argv.end(), args.begin(), args.end());
  auto t0 = std::chrono::steady_clock::now();
  pid_t p = Spawn(argv, env, dir + "/out");
  RunResult r;
  auto st = WaitExit(p, limit);
  if (!st) {
    ::kill(-p, SIGKILL);
    WaitExit(p, 5s);
  }
  r.status = st.value_or(-1);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.out = ReadFile(dir + "/out");
  std::filesystem::remove_all(dir);
  return r;
}

std::string Tag() {
  return "PSKV_TEST_TAG=" + std::to_string(::getpid()) + "_" + std::to_string(rand());
}

}  // namespace

TEST(Launcher, LocalJobRunsAndPrefixesOutput) {
  RunResult r = Launch({"-n", "2", "-s", "2", "--timeout", "100", "--", DIST_WORKER, "sync", "2"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[worker 0] worker 0: all checks passed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[worker 1] worker 1: all checks passed"), std::string::npos) << r.out;
  // Every launched job has a secret: no node announces an open job.
  EXPECT_EQ(r.out.find("OPEN to anyone"), std::string::npos) << r.out;
}

// A secret given to the launcher as a file reaches every node (as a value: the
// nodes must not see PSKV_JOB_SECRET_FILE as well, which they would refuse).
TEST(Launcher, SecretFileOfTheLauncherIsUsedByEveryNode) {
  std::string dir = TmpDir("secretfile");
  std::string path = dir + "/secret";
  std::ofstream(path) << "a-secret-from-a-file\n";
  ::chmod(path.c_str(), 0600);
  RunResult r = Launch({"-n", "1", "-s", "1", "--timeout", "100", "--", DIST_WORKER, "sync", "1"},
                       120s, {{"PSKV_JOB_SECRET_FILE", path}});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("OPEN to anyone"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

TEST(Launcher, NoSecretRunsAnOpenJobAndSaysSoOncePerProcess) {
  RunResult r = Launch(
      {"-n", "1", "-s", "1", "--no-secret", "--timeout", "100", "--", DIST_WORKER, "sync", "1"});
  EXPECT_EQ(r.status, 0) << r.out;
  size_t n = 0;
  for (size_t at = 0; (at = r.out.find("OPEN to anyone", at)) != std::string::npos; ++at) ++n;
  EXPECT_EQ(n, 4u) << r.out;  // scheduler, its standby, server, worker: once each
}

// A job that hangs: the headline names the process that hung, not the first
// one to exit or "timeout" alone.
TEST(Launcher, HeadlineNamesTheProcessThatHung) {
  RunResult r = Launch({"-n", "2", "-s", "1", "--timeout", "4", "--env", "PSKV_STALL_WARNING=1",
                        "--", SECURITY_WORKER, "--hang-rank", "1"},
                       60s);
  EXPECT_EQ(r.status, 124) << r.out;
  EXPECT_NE(r.out.find("pskv-launch: worker 1 (pid "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("appears hung"), std::string::npos) << r.out;
}

// The same with every log line off: the launcher learns who hung from the processes'
// status records (PSKV_STATUS), not from their log text.
TEST(Launcher, HungProcessIsNamedFromStatusRecordsNotLogText) {
  RunResult r = Launch({"-n", "2", "-s", "1", "--timeout", "4", "--env", "PSKV_STALL_WARNING=1",
                        "--env", "PSKV_LOG_LEVEL=off", "--", SECURITY_WORKER, "--hang-rank", "1"},
                       60s);
  EXPECT_EQ(r.status, 124) << r.out;
  EXPECT_EQ(r.out.find("waiting for worker["), std::string::npos) << "logs are off:\n" << r.out;
  EXPECT_NE(r.out.find("pskv-launch: worker 1 (pid "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("appears hung: scheduler was waiting for it"), std::string::npos) << r.out;
}

// A worker that never pushes: worker 0 waits for the server, whose sync round waits for
// worker 1. The headline follows the chain to worker 1, not to the server.
TEST(Launcher, WorkerThatNeverPushesIsNamedThroughTheServer) {
  RunResult r = Launch({"-n", "2", "-s", "1", "--timeout", "5", "--env", "PSKV_STALL_WARNING=1",
                        "--", SECURITY_WORKER, "--no-push-rank", "1"},
                       60s);
  EXPECT_EQ(r.status, 124) << r.out;
  EXPECT_NE(r.out.find("pskv-launch: worker 1 (pid "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("appears hung: server 0 was waiting for it"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("worker 0: waiting for server 0 (wait, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("server 0: waiting for worker 1 (sync round of key "), std::string::npos)
      << r.out;
}

// The job secret never appears on a command line (argv is visible to every user
// in ps, on every host): not for ssh, mpi, slurm, sge or yarn. --dry-run prints
// every command line the launcher would run, and the environment with secrets
// masked.
// Every job-wide variable of the table (common/env_table.h) set in the launcher's
// environment reaches the nodes of every launcher that starts them elsewhere (the
// local launcher's children inherit the environment).
TEST(LauncherDryRun, EveryJobWideVariableReachesEveryNode) {
  std::map<std::string, std::string> env;
  for (const pskv::EnvVar& v : pskv::EnvVars()) {
    if (v.scope != pskv::EnvScope::kJob && v.scope != pskv::EnvScope::kHost) continue;
    const std::string name = v.name;
    if (name == "PATH") continue;  // kept as it is (the launcher runs its tools by it)
    env[name] = name == "PSKV_LOG_LEVEL"   ? "warn"
                : name == "DMLC_INTERFACE" ? "lo"
                : name == "PSKV_REPLICAS"  ? "0"  // sge and yarn refuse replicas
                : v.type == pskv::EnvType::kChoice
                    ? std::string(v.choices).substr(0, std::string(v.choices).find('|'))
                    : "1";
  }
  std::string dir = TmpDir("forward");
  std::ofstream(dir + "/hosts") << "127.0.0.1\n";
  for (std::string launcher : {"ssh", "mpi", "slurm", "sge", "yarn", "kubernetes"}) {
    std::vector<std::string> args = {"-n", "2", "-s", "1", "--launcher", launcher, "--dry-run"};
    if (launcher == "ssh" || launcher == "mpi") args.insert(args.end(), {"-H", dir + "/hosts"});
    if (launcher == "kubernetes") args.insert(args.end(), {"--image", "pskv:test"});
    args.insert(args.end(), {"--", "prog"});
    RunResult r = Launch(args, 30s, env);
    ASSERT_EQ(r.status, 0) << launcher << ": " << r.out;
    for (auto& [name, value] : env) {
      if (launcher == "kubernetes" && pskv::FindEnvVar(name)->scope == pskv::EnvScope::kHost) {
        EXPECT_FALSE(std::regex_search(r.out, std::regex("\\b" + name + "\\b"))) << name;
        continue;  // a container has its own paths and NICs
      }
      EXPECT_TRUE(std::regex_search(r.out, std::regex("\\b" + name + "\\b")))
          << launcher << " does not pass " << name << " on:\n"
          << r.out;
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(LauncherDryRun, SecretNeverOnACommandLine) {
  const std::string secret = "s3cr3t-value-for-the-test";
  std::string dir = TmpDir("secret");
  std::ofstream(dir + "/hosts") << "127.0.0.1\n";
  for (std::string launcher : {"local", "ssh", "mpi", "slurm", "sge", "yarn"}) {
    std::vector<std::string> args = {"-n", "2", "-s", "1", "--launcher", launcher, "--dry-run"};
    if (launcher == "ssh" || launcher == "mpi") {
      args.push_back("-H");
      args.push_back(dir + "/hosts");
    }
    args.insert(args.end(), {"--", "prog"});
    RunResult r = Launch(args, 30s, {{"PSKV_JOB_SECRET", secret}});
    EXPECT_EQ(r.status, 0) << launcher << ": " << r.out;
    EXPECT_EQ(r.out.find(secret), std::string::npos) << launcher << " shows the secret:\n" << r.out;
    if (launcher == "ssh") {  // no environment value on an ssh command line at all
      std::istringstream lines(r.out);
      for (std::string line; std::getline(lines, line);) {
        if (line.find("] ssh ") == std::string::npos) continue;
        EXPECT_EQ(line.find("DMLC_"), std::string::npos) << line;
        EXPECT_NE(line.find("read -r l"), std::string::npos) << line;
      }
    }
    if (launcher == "mpi") {
      EXPECT_NE(r.out.find("-x PSKV_JOB_SECRET "), std::string::npos) << r.out;
    }
    if (launcher == "yarn") {
      EXPECT_NE(r.out.find("-shell_env PSKV_JOB_SECRET_FILE="), std::string::npos) << r.out;
    }
    if (launcher == "local") {
      EXPECT_NE(r.out.find("PSKV_JOB_SECRET=<secret>"), std::string::npos) << r.out;
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Launcher, FailingWorkerStopsTheJobAndLeavesNoProcess) {
  const std::string tag = Tag();
  RunResult r =
      Launch({"-n", "2", "-s", "2", "--timeout", "100", "--env", tag, "--", DIST_WORKER, "exit3"});
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_LT(r.seconds, 10.0) << r.out;
  EXPECT_NE(r.out.find("worker 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exited with status 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("worker 1 exits with status 3 now"), std::string::npos)
      << "last lines shown";
  EXPECT_TRUE(PidsWithEnv(tag).empty());
}

// After the job's end (every node passed the final barrier, the scheduler exited 0),
// a server's death fails nothing, and the workers' own code after close() runs to its
// end (issue 42, hole 7). The servers linger after pskv-server (a shell around it); each
// worker sleeps 4 s after its store closed, then writes a file; the test kills a
// server's process group once the scheduler is gone.
TEST(Launcher, ALateServerDeathFailsNothingAndWorkersFinishTheirCode) {
  const std::string tag = Tag(), dir = TmpDir("late");
  const std::string server = (std::filesystem::path(PSKV_LAUNCH).parent_path() / "pskv-server");
  auto role = [&](const std::string& r) {
    std::vector<pid_t> out;
    for (pid_t p : PidsWithEnv(tag))
      if (ReadFile("/proc/" + std::to_string(p) + "/environ")
              .find("DMLC_ROLE=" + r + std::string(1, '\0')) != std::string::npos)
        out.push_back(p);
    return out;
  };
  pid_t p = Spawn(
      {PSKV_LAUNCH, "-n", "2", "-s", "2", "--timeout", "100", "--env", tag, "--server-command",
       "'" + server + "'; s=$?; [ \"$DMLC_ROLE\" = server ] && sleep 8; exit $s", "--", "/bin/sh",
       "-c", "\"$0\" sync 2 || exit $?; sleep 4; echo done > \"$1/after.$DMLC_TASK_ID\"",
       DIST_WORKER, dir},
      {}, dir + "/out");
  auto until = [](auto cond) {
    for (auto end = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < end;
         std::this_thread::sleep_for(20ms))
      if (cond()) return true;
    return false;
  };
  ASSERT_TRUE(until([&] { return !role("scheduler").empty(); })) << ReadFile(dir + "/out");
  ASSERT_TRUE(until([&] { return role("scheduler").empty(); })) << ReadFile(dir + "/out");
  pid_t leader = -1;  // the launcher's child: a process group of its own
  for (pid_t s : role("server"))
    if (::getpgid(s) == s) leader = s;
  ASSERT_GT(leader, 0) << ReadFile(dir + "/out");
  ASSERT_TRUE(::access((dir + "/after.0").c_str(), F_OK) != 0) << "too late: the workers ended";
  ::kill(-leader, SIGKILL);
  auto st = WaitExit(p, 60s);
  if (!st) ::kill(-p, SIGKILL);
  const std::string out = ReadFile(dir + "/out");
  EXPECT_EQ(st.value_or(-1), 0) << out;
  EXPECT_EQ(ReadFile(dir + "/after.0"), "done\n") << "worker 0's code after close() was stopped";
  EXPECT_EQ(ReadFile(dir + "/after.1"), "done\n") << "worker 1's code after close() was stopped";
  EXPECT_NE(out.find("was killed by signal 9 (Killed) after the job had finished"),
            std::string::npos)
      << out;
  std::filesystem::remove_all(dir);
}

TEST(Launcher, SigtermStopsEveryChild) {
  const std::string tag = Tag();
  std::string dir = TmpDir("sigterm");
  pid_t p = Spawn({PSKV_LAUNCH, "-n", "2", "-s", "1", "--env", tag, "--env",
                   "PSKV_TEST_MARKER_DIR=" + dir, "--", DIST_WORKER, "loop_until_failure"},
                  {}, dir + "/out");
  ASSERT_TRUE(WaitFile(dir + "/worker0", 30s) && WaitFile(dir + "/worker1", 30s))
      << ReadFile(dir + "/out");
  EXPECT_EQ(PidsWithEnv(tag).size(), 5u);  // scheduler, its standby, server, 2 workers
  ::kill(p, SIGTERM);
  auto st = WaitExit(p, 10s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(*st, 128 + SIGTERM);
  EXPECT_TRUE(PidsWithEnv(tag).empty());
  EXPECT_NE(ReadFile(dir + "/out").find("received"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Launcher, SigkillOfTheLauncherLeavesNoOrphans) {
  const std::string tag = Tag();
  std::string dir = TmpDir("sigkill");
  pid_t p = Spawn({PSKV_LAUNCH, "-n", "1", "-s", "1", "--env", tag, "--env",
                   "PSKV_TEST_MARKER_DIR=" + dir, "--", DIST_WORKER, "loop_until_failure"},
                  {}, dir + "/out");
  ASSERT_TRUE(WaitFile(dir + "/worker0", 30s)) << ReadFile(dir + "/out");
  ::kill(p, SIGKILL);
  WaitExit(p, 5s);
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (!PidsWithEnv(tag).empty() && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(PidsWithEnv(tag).empty());
  std::filesystem::remove_all(dir);
}

// ssh to a port nothing listens on: ssh exits 255 before the process started, and the
// launcher says which host failed and the command that tests the connection alone.
TEST(Launcher, SshThatCannotConnectNamesTheHostAndHowToTestIt) {
  RunResult r =
      Launch({"-n", "1", "-s", "1", "--launcher", "ssh", "-H", "127.0.0.1", "--ssh-port", "1",
              "--ssh-arg=-oConnectTimeout=20", "--timeout", "60", "--", "/bin/true"});
  EXPECT_EQ(r.status, 255) << r.out;
  EXPECT_NE(r.out.find("ssh to 127.0.0.1 failed before the process started"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("test the connection with: ssh -o BatchMode=yes -p 1 "
                       "-oConnectTimeout=20 127.0.0.1 true"),
            std::string::npos)
      << r.out;
}

TEST(Launcher, TimeoutStopsTheJob) {
  const std::string tag = Tag();
  RunResult r = Launch({"-n", "1", "-s", "1", "--timeout", "2", "--env", tag, "--", DIST_WORKER,
                        "loop_until_failure"});
  EXPECT_EQ(r.status, 124) << r.out;
  EXPECT_NE(r.out.find("timeout"), std::string::npos);
  EXPECT_TRUE(PidsWithEnv(tag).empty());
}

TEST(Launcher, ArgumentsArePassedExactly) {
  // The worker never joins the job; registration times out quickly, which is fine:
  // only the worker's output matters here.
  RunResult r = Launch({"-n", "1", "-s", "1", "--env", "PSKV_REGISTER_TIMEOUT=1", "--", "printf",
                        "<%s>", "a b", "c'd", "$HOME"});
  EXPECT_NE(r.out.find("[worker 0] <a b><c'd><$HOME>"), std::string::npos) << r.out;
}

TEST(Launcher, EnvForServersAndWorkersOnly) {
  RunResult r = Launch({"-n", "1", "-s", "1", "--dry-run", "--env-server", "ONLY_S=1",
                        "--env-worker", "ONLY_W=2", "--env", "ALL:3", "--", "prog"});
  EXPECT_EQ(r.status, 0);
  std::istringstream is(r.out);
  std::string line;
  while (std::getline(is, line)) {
    EXPECT_NE(line.find("ALL=3"), std::string::npos) << line;
    const bool worker = line.rfind("[worker", 0) == 0;
    EXPECT_EQ(line.find("ONLY_W=2") != std::string::npos, worker) << line;
    EXPECT_EQ(line.find("ONLY_S=1") != std::string::npos, !worker) << line;
  }
}

// A local server gets its share of the cores as PSKV_SERVER_THREADS (cores / processes,
// at least 1) unless the user chose: --env, or the variable exported to the launcher
// (which the children inherit, so the launcher must not override it).
TEST(Launcher, ServerThreadsAreTheServersShareOfTheCoresUnlessChosen) {
  auto server_line = [](const std::string& out) {
    std::istringstream is(out);
    std::string line;
    while (std::getline(is, line))
      if (line.rfind("[server 0]", 0) == 0) return line;
    return std::string();
  };
  RunResult r = Launch({"-n", "1", "-s", "1", "--dry-run", "--", "prog"});
  ASSERT_EQ(r.status, 0) << r.out;
  const unsigned share = std::max(1u, std::thread::hardware_concurrency() / 2);
  EXPECT_NE(server_line(r.out).find("PSKV_SERVER_THREADS=" + std::to_string(share)),
            std::string::npos)
      << r.out;
  r = Launch({"-n", "1", "-s", "1", "--dry-run", "--env", "PSKV_SERVER_THREADS=3", "--", "prog"});
  EXPECT_NE(server_line(r.out).find("PSKV_SERVER_THREADS=3"), std::string::npos) << r.out;
  r = Launch({"-n", "1", "-s", "1", "--dry-run", "--", "prog"}, 120s,
             {{"PSKV_SERVER_THREADS", "5"}});
  EXPECT_EQ(server_line(r.out).find("PSKV_SERVER_THREADS="), std::string::npos)
      << "the exported value must reach the server unchanged: " << r.out;
}

// A standby scheduler by default, next to the scheduler (every launcher that runs the
// scheduler here), bound at its own port that every process is told of;
// --no-standby-scheduler: none; --standby-scheduler is still accepted; kubernetes has
// none (and refuses the flag).
TEST(Launcher, StandbySchedulerByDefault) {
  for (std::string launcher : {"local", "mpi", "slurm", "sge", "yarn"}) {
    RunResult r = Launch({"-n", "1", "-s", "1", "--launcher", launcher, "--dry-run", "--", "prog"});
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("[standby scheduler] "), std::string::npos) << launcher << "\n" << r.out;
    EXPECT_NE(r.out.find("PSKV_STANDBY=1"), std::string::npos) << launcher << "\n" << r.out;
    EXPECT_NE(r.out.find("PSKV_SCHEDULER_STANDBY="), std::string::npos) << launcher << "\n"
                                                                        << r.out;
    r = Launch({"-n", "1", "-s", "1", "--launcher", launcher, "--no-standby-scheduler", "--dry-run",
                "--", "prog"});
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out.find("standby"), std::string::npos) << launcher << "\n" << r.out;
    EXPECT_EQ(r.out.find("PSKV_SCHEDULER_STANDBY"), std::string::npos) << launcher << "\n" << r.out;
  }
  RunResult r = Launch({"-n", "1", "-s", "1", "--standby-scheduler", "--dry-run", "--", "prog"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[standby scheduler] "), std::string::npos) << r.out;
  r = Launch({"-n", "1", "-s", "1", "--standby-scheduler", "--no-standby-scheduler", "--dry-run",
              "--", "prog"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("not both"), std::string::npos) << r.out;
  r = Launch({"-n", "1", "-s", "1", "--launcher", "kubernetes", "--image", "img", "--", "prog"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("PSKV_SCHEDULER_STANDBY"), std::string::npos) << r.out;
  r = Launch({"-n", "1", "-s", "1", "--launcher", "kubernetes", "--image", "img",
              "--standby-scheduler", "--", "prog"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("does not work with --launcher kubernetes"), std::string::npos) << r.out;
}

TEST(Launcher, UsageErrors) {
  RunResult r = Launch({"--", "prog"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("-n N"), std::string::npos) << r.out;
  r = Launch({"-n", "1", "--launcher", "pbs", "--", "prog"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("valid: local, ssh, mpi, slurm, sge, yarn"), std::string::npos) << r.out;
  r = Launch({"-n", "1", "--launcher", "ssh", "--", "prog"});
  EXPECT_EQ(r.status, 2);
  r = Launch({"--help"});
  EXPECT_EQ(r.status, 0);
  for (auto opt : {"--sync-dst-dir", "--env-server", "--env-worker", "--server-command",
                   "--dry-run", "--timeout", "Examples"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
}

// Batch systems that cannot run here: the generated commands are checked.
TEST(LauncherDryRun, Sge) {
  RunResult r =
      Launch({"-n", "3", "-s", "2", "--launcher", "sge", "--dry-run", "--", "prog", "x y"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("qsub -sync y -cwd -V -N pskv-worker -t 1-3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("qsub -sync y -cwd -V -N pskv-server -t 1-2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("export DMLC_ROLE=worker"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("export DMLC_TASK_ID=$((SGE_TASK_ID - 1))"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exec prog 'x y'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[scheduler]"), std::string::npos) << r.out;
}

TEST(LauncherDryRun, Yarn) {
  RunResult r = Launch({"-n", "2", "-s", "1", "--launcher", "yarn", "--dry-run", "--", "prog"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("distributedshell.Client"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-num_containers 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-shell_env DMLC_ROLE=worker"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-shell_env DMLC_ROLE=server"), std::string::npos) << r.out;
}

TEST(LauncherDryRun, SlurmAndMpi) {
  RunResult r = Launch({"-n", "2", "-s", "1", "--launcher", "slurm", "--dry-run", "--", "prog"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("srun --ntasks=2 --job-name=pskv-worker --export=ALL,"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("DMLC_ROLE=worker"), std::string::npos) << r.out;
  r = Launch({"-n", "2", "-s", "1", "--launcher", "mpi", "--dry-run", "--", "prog"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("mpirun -n 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-x DMLC_ROLE=worker"), std::string::npos) << r.out;
}

// mpi and slurm start each server (spares last) as a command of its own, so that one
// server's death ends only its own mpirun or srun step (issue 42, hole 1); the workers
// stay one command. sge and yarn, whose servers are one array job or application that
// reports nothing, refuse a replicated job.
TEST(LauncherDryRun, MpiAndSlurmStartEachServerAlone) {
  auto lines = [](const std::string& out, const std::string& prefix) {
    std::vector<std::string> v;
    std::istringstream in(out);
    for (std::string l; std::getline(in, l);)
      if (l.rfind(prefix, 0) == 0) v.push_back(l);
    return v;
  };
  RunResult r = Launch({"-n", "2", "-s", "3", "--spare-servers", "1", "--env", "PSKV_REPLICAS=1",
                        "--launcher", "mpi", "-H", "a:1,b:1", "--dry-run", "--", "prog"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(lines(r.out, "[servers]").empty()) << r.out;
  for (int s = 0; s < 4; ++s) {
    auto l = lines(r.out, "[server " + std::to_string(s) + "] ");
    ASSERT_EQ(l.size(), 1u) << r.out;
    EXPECT_NE(l[0].find("mpirun -n 1 --oversubscribe"), std::string::npos) << l[0];
    EXPECT_NE(l[0].find(std::string("--host ") + (s % 2 ? "b" : "a") + " "), std::string::npos)
        << "round-robin over the hosts: " << l[0];
    EXPECT_NE(l[0].find("-x DMLC_TASK_ID=" + std::to_string(2 + s) + " "), std::string::npos)
        << l[0];
    EXPECT_EQ(l[0].find("PSKV_SPARE_SERVER=1") != std::string::npos, s == 3) << l[0];
  }
  auto w = lines(r.out, "[workers] ");
  ASSERT_EQ(w.size(), 1u) << r.out;
  EXPECT_NE(w[0].find("mpirun -n 2 --oversubscribe"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("--host a:1,b:1"), std::string::npos) << w[0];

  r = Launch({"-n", "2", "-s", "2", "--launcher", "slurm", "--dry-run", "--", "prog"});
  ASSERT_EQ(r.status, 0) << r.out;
  for (int s = 0; s < 2; ++s) {
    auto l = lines(r.out, "[server " + std::to_string(s) + "] ");
    ASSERT_EQ(l.size(), 1u) << r.out;
    EXPECT_NE(l[0].find("srun --ntasks=1 --job-name=pskv-server --export=ALL,"), std::string::npos)
        << l[0];
    EXPECT_NE(l[0].find(",DMLC_TASK_ID=" + std::to_string(2 + s) + ","), std::string::npos) << l[0];
  }
  w = lines(r.out, "[workers] ");
  ASSERT_EQ(w.size(), 1u) << r.out;
  EXPECT_NE(w[0].find("srun --ntasks=2 --job-name=pskv-worker"), std::string::npos) << w[0];

  for (std::string launcher : {"sge", "yarn"}) {
    r = Launch({"-n", "2", "-s", "2", "--launcher", launcher, "--env-server", "PSKV_REPLICAS=1",
                "--dry-run", "--", "prog"});
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("PSKV_REPLICAS=1 cannot work with --launcher " + launcher),
              std::string::npos)
        << r.out;
    r = Launch({"-n", "2", "-s", "2", "--launcher", launcher, "--dry-run", "--", "prog"}, 30s,
               {{"PSKV_REPLICAS", "2"}});
    EXPECT_EQ(r.status, 2) << r.out;
    r = Launch({"-n", "2", "-s", "2", "--launcher", launcher, "--env", "PSKV_REPLICAS=0",
                "--dry-run", "--", "prog"});
    EXPECT_EQ(r.status, 0) << r.out;
  }
}

// ------------------------------------------------------------------ the CLI (CLI11)

TEST(LauncherCli, VersionAndOptEqualsValue) {
  RunResult r = Launch({"--version"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("pskv-launch 0."), std::string::npos) << r.out;
  r = Launch({"--num-workers=1", "--num-servers=1", "--dry-run", "--env=A=1", "--launcher=local",
              "--", "prog"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[worker 0] "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("A=1"), std::string::npos) << r.out;
  r = Launch({"-n", "1", "--bogus", "--", "prog"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("unknown option '--bogus'"), std::string::npos) << r.out;
  r = Launch({"-n", "x", "--", "prog"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("num-workers"), std::string::npos) << r.out;
}

// The ssh host of each process, from a --dry-run of the ssh launcher.
static std::map<std::string, std::string> SshHosts(const std::string& out) {
  std::map<std::string, std::string> host;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[", 0) != 0 || line.find("] ssh ") == std::string::npos) continue;
    std::string name = line.substr(1, line.find(']') - 1);
    std::istringstream words(line.substr(line.find("] ssh ") + 6));
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    // ssh -o .. -o .. -p PORT HOST 'bash -c ...'
    for (size_t i = 0; i + 2 < w.size(); ++i)
      if (w[i] == "-p") host[name] = w[i + 2] + ":" + w[i + 1];
  }
  return host;
}

TEST(LauncherCli, HostListWithSlotsPlacesWorkersLikeHorovodrun) {
  RunResult r = Launch({"-n", "5", "-s", "2", "-H", "hostA:2,hostB:3", "--dry-run", "--", "prog"});
  ASSERT_EQ(r.status, 0) << r.out;
  auto h = SshHosts(r.out);
  EXPECT_EQ(h["worker 0"], "hostA:22");
  EXPECT_EQ(h["worker 1"], "hostA:22");
  EXPECT_EQ(h["worker 2"], "hostB:22");
  EXPECT_EQ(h["worker 4"], "hostB:22");
  EXPECT_EQ(h["server 0"], "hostA:22");  // servers round-robin, no slots
  EXPECT_EQ(h["server 1"], "hostB:22");
  r = Launch({"-n", "6", "-H", "hostA:2,hostB:3", "--dry-run", "--", "prog"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("6 workers but the hosts have 5 slots (hostA:2,hostB:3)"), std::string::npos)
      << r.out;
}

TEST(LauncherCli, HostFileSlotsAndSshPorts) {
  std::string dir = TmpDir("slots");
  std::ofstream(dir + "/hosts") << "# comment\nnodeA:2222 slots=1\nnodeB slots=2  # two\n";
  RunResult r = Launch({"-n", "3", "-s", "1", "-H", dir + "/hosts", "--ssh-port", "2200",
                        "--dry-run", "--", "prog"});
  ASSERT_EQ(r.status, 0) << r.out;
  auto h = SshHosts(r.out);
  EXPECT_EQ(h["worker 0"], "nodeA:2222");
  EXPECT_EQ(h["worker 1"], "nodeB:2200");
  EXPECT_EQ(h["worker 2"], "nodeB:2200");
  std::ofstream(dir + "/bad") << "nodeA slot=2\n";
  r = Launch({"-n", "1", "-H", dir + "/bad", "--dry-run", "--", "prog"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("line 1: unknown attribute 'slot=2'"), std::string::npos) << r.out;
  // mpi: a list becomes Open MPI's --host with the same slots
  r = Launch(
      {"-n", "2", "-s", "1", "--launcher", "mpi", "-H", "a:1,b:1", "--dry-run", "--", "prog"});
  EXPECT_NE(r.out.find("--host a:1,b:1"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

TEST(LauncherCli, LogDirSummaryAndTimestamps) {
  std::string dir = TmpDir("logs");
  RunResult r = Launch({"-n", "2", "-s", "1", "--timeout", "100", "--log-dir", dir + "/logs", "--",
                        DIST_WORKER, "sync", "2"});
  ASSERT_EQ(r.status, 0) << r.out;
  for (auto f : {"scheduler.log", "server-0.log", "worker-0.log", "worker-1.log", "launcher.log"})
    EXPECT_TRUE(std::filesystem::exists(dir + "/logs/" + f)) << f;
  std::string w1 = ReadFile(dir + "/logs/worker-1.log");
  EXPECT_NE(w1.find("worker 1: all checks passed"), std::string::npos) << w1;
  EXPECT_EQ(w1.find("worker 0: all"), std::string::npos) << "one process per file";
  // Log lines carry a full UTC timestamp; console lines the time of day.
  EXPECT_TRUE(std::regex_search(w1, std::regex(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z )")))
      << w1;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\d\d:\d\d:\d\d\.\d{3} \[worker 1\] )")))
      << r.out;
  // The summary: every process, success headline.
  EXPECT_NE(r.out.find("job succeeded in"), std::string::npos) << r.out;
  for (auto p : {"scheduler", "server 0", "worker 0", "worker 1"})
    EXPECT_TRUE(std::regex_search(r.out, std::regex(std::string(p) + R"( +\d+  exited 0 )")))
        << p << "\n"
        << r.out;
  EXPECT_NE(ReadFile(dir + "/logs/launcher.log").find("job succeeded"), std::string::npos);
  // The library's own tag is not repeated after the launcher's prefix.
  EXPECT_EQ(r.out.find("[scheduler] [scheduler]"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

TEST(LauncherCli, FailureShowsEachLineOnceAndNamesTheProcessInTheSummary) {
  std::string dir = TmpDir("once");
  RunResult r = Launch(
      {"-n", "2", "-s", "1", "--timeout", "100", "--log-dir", dir, "--", DIST_WORKER, "exit3"});
  EXPECT_EQ(r.status, 3) << r.out;
  size_t n = 0;
  for (size_t at = 0;
       (at = r.out.find("worker 1 exits with status 3 now", at)) != std::string::npos; ++at)
    ++n;
  EXPECT_EQ(n, 1u) << r.out;
  EXPECT_NE(r.out.find("full log: " + dir + "/worker-1.log"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("job FAILED (exit status 3)"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(worker 1 +\d+  exited 3  <-- failed)")))
      << r.out;
  std::filesystem::remove_all(dir);
}

// One logging facility with levels per module (PSKV_LOG_LEVEL), for the nodes and
// the launcher alike; a malformed value is an error naming the variable.
TEST(LauncherCli, LogLevelsPerModule) {
  RunResult r = Launch({"-n", "1", "-s", "1", "--timeout", "100", "--", DIST_WORKER, "sync", "1"},
                       120s, {{"PS_VERBOSE", "1"}, {"PSKV_LOG_LEVEL", "warn,ps=info"}});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("registered; id"), std::string::npos) << r.out;  // ps: info
  EXPECT_EQ(r.out.find(": optimizer "), std::string::npos) << r.out;    // kvstore: warn
  EXPECT_EQ(r.out.find("job succeeded"), std::string::npos) << r.out;   // launcher: warn
  r = Launch({"-n", "1", "-s", "1", "--timeout", "100", "--", DIST_WORKER, "sync", "1"}, 120s,
             {{"PS_VERBOSE", "1"}, {"PSKV_LOG_LEVEL", "info,launcher=error"}});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(": optimizer "), std::string::npos) << r.out;
  r = Launch({"-n", "1", "--", "prog"}, 30s, {{"PSKV_LOG_LEVEL", "loud"}});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("PSKV_LOG_LEVEL='loud': unknown level 'loud'"), std::string::npos) << r.out;
}
