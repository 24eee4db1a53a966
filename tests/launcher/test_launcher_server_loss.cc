// A job whose servers replicate goes on when a server process dies, as long as the
// scheduler's status records say that it survived it (launcher/server_loss.h); the
// launcher stops the job when the scheduler fails it, when no verdict comes in time,
// and for any death without replication. Supervise with stand-in children (shell
// scripts) sending records on their status sockets; the real job through pskv-launch
// is in tests/distributed/test_failover_launch.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launcher/process.h"
#include "launcher/server_loss.h"
#include "support/status_standin.h"

using namespace pskv;
using namespace pskv::launcher;
using namespace pskv::test;
using namespace std::chrono_literals;

namespace {

StandinOutcome RunJob(const std::vector<ChildSpec>& specs,
                      std::chrono::milliseconds timeout = 30s) {
  return RunStandins(specs, timeout);
}

const std::string kReplicated = "phase=running replicas=1 detect_ms=1000";

// A server that reports its rank, then is killed after `after` seconds.
ChildSpec Server(int rank, const std::string& after) {
  const std::string n = std::to_string(rank);
  return Script("server " + n,
                Send("server." + n, "phase=running") + "sleep " + after + "; kill -9 $$");
}

ChildSpec Worker(int rank, const std::string& secs) {
  const std::string n = std::to_string(rank);
  return Script("worker " + n, Send("worker." + n, "phase=running") + "sleep " + secs + "; " +
                                   Send("worker." + n, "phase=finished") + "exit 0");
}

}  // namespace

