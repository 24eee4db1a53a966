// The launcher names the process that hung from the processes' status records
// (launcher/status_board.h), never from their log text: the blame rules on their own,
// and Supervise with stand-in children (shell scripts) that send records on their
// status socket or as tagged output lines, print misleading log text, or send
// malformed and oversized records.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "launcher/process.h"
#include "launcher/status_board.h"
#include "support/status_standin.h"

using namespace pskv;
using namespace pskv::launcher;
using namespace pskv::test;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kJob = {"scheduler", "server 0", "worker 0", "worker 1"};

StandinOutcome RunJob(const std::vector<ChildSpec>& specs,
                      std::chrono::milliseconds timeout = 1500ms) {
  return RunStandins(specs, timeout);
}

}  // namespace

TEST(StatusBoard, BlamesTheEndOfTheChainOfWaits) {
  StatusBoard b(kJob);
  // worker 0 waits for server 0, which waits for worker 1, which runs: worker 1 hung.
  ASSERT_TRUE(b.Add(2, Rec("worker.0", "phase=waiting wait=wait missing=server.0")));
  ASSERT_TRUE(b.Add(1, Rec("server.0", "phase=waiting missing=worker.1")));
  ASSERT_TRUE(b.Add(3, Rec("worker.1", "phase=running")));
  auto h = b.Hung({true, true, true, true}, std::nullopt);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->hung, 3u);
  EXPECT_EQ(h->node, "worker 1");
  EXPECT_EQ(h->by, "server 0");
  // From worker 0's failure: the same chain.
  h = b.Hung({true, true, false, true}, 2);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->node, "worker 1");
  // A process that exited is not hung; nobody else is waited for.
  EXPECT_FALSE(b.Hung({true, true, true, false}, std::nullopt));
  EXPECT_EQ(b.Describe(2), "waiting for server 0 (wait, 0 s)");
  EXPECT_EQ(b.Describe(3), "running");
  EXPECT_EQ(b.Describe(0), "");
}

TEST(StatusBoard, ACycleBlamesTheMostWaitedForAndAFailureItsCulprit) {
  StatusBoard b(kJob);
  b.Add(0, Rec("scheduler.0", "phase=waiting missing=worker.1"));
  b.Add(2, Rec("worker.0", "phase=waiting missing=worker.1"));
  b.Add(3, Rec("worker.1", "phase=waiting missing=worker.0"));
  auto h = b.Hung({true, true, true, true}, std::nullopt);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->node, "worker 1");  // two wait for it, one for worker 0

  StatusBoard f(kJob);
  f.Add(2, Rec("worker.0",
               "phase=failed kind=NodeFailure msg=worker%5B1%5D%20is%20dead missing=worker.1"));
  h = f.Hung({true, true, false, true}, 2);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->node, "worker 1");
  EXPECT_EQ(f.Describe(2), "failed: NodeFailure: worker[1] is dead");
}

TEST(StatusBoard, GroupsAndEarlyRecords) {
  StatusBoard b({"scheduler", "servers", "workers"});
  b.Add(2, Rec("worker.-1", "phase=registering"));
  b.Add(2, Rec("worker.0", "phase=waiting missing=server.1"));
  b.Add(1, Rec("server.1", "phase=running"));
  auto h = b.Hung({true, true, true}, std::nullopt);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->hung, 1u);
  EXPECT_EQ(h->node, "server 1");
  EXPECT_EQ(h->by, "worker 0");
  // Nodes named by nobody that reported resolve to their role's group.
  StatusBoard g({"scheduler", "servers", "workers"});
  g.Add(0, Rec("scheduler.0", "phase=waiting missing=worker.3"));
  h = g.Hung({true, true, true}, std::nullopt);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->hung, 2u);
  EXPECT_EQ(h->node, "worker 3");
}

// Only the scheduler's own child speaks for the scheduler: a worker printing a forged
// scheduler record (ssh mode passes records as output lines) is not read as its verdict.
TEST(StatusBoard, TheSchedulerIsReadOnlyFromItsOwnChild) {
  StatusBoard b(kJob);
  ASSERT_TRUE(b.Add(2, Rec("scheduler.0", "phase=failed kind=NodeFailure")));
  EXPECT_FALSE(b.Scheduler());
  ASSERT_TRUE(b.Add(0, Rec("scheduler.0", "phase=running replicas=1")));
  auto s = b.Scheduler();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->first, 0u);
  EXPECT_EQ(s->second->phase, StatusPhase::kRunning);
  // Without a child of its own (one command for the whole job), any child's counts.
  StatusBoard g({"job"});
  ASSERT_TRUE(g.Add(0, Rec("scheduler.0", "phase=running")));
  EXPECT_TRUE(g.Scheduler());
}

TEST(StatusBoard, MalformedRecordsAreIgnored) {
  StatusBoard b(kJob);
  EXPECT_FALSE(b.Add(2, "@pskv-status/1 role=worker rank=0 phase=waiting missing=worker.1,"));
  EXPECT_FALSE(b.Add(2, "@pskv-status/2 role=worker rank=0 phase=waiting missing=worker.1"));
  EXPECT_FALSE(b.Add(2, "waiting for worker[1]"));
  EXPECT_FALSE(b.Add(9, Rec("worker.0", "phase=waiting missing=worker.1")));  // no such child
  EXPECT_EQ(b.ignored(), 4u);
  EXPECT_FALSE(b.Hung({true, true, true, true}, std::nullopt));
}

