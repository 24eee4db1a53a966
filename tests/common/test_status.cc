// Status records (common/status_record.h) and a node's StatusReporter
// (common/status_reporter.h): the codec round-trips, refuses every malformed or
// oversized record, and the reporter's records follow its waits.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/status_record.h"
#include "common/status_reporter.h"
#include "pskv/error.h"

using namespace pskv;
using namespace std::chrono_literals;

namespace {

StatusRecord Full() {
  StatusRecord r;
  r.role = "worker";
  r.rank = 3;
  r.host = "10.0.0.2";
  r.pid = 4242;
  r.phase = StatusPhase::kWaiting;
  r.wait = "sync round of key 7";
  r.missing = {{"server", 0}, {"worker", 1}, {"scheduler", 0}};
  r.more = 2;
  r.waited_ms = 4000;
  return r;
}

// Reads every packet waiting on `fd`.
std::vector<std::string> Packets(int fd) {
  std::vector<std::string> out;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0;)
    out.emplace_back(buf, static_cast<size_t>(n));
  return out;
}

struct SocketPair {
  int fd[2] = {-1, -1};
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fd), 0); }
  ~SocketPair() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  std::string spec() const { return "fd:" + std::to_string(fd[1]); }
};

}  // namespace

TEST(StatusRecord, RoundTrips) {
  StatusRecord r = Full();
  const std::string line = EncodeStatus(r);
  EXPECT_EQ(line.rfind(kStatusTag, 0), 0u) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(DecodeStatus(line), r) << line;
  EXPECT_EQ(DecodeStatus(line + "\n"), r);

  StatusRecord f;
  f.role = "scheduler";
  f.rank = 0;
  f.phase = StatusPhase::kFailed;
  f.kind = "NodeFailure";
  f.message = "worker[1] at 127.0.0.1:5 is dead: 100% = \"gone\"\n\tnext line, é";
  f.missing = {{"worker", 1}};
  const std::string fl = EncodeStatus(f);
  EXPECT_EQ(fl.find(' ', fl.find("msg=")), std::string::npos) << "no space inside a value: " << fl;
  EXPECT_EQ(DecodeStatus(fl), f) << fl;

  StatusRecord job;  // the scheduler of a job whose servers replicate, one server lost
  job.role = "scheduler";
  job.rank = 0;
  job.replicas = 2;
  job.detect_ms = 11000;
  job.departed = {{"server", 1}, {"server", 3}};
  job.joined = {{"server", 4}};
  const std::string jl = EncodeStatus(job);
  EXPECT_NE(jl.find(" replicas=2 detect_ms=11000 departed=server.1,server.3 joined=server.4"),
            std::string::npos)
      << jl;
  EXPECT_EQ(DecodeStatus(jl), job) << jl;

  StatusRecord early;  // registering, no rank yet
  early.role = "server";
  early.phase = StatusPhase::kRegistering;
  EXPECT_EQ(DecodeStatus(EncodeStatus(early)), early);
}