// Server 1 is killed; the scheduler then lists it as departed: the job goes on and
// ends with exit status 0, the summary naming the server it survived.
TEST(SuperviseServerLoss, ADeadServerTheSchedulerSurvivedDoesNotStopTheJob) {
  auto o = RunJob({
      // Each step is 0.8 s or more after the one it must follow, for loaded cores.
      Script("scheduler", Send("scheduler.0", kReplicated) + "sleep 2; " +
                              Send("scheduler.0", kReplicated + " departed=server.1") +
                              "sleep 1.5; exit 0"),
      Script("server 0", Send("server.0", "phase=running") + "sleep 3.5; exit 0"),
      Server(1, "0.8"),
      Worker(0, "3.5"),
  });
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_TRUE(o.results[2].survived);
  EXPECT_EQ(o.results[2].status, 128 + SIGKILL);
  EXPECT_NE(o.err.find("server 1 (pid " + std::to_string(o.results[2].pid) +
                       ") was killed by signal 9 (Killed); waiting for the scheduler's verdict"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("the job goes on without it"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("job succeeded in"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("surviving the loss of server 1"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("killed by SIGKILL (survived)"), std::string::npos) << o.err;
}

// Server 1 is killed; the scheduler lists it as departed, then spare server 2 as
// joined (it took over the copies of the ranges left short of one): the launcher says
// so when it learns it, and the summary names the spare.
TEST(SuperviseServerLoss, ASpareThatJoinedIsNamed) {
  auto o = RunJob({
      Script("scheduler",
             Send("scheduler.0", kReplicated) + "sleep 2; " +
                 Send("scheduler.0", kReplicated + " departed=server.1") + "sleep 0.8; " +
                 Send("scheduler.0", kReplicated + " departed=server.1 joined=server.2") +
                 "sleep 1.5; exit 0"),
      Script("server 0", Send("server.0", "phase=running") + "sleep 4.3; exit 0"),
      Server(1, "0.8"),
      Script("server 2", Send("server.2", "phase=running") + "sleep 4.3; exit 0"),
      Worker(0, "4.3"),
  });
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_NE(o.err.find("server 2 (pid " + std::to_string(o.results[3].pid) +
                       "), a spare server, joined the key ranges left short of a copy"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("surviving the loss of server 1 (key ranges moved to replicas; server 2 "
                       "(pid " +
                       std::to_string(o.results[3].pid) + "), a spare, joined)"),
            std::string::npos)
      << o.err;
}

// Both servers die; the scheduler fails the job naming the ranges lost: the launcher
// stops it with that message (not a worker's or a server's own words).
TEST(SuperviseServerLoss, TheSchedulersFailureNamesTheRangesLost) {
  auto o = RunJob({
      Script("scheduler",
             Send("scheduler.0", kReplicated) + "sleep 2.5; " +
                 Send("scheduler.0",
                      "phase=failed replicas=1 detect_ms=1000 departed=server.0 "
                      "kind=NodeFailure msg=server%5B1%5D%20is%20dead%20%28no%20live%20copy%20"
                      "left%20of%20key%20ranges%200,%201%29") +
                 "sleep 30"),
      Server(0, "0.8"),
      Server(1, "1.0"),
      Worker(0, "30"),
  });
  EXPECT_EQ(o.status, 128 + SIGKILL) << o.err;
  EXPECT_NE(o.err.find("and the scheduler failed the job: NodeFailure: server[1] is dead (no "
                       "live copy left of key ranges 0, 1); stopping the job"),
            std::string::npos)
      << o.err;
  EXPECT_LT(o.seconds, 10) << "stopped when the scheduler said so";
}

// No verdict within the scheduler's detection bound (plus the slack): the job stops.
TEST(SuperviseServerLoss, NoVerdictInTimeStopsTheJob) {
  auto o = RunJob({
      Script("scheduler", Send("scheduler.0", kReplicated) + "sleep 30"),
      Script("server 0", Send("server.0", "phase=running") + "sleep 30"),
      Server(1, "0.8"),
      Worker(0, "30"),
  });
  EXPECT_EQ(o.status, 128 + SIGKILL) << o.err;
  EXPECT_NE(o.err.find("and the scheduler did not say within 6 s whether the job survives it"),
            std::string::npos)
      << o.err;
  const double bound = 0.3 + 1 + ServerLosses::kVerdictSlack.count() / 1000.0;
  EXPECT_GT(o.seconds, bound - 0.5) << o.err;
  EXPECT_LT(o.seconds, bound + 5) << o.err;
}

// Without replication (no `replicas` in the scheduler's records) a dead server stops
// the job at once, as does a dead worker in a replicated job.
TEST(SuperviseServerLoss, WithoutReplicasOrForAWorkerTheJobStopsAtOnce) {
  auto o = RunJob({
      Script("scheduler", Send("scheduler.0", "phase=running detect_ms=1000") + "sleep 30"),
      Server(0, "0.8"),
      Worker(0, "30"),
  });
  EXPECT_EQ(o.status, 128 + SIGKILL) << o.err;
  EXPECT_NE(o.err.find("server 0 (pid " + std::to_string(o.results[1].pid) +
                       ") was killed by signal 9 (Killed); stopping the job"),
            std::string::npos)
      << o.err;
  EXPECT_LT(o.seconds, 5);

  auto w = RunJob({
      Script("scheduler", Send("scheduler.0", kReplicated) + "sleep 30"),
      Script("server 0", Send("server.0", "phase=running") + "sleep 30"),
      Script("worker 0", Send("worker.0", "phase=running") + "sleep 0.3; exit 3"),
  });
  EXPECT_EQ(w.status, 3) << w.err;
  EXPECT_NE(w.err.find("worker 0 (pid " + std::to_string(w.results[2].pid) +
                       ") exited with status 3; stopping the job"),
            std::string::npos)
      << w.err;
  EXPECT_LT(w.seconds, 5);

  // A server that died before it reported a rank was never part of the job.
  auto e = RunJob({
      Script("scheduler", Send("scheduler.0", kReplicated) + "sleep 30"),
      Script("server 0", "sleep 0.3; exit 4"),
      Worker(0, "30"),
  });
  EXPECT_EQ(e.status, 4) << e.err;
  EXPECT_LT(e.seconds, 5);
}

// A server the scheduler declared dead while its process still runs (frozen, cut off)
// is out of the job: the launcher stops it, and the job ends when the others do.
TEST(SuperviseServerLoss, ARunningServerDeclaredDeadIsStopped) {
  auto o = RunJob({
      Script("scheduler", Send("scheduler.0", kReplicated) + "sleep 0.5; " +
                              Send("scheduler.0", kReplicated + " departed=server.1") +
                              "sleep 1.5; exit 0"),
      Script("server 0", Send("server.0", "phase=running") + "sleep 2; exit 0"),
      Script("server 1", Send("server.1", "phase=running") + "sleep 60"),
      Worker(0, "2"),
  });
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_TRUE(o.results[2].survived);
  EXPECT_TRUE(o.results[2].stopped_by_us);
  EXPECT_NE(o.err.find("server 1 (pid " + std::to_string(o.results[2].pid) +
                       ") was declared dead by the scheduler, which goes on without it: "
                       "stopping it"),
            std::string::npos)
      << o.err;
  EXPECT_LT(o.seconds, 10);
}

// After the job's end (the scheduler reported finished: every node passed the final
// barrier) a server's death fails nothing, replicated or not, and a worker still
// running its own code after close() is left to finish it (issue 42, hole 7).
TEST(SuperviseServerLoss, AServerDeathAfterTheJobsEndFailsNothing) {
  for (const std::string& job : {kReplicated, std::string("phase=running detect_ms=1000")}) {
    const std::string finished = "phase=finished" + job.substr(job.find(' '));
    auto o = RunJob({
        Script("scheduler",
               Send("scheduler.0", job) + "sleep 0.5; " + Send("scheduler.0", finished) + "exit 0"),
        // Killed 1 s after the scheduler exited 0.
        Script("server 0", Send("server.0", "phase=running") + "sleep 0.5; " +
                               Send("server.0", "phase=finished") + "sleep 1.5; kill -9 $$"),
        // Its code after close() runs 3 s more.
        Script("worker 0", Send("worker.0", "phase=running") + "sleep 0.5; " +
                               Send("worker.0", "phase=finished") + "sleep 3; exit 0"),
    });
    EXPECT_EQ(o.status, 0) << job << "\n" << o.err;
    EXPECT_TRUE(o.results[1].after_end) << o.err;
    EXPECT_FALSE(o.results[1].survived) << o.err;
    EXPECT_FALSE(o.results[2].stopped_by_us) << "the worker's code after close() was stopped";
    EXPECT_EQ(o.results[2].status, 0) << o.err;
    EXPECT_GT(o.results[2].seconds, 3) << o.err;
    EXPECT_NE(o.err.find("server 0 (pid " + std::to_string(o.results[1].pid) +
                         ") was killed by signal 9 (Killed) after the job had finished"),
              std::string::npos)
        << o.err;
    EXPECT_NE(o.err.find("job succeeded in"), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("(server 0 died after its end, which fails nothing)"), std::string::npos)
        << o.err;
    EXPECT_NE(o.err.find("killed by SIGKILL (after the end)"), std::string::npos) << o.err;
  }
}

// The same for the scheduler killed after it reported the job finished (its linger),
// and for a server that exits non-zero then. A worker's failure after close() still
// fails the job: it is the worker's own code.
TEST(SuperviseServerLoss, AfterTheEndOnlyAWorkersFailureCounts) {
  auto o = RunJob({
      Script("scheduler", Send("scheduler.0", kReplicated) + "sleep 0.5; " +
                              Send("scheduler.0", "phase=finished replicas=1 detect_ms=1000") +
                              "sleep 0.8; kill -9 $$"),
      Script("server 0", Send("server.0", "phase=running") + "sleep 0.5; " +
                             Send("server.0", "phase=finished") + "sleep 1.5; exit 3"),
      Script("worker 0", Send("worker.0", "phase=running") + "sleep 0.5; " +
                             Send("worker.0", "phase=finished") + "sleep 2.5; exit 0"),
  });
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_TRUE(o.results[0].after_end) << o.err;
  EXPECT_TRUE(o.results[1].after_end) << o.err;
  EXPECT_EQ(o.results[1].status, 3) << o.err;
  EXPECT_NE(o.err.find("exited 3 (after the end)"), std::string::npos) << o.err;

  auto w = RunJob({
      Script("scheduler", Send("scheduler.0", kReplicated) + "sleep 0.5; " +
                              Send("scheduler.0", "phase=finished replicas=1 detect_ms=1000") +
                              "exit 0"),
      Script("server 0", Send("server.0", "phase=running") + "sleep 0.5; exit 0"),
      Script("worker 0", Send("worker.0", "phase=running") + "sleep 0.5; " +
                             Send("worker.0", "phase=finished") + "sleep 1; exit 5"),
  });
  EXPECT_EQ(w.status, 5) << w.err;
  EXPECT_FALSE(w.results[2].after_end);
}

// A server whose death awaits the scheduler's verdict when the scheduler reports the
// job finished (it died at the final barrier's end): the end is the verdict.
TEST(SuperviseServerLoss, APendingDeathAtTheEndIsAfterIt) {
  auto o = RunJob({
      Script("scheduler", Send("scheduler.0", kReplicated) + "sleep 1.8; " +
                              Send("scheduler.0", "phase=finished replicas=1 detect_ms=1000") +
                              "exit 0"),
      Script("server 0", Send("server.0", "phase=running") + "sleep 2; exit 0"),
      Server(1, "0.8"),
      Worker(0, "2"),
  });
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_TRUE(o.results[2].after_end) << o.err;
  EXPECT_NE(o.err.find("waiting for the scheduler's verdict"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("; the job finished without it (the scheduler released every node from "
                       "the final barrier): not a failure"),
            std::string::npos)
      << o.err;
}

// A death awaiting the scheduler's verdict when the last process exits (here the
// scheduler, which said nothing about it) is decided then: the job fails. (It ended
// with exit status 0 before: the loop ended before the verdict was asked for.)
TEST(SuperviseServerLoss, APendingDeathIsDecidedWhenTheLastProcessExits) {
  auto o = RunJob({
      Script("scheduler", Send("scheduler.0", kReplicated) + "sleep 2; exit 0"),
      Script("server 0", Send("server.0", "phase=running") + "sleep 1; exit 0"),
      Server(1, "0.5"),
      Worker(0, "1"),
  });
  EXPECT_EQ(o.status, 128 + SIGKILL) << o.err;
  EXPECT_NE(o.err.find(", and the scheduler exited before it said whether the job survives it"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("job FAILED"), std::string::npos) << o.err;
}

// Elastic workers (PSKV_ELASTIC, pskv-launch --min-workers): worker 1 is killed; the
// scheduler lists it as departed: the job goes on and succeeds, naming the worker.
TEST(SuperviseWorkerLoss, ADeadWorkerTheSchedulerDroppedDoesNotStopTheJob) {
  const std::string job = "phase=running detect_ms=1000";
  auto o = RunStandins(
      {
          Script("scheduler", Send("scheduler.0", job) + "sleep 2; " +
                                  Send("scheduler.0", job + " departed=worker.1") +
                                  "sleep 1.5; exit 0"),
          Script("server 0", Send("server.0", "phase=running") + "sleep 3.5; exit 0"),
          Worker(0, "3.5"),
          Script("worker 1", Send("worker.1", "phase=running") + "sleep 0.8; kill -9 $$"),
      },
      30s, /*elastic_workers=*/true);
  EXPECT_EQ(o.status, 0) << o.err;
  EXPECT_TRUE(o.results[3].survived);
  EXPECT_NE(o.err.find("waiting for the scheduler's verdict: does the job go on without it "
                       "(PSKV_ELASTIC)?"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("the scheduler dropped it (PSKV_ELASTIC)"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("surviving the loss of worker 1 (workers dropped: PSKV_ELASTIC)"),
            std::string::npos)
      << o.err;
}

// The same death without elastic workers ends the job at once (the default: MXNet's
// strict rounds), whatever the scheduler says later.
TEST(SuperviseWorkerLoss, ADeadWorkerStopsAStrictJob) {
  const std::string job = "phase=running detect_ms=1000";
  auto o = RunStandins(
      {
          Script("scheduler", Send("scheduler.0", job) + "sleep 2; " +
                                  Send("scheduler.0", job + " departed=worker.1") + "sleep 30"),
          Script("server 0", Send("server.0", "phase=running") + "sleep 30"),
          Worker(0, "30"),
          Script("worker 1", Send("worker.1", "phase=running") + "sleep 0.8; kill -9 $$"),
      },
      30s);
  EXPECT_NE(o.status, 0) << o.err;
  EXPECT_LT(o.seconds, 10) << o.err;
}