// The acceptance test of the status channel: worker 1 hangs (it never sends a thing);
// worker 0's status says it waits for worker 1, while the log text of every process
// names others (what a regex over log lines would have blamed).
TEST(SuperviseStatus, AHungProcessIsNamedFromStatusNotFromLogText) {
  auto o = RunJob({
      Script("scheduler",
             "echo 'scheduler: barrier of group 4: waiting for worker[2] for 9 s'; "
             "sleep 30"),
      Script("worker 0", "send '" + Rec("worker.0", "phase=waiting wait=push missing=worker.1") +
                             "'; echo 'waiting for server[0]: cannot reach worker[2], "
                             "worker[2] is dead'; sleep 30"),
      Script("worker 1", "sleep 30"),
      Script("worker 2", "echo 'waiting for worker[2] waiting for worker[2]'; sleep 30"),
  });
  EXPECT_EQ(o.status, 124) << o.err;
  EXPECT_NE(o.err.find("worker 1 (pid " + std::to_string(o.results[2].pid) +
                       ") appears hung: worker 0 was waiting for it"),
            std::string::npos)
      << o.err;
  EXPECT_EQ(o.err.find("worker 2 (pid"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("worker 0: waiting for worker 1 (push, 0 s)"), std::string::npos) << o.err;
  EXPECT_EQ(o.results[1].status_text, "waiting for worker 1 (push, 0 s)");
}

TEST(SuperviseStatus, MalformedAndOversizedRecordsAreIgnored) {
  // Valid but for its size; the text first, so that no prefix of it is a record either
  // (however the shell splits its writes).
  const std::string oversized = "@pskv-status/1 msg=" + std::string(5000, 'a') +
                                " role=worker rank=0 phase=waiting missing=worker.1";
  auto o = RunJob({
      Script("worker 0", "send 'garbage'; send '" + oversized +
                             "'; send '@pskv-status/2 role=worker "
                             "rank=0 phase=waiting missing=worker.1'; send '" +
                             Rec("worker.0", "phase=waiting missing=worker.1,") + "'; send '" +
                             Rec("worker.0", "phase=waiting msg=%ZZ missing=worker.1") +
                             "'; sleep 30"),
      Script("worker 1", "sleep 30"),
  });
  EXPECT_EQ(o.status, 124) << o.err;
  EXPECT_EQ(o.err.find("appears hung"), std::string::npos) << o.err;
  EXPECT_EQ(o.results[0].status_text, "") << "no record was valid";
}

// Remote children (ssh, mpi, slurm) send records as tagged lines of their output: they
// are parsed as records (and not shown as output); a local child's tagged output line
// is text, so a program cannot forge its status by printing.
TEST(SuperviseStatus, TaggedLinesAreRecordsOnlyForRemoteChildren) {
  const std::string rec = Rec("worker.0", "phase=waiting missing=worker.1");
  auto o = RunJob({
      Script("worker 0",
             "echo 'before'; echo '" + rec + "' >&2; echo '@pskv-status/1 bad'; sleep 30",
             StatusVia::kOutput),
      Script("worker 1", "sleep 30", StatusVia::kOutput),
  });
  EXPECT_EQ(o.status, 124) << o.err;
  EXPECT_NE(o.err.find("worker 1 (pid"), std::string::npos) << o.err;
  ASSERT_EQ(o.results[0].last_lines.size(), 1u);
  EXPECT_EQ(o.results[0].last_lines[0], "before");

  auto forged = RunJob({
      Script("worker 0", "echo '" + rec + "'; sleep 30"),
      Script("worker 1", "sleep 30"),
  });
  EXPECT_EQ(forged.status, 124) << forged.err;
  EXPECT_EQ(forged.err.find("appears hung"), std::string::npos) << forged.err;
  ASSERT_EQ(forged.results[0].last_lines.size(), 1u);
  EXPECT_EQ(forged.results[0].last_lines[0], rec);
}

// A child that failed: the headline follows its own last record (whom it blamed).
TEST(SuperviseStatus, AFailedProcessPointsAtTheOneItWaitedFor) {
  auto o = RunJob(
      {
          Script("worker 0", "send '" +
                                 Rec("worker.0",
                                     "phase=failed kind=TimeoutError msg=no%20answer "
                                     "missing=server.0") +
                                 "'; exit 3"),
          Script("server 0", "sleep 30"),
      },
      20s);
  EXPECT_EQ(o.status, 3) << o.err;
  EXPECT_NE(o.err.find("server 0 (pid " + std::to_string(o.results[1].pid) +
                       ") appears hung: worker 0 was waiting for it; worker 0 (pid " +
                       std::to_string(o.results[0].pid) + ") exited with status 3"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.err.find("worker 0: failed: TimeoutError: no answer"), std::string::npos) << o.err;
}