TEST(StatusRecord, MalformedOrOversizedRecordsAreRefused) {
  const std::string ok = "@pskv-status/1 role=worker rank=1 phase=running";
  ASSERT_TRUE(DecodeStatus(ok));
  EXPECT_TRUE(DecodeStatus(ok + " future_key=whatever")) << "unknown keys are skipped";
  const std::vector<std::string> bad = {
      "",
      "role=worker rank=1 phase=running",                  // no tag
      "@pskv-status/2 role=worker rank=1 phase=running",   // another version
      "@pskv-status/1  role=worker rank=1 phase=running",  // empty field
      "@pskv-status/1 role=worker rank=1",                 // no phase
      "@pskv-status/1 rank=1 phase=running",               // no role
      "@pskv-status/1 role=admin rank=1 phase=running",    // unknown role
      "@pskv-status/1 role=worker rank=1 phase=sleeping",  // unknown phase
      "@pskv-status/1 role=worker rank=x phase=running",   // bad number
      "@pskv-status/1 role=worker rank=-2 phase=running",  // out of range
      "@pskv-status/1 role=worker rank=99999999999 phase=running",
      "@pskv-status/1 role=worker rank=1 rank=2 phase=running",  // a key twice
      "@pskv-status/1 role=worker rank=1 phase=running =x",      // no key
      "@pskv-status/1 role=worker rank=1 phase=running novalue",
      "@pskv-status/1 role=worker rank=1 phase=failed msg=%G1",  // bad escapes
      "@pskv-status/1 role=worker rank=1 phase=failed msg=ab%4",
      "@pskv-status/1 role=worker rank=1 phase=failed msg=a\"b",  // not printable-plain
      "@pskv-status/1 role=worker rank=1 phase=failed msg=a\x01z",
      "@pskv-status/1 role=worker rank=1 phase=waiting missing=worker.1,",  // list syntax
      "@pskv-status/1 role=worker rank=1 phase=waiting missing=worker",
      "@pskv-status/1 role=worker rank=1 phase=waiting missing=boss.1",
      "@pskv-status/1 role=worker rank=1 phase=waiting missing=worker.-1",
      "@pskv-status/1 role=worker rank=1 phase=waiting pid=-5",
      "@pskv-status/1 role=scheduler rank=0 phase=running departed=server.1,",
      "@pskv-status/1 role=scheduler rank=0 phase=running departed=server",
      "@pskv-status/1 role=scheduler rank=0 phase=running replicas=-1",
      "@pskv-status/1 role=scheduler rank=0 phase=running detect_ms=x",
      // A deadline this far out would overflow the launcher's clock arithmetic.
      "@pskv-status/1 role=scheduler rank=0 phase=running detect_ms=9223372036854775807",
      "@pskv-status/1 role=scheduler rank=0 phase=running detect_ms=86400001",
      "@pskv-status/1 role=worker rank=1 phase=running\nrole=server",
  };
  for (auto& b : bad) EXPECT_FALSE(DecodeStatus(b)) << b;
  // Too many references.
  std::string refs = ok + " missing=";
  for (size_t i = 0; i <= kMaxRefs; ++i) refs += (i ? ",worker." : "worker.") + std::to_string(i);
  EXPECT_FALSE(DecodeStatus(refs));
  // Oversized, however valid it would be otherwise.
  std::string big = ok + " msg=" + std::string(kMaxRecordBytes, 'a');
  EXPECT_FALSE(DecodeStatus(big));
  EXPECT_TRUE(LooksLikeStatus(big) && LooksLikeStatus("@pskv-status/9 x"));
  EXPECT_FALSE(LooksLikeStatus("pskv-status/1 x"));
}

TEST(StatusRecord, EveryEncodedRecordFitsTheLimit) {
  StatusRecord r = Full();
  r.phase = StatusPhase::kFailed;
  r.host = std::string(1000, '%');
  r.wait = std::string(1000, ' ');
  r.kind = std::string(1000, '"');
  r.message = std::string(100000, '\xff');
  r.missing.clear();
  for (int i = 0; i < 100; ++i) r.missing.push_back({"worker", 100000 + i});
  const std::string line = EncodeStatus(r);
  EXPECT_LE(line.size(), kMaxRecordBytes);
  auto back = DecodeStatus(line);
  ASSERT_TRUE(back) << line.substr(0, 200);
  EXPECT_EQ(back->missing.size(), kMaxRefs);
  EXPECT_EQ(back->more, r.more + 100 - static_cast<int64_t>(kMaxRefs));
  EXPECT_EQ(back->message.size(), kMaxMessageBytes);
}

TEST(StatusChannel, OpensOnlyALauncherSocket) {
  EXPECT_NO_THROW(StatusChannel::Validate(""));
  EXPECT_NO_THROW(StatusChannel::Validate("stderr"));
  EXPECT_NO_THROW(StatusChannel::Validate("fd:7"));
  for (const char* bad : {"fd:", "fd:2", "fd:x", "fd:7x", "file:/tmp/x", "1"})
    EXPECT_THROW(StatusChannel::Validate(bad), ConfigError) << bad;

  std::string why;
  EXPECT_FALSE(StatusChannel::Open("", &why).enabled());
  EXPECT_TRUE(StatusChannel::Open("stderr").enabled());
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  EXPECT_FALSE(StatusChannel::Open("fd:" + std::to_string(p[1]), &why).enabled()) << "a pipe";
  EXPECT_NE(why.find("not a status socket"), std::string::npos) << why;
  ::close(p[0]);
  ::close(p[1]);
  EXPECT_FALSE(StatusChannel::Open("fd:" + std::to_string(p[1])).enabled()) << "closed";
  int tcp = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_FALSE(StatusChannel::Open("fd:" + std::to_string(tcp)).enabled()) << "another socket";
  ::close(tcp);

  SocketPair sp;
  StatusChannel c = StatusChannel::Open(sp.spec());
  ASSERT_TRUE(c.enabled());
  EXPECT_TRUE(c.Write(Full()));
  auto got = Packets(sp.fd[0]);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(DecodeStatus(got[0]), Full());
}

// A launcher that stopped reading costs the writer nothing: records are dropped, the
// writer neither blocks nor gets SIGPIPE.
TEST(StatusChannel, NeverBlocksNorRaisesSigpipe) {
  SocketPair sp;
  StatusChannel c = StatusChannel::Open(sp.spec());
  int dropped = 0;
  for (int i = 0; i < 100000 && dropped == 0; ++i) dropped += !c.Write(Full());
  EXPECT_GT(dropped, 0) << "the socket never filled";
  ::shutdown(sp.fd[0], SHUT_RDWR);
  EXPECT_FALSE(c.Write(Full()));  // no SIGPIPE: the test would die
}

TEST(StatusReporter, RecordsFollowPhasesAndWaits) {
  SocketPair sp;
  StatusReporter rep;
  rep.SetPhase(StatusPhase::kRunning);  // no channel yet: nothing, no crash
  rep.Configure(StatusChannel::Open(sp.spec()), "server", "h1");
  rep.SetRank(0);
  rep.SetPhase(StatusPhase::kRunning);
  rep.Waiting("a", "sync round of key 1", {{"worker", 1}}, 0, 2000ms);
  rep.Waiting("b", "sync round of key 2", {{"worker", 1}, {"worker", 2}}, 3, 4000ms);
  rep.Resumed("a");
  rep.Resumed("b");
  rep.Resumed("b");  // twice: no record
  std::vector<StatusRecord> recs;
  for (auto& p : Packets(sp.fd[0])) {
    auto r = DecodeStatus(p);
    ASSERT_TRUE(r) << p;
    recs.push_back(*r);
  }
  ASSERT_EQ(recs.size(), 5u);
  EXPECT_EQ(recs[0].phase, StatusPhase::kRunning);
  EXPECT_EQ(recs[0].role, "server");
  EXPECT_EQ(recs[0].host, "h1");
  EXPECT_EQ(recs[0].pid, ::getpid());
  EXPECT_EQ(recs[2].phase, StatusPhase::kWaiting);
  EXPECT_EQ(recs[2].wait, "sync round of key 2");  // the latest wait
  EXPECT_EQ(recs[2].missing, (std::vector<NodeRef>{{"worker", 1}, {"worker", 2}}));
  EXPECT_EQ(recs[2].more, 3);
  EXPECT_EQ(recs[3].phase, StatusPhase::kWaiting);  // "b" still open
  EXPECT_EQ(recs[4].phase, StatusPhase::kRunning);  // no wait left: never a stale wait

  rep.Failed("NodeFailure", "worker[1] is dead", {{"worker", 1}});
  rep.SetPhase(StatusPhase::kFinished);  // failed sticks
  rep.Waiting("c", "barrier", {}, 0, 1000ms);
  auto last = Packets(sp.fd[0]);
  ASSERT_EQ(last.size(), 1u);
  auto f = DecodeStatus(last[0]);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->phase, StatusPhase::kFailed);
  EXPECT_EQ(f->kind, "NodeFailure");
  EXPECT_EQ(f->missing, (std::vector<NodeRef>{{"worker", 1}}));
}

TEST(StatusReporter, AWaitEndsWhenItsObjectDoesAndFailsBlamingWhomItWaitedFor) {
  SocketPair sp;
  StatusReporter rep;
  rep.Configure(StatusChannel::Open(sp.spec()), "worker", "");
  rep.SetRank(0);
  {
    StatusWait quiet(&rep);  // never reported: never a record
  }
  EXPECT_TRUE(Packets(sp.fd[0]).empty());
  {
    StatusWait w(&rep);
    w.Report("push", {{"server", 0}}, 0, 1000ms);
    EXPECT_EQ(rep.Snapshot().phase, StatusPhase::kWaiting);
  }
  EXPECT_EQ(rep.Snapshot().phase, StatusPhase::kRegistering);
  {
    StatusWait w(&rep);
    w.Report("push", {{"server", 1}}, 0, 1000ms);
    w.Fail("TimeoutError", "no answer");
  }
  StatusRecord s = rep.Snapshot();
  EXPECT_EQ(s.phase, StatusPhase::kFailed);
  EXPECT_EQ(s.missing, (std::vector<NodeRef>{{"server", 1}}));
  EXPECT_EQ(ErrorKindName(std::make_exception_ptr(TimeoutError("x"))), "TimeoutError");
  EXPECT_EQ(ErrorKindName(std::make_exception_ptr(NodeFailure("x"))), "NodeFailure");
  EXPECT_EQ(ErrorKindName(std::make_exception_ptr(std::runtime_error("x"))), "exception");
  EXPECT_EQ(ErrorMessage(std::make_exception_ptr(std::runtime_error("x y"))), "x y");
}

// The scheduler's records carry the job's replication, the servers it went on
// without and the spares that joined, in every record from then on (each record is
// the whole state).
TEST(StatusReporter, TheSchedulerReportsReplicasAndDepartedServers) {
  SocketPair sp;
  StatusReporter rep;
  rep.Configure(StatusChannel::Open(sp.spec()), "scheduler", "");
  rep.SetRank(0);
  rep.SetJob(1, 2500);
  rep.SetPhase(StatusPhase::kRunning);
  rep.Departed({"server", 1});
  rep.Departed({"server", 1});  // once
  rep.Waiting("w", "barrier", {{"worker", 0}}, 0, 1000ms);
  rep.Joined({"server", 2});
  rep.Joined({"server", 2});  // once
  std::vector<StatusRecord> recs;
  for (auto& p : Packets(sp.fd[0])) {
    auto r = DecodeStatus(p);
    ASSERT_TRUE(r) << p;
    recs.push_back(*r);
  }
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_EQ(recs[0].replicas, 1);
  EXPECT_EQ(recs[0].detect_ms, 2500);
  EXPECT_TRUE(recs[0].departed.empty());
  EXPECT_EQ(recs[1].departed, (std::vector<NodeRef>{{"server", 1}}));
  EXPECT_EQ(recs[2].phase, StatusPhase::kWaiting);
  EXPECT_EQ(recs[2].departed, (std::vector<NodeRef>{{"server", 1}}));
  EXPECT_EQ(recs[2].replicas, 1);
  EXPECT_TRUE(recs[2].joined.empty());
  EXPECT_EQ(recs[3].joined, (std::vector<NodeRef>{{"server", 2}}));
  EXPECT_EQ(recs[3].departed, (std::vector<NodeRef>{{"server", 1}}));
}
