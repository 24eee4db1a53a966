// Servers of a replicated job (PSKV_REPLICAS >= 1) talk to each other, but a server
// is not a worker (docs/security.md, "Replicated servers"): another server may send
// only replicated changes and the inits (and optimizer-states loads) forwarded down by
// the range's primary. This test runs a real authenticated job — scheduler, server 0
// (pskv-server) and one dist_sync worker (security_worker) as processes — whose
// server 1 is a Node of this process: a member holding the job's secret that serves
// its ranges like any server (ReplicaHost) and also sends server 0, over the job's
// own ZeroMQ connection, what only a worker may send: a push of 1000s into key 0,
// a push-pull, a pull and a command that would switch server 0 to dist_async, and
// what only the primary of key range 0 (server 0 itself) may send: a replicated
// embedding-table update and a forwarded embedding-table create. Server 0 must refuse
// each (and count them), keep key 0 exactly 1 and the job going.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/replicated_server.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "ps/node.h"
#include "support/proc.h"
#include "support/test_util.h"

using namespace pskv;
using namespace std::chrono_literals;

namespace {

// A request of `kind` from this node to `to`, as a worker's would look; `ts` is far
// above the replicator's own timestamps, so its answer matches nothing here.
Message WorkerLike(uint8_t flags, int cmd, uint64_t ts, const std::vector<float>& vals = {}) {
  Message m;
  m.h.flags = static_cast<uint8_t>(kRequest | flags);
  m.h.head = cmd;
  m.h.timestamp = ts;
  if (!(flags & kCommand)) {
    m.h.num_keys = 1;
    m.keys = U64Frame({dist::PsKey(0, 0, 2)});     // key 0: range 0, primary server 0
    m.lens = U64Frame({vals.empty() ? 0u : 16u});  // a pull's lens are 0
    if (!vals.empty()) {
      m.vals = Frame::Copy(vals.data(), 16);
      m.h.vals_len = 16;
    }
  }
  return m;
}

TEST(SecurityServers, AServerPosingAsAWorkerIsRefusedAndChangesNothing) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("pskv_server_trust_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const int port = test::FreePort();
  const std::string secret = "server-trust-secret-" + std::to_string(::getpid());
  auto env = [&](const std::string& role) {
    std::map<std::string, std::string> e = {{"DMLC_ROLE", role},
                                            {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                                            {"DMLC_PS_ROOT_PORT", std::to_string(port)},
                                            {"DMLC_NUM_WORKER", "1"},
                                            {"DMLC_NUM_SERVER", "2"},
                                            {"PSKV_REPLICAS", "1"},
                                            {"PS_HEARTBEAT_INTERVAL", "0.5"},
                                            {"PS_HEARTBEAT_TIMEOUT", "20"},
                                            {"PSKV_TIMEOUT", "60"},
                                            {"PSKV_JOB_SECRET", secret}};
    if (role == "server") e["DMLC_TASK_ID"] = "0";
    return e;
  };
  const pid_t sched = test::Spawn({PSKV_SERVER}, env("scheduler"), dir + "/scheduler.log");
  const pid_t server = test::Spawn({PSKV_SERVER}, env("server"), dir + "/server.log");
  const pid_t worker = test::Spawn({SECURITY_WORKER, dir + "/ready", dir + "/go"}, env("worker"),
                                   dir + "/worker.log");
  auto kill_all = [&] {
    for (pid_t p : {worker, server, sched}) {
      ::kill(-p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  };

  // Server 1: a member of the job in this process.
  Options o = test::NodeOptions(Role::kServer, port, 2, 1);
  o.replicas = 1;
  o.rank_hint = 1;
  o.job_secret = secret;
  o.heartbeat_interval = 500ms;
  o.heartbeat_timeout = 20s;
  auto node = std::make_unique<Node>(o);
  auto host = std::make_unique<ReplicaHost>(node.get());
  try {
    node->Start();
  } catch (const std::exception& e) {
    kill_all();
    FAIL() << "server 1 did not start: " << e.what() << "\n"
           << test::ReadFile(dir + "/scheduler.log") << test::ReadFile(dir + "/server.log");
  }
  ASSERT_EQ(node->rank(), 1);
  if (!test::WaitFile(dir + "/ready", 30s)) {
    kill_all();
    FAIL() << "the worker never got ready:\n" << test::ReadFile(dir + "/worker.log");
  }

  // What only a worker may send, from server 1 to server 0 (key 0 is 1 everywhere).
  const int to = ServerId(0);
  const int dense = dist::MakeCmd(dist::Kind::kDense, DType::kFloat32);
  const std::vector<float> big(4, 1000.0f);
  uint64_t ts = uint64_t{1} << 50;
  node->Send(to, WorkerLike(kPush, dense, ts++, big));
  node->Send(to, WorkerLike(kPush | kPull, dense, ts++, big));
  node->Send(to, WorkerLike(kPull, dense, ts++));
  Message mode = WorkerLike(kCommand, dist::kSetMode, ts++);
  mode.body = payload::EncodeMode(false);
  node->Send(to, std::move(mode));
  // Forged embedding-table changes of range 0, whose primary server 0 is (server 1 is
  // its replica, never its primary): a replicated update and a forwarded create, each
  // with a plausible body (the sender's table version first).
  const std::string version(8, '\0');
  Message update =
      WorkerLike(kPush, dist::MakeCmd(dist::Kind::kReplicateEmbedding, DType::kFloat32), ts++, big);
  update.body = version + std::string(12, '\0');
  node->Send(to, std::move(update));
  Message create =
      WorkerLike(kPush, dist::MakeCmd(dist::Kind::kEmbeddingCreate, DType::kFloat32), ts++, big);
  create.body = version + std::string(4, '\0');
  node->Send(to, std::move(create));
  std::this_thread::sleep_for(1s);

  // The worker checks key 0 is still exactly 1, then that push 2 -> pull 2 works
  // (server 0 still in dist_sync: an async server without an optimizer refuses it).
  std::ofstream(dir + "/go") << "go\n";
  std::thread fin([&] {
    try {
      node->Finalize(60s);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "server 1: " << e.what();
    }
  });
  const auto w = test::WaitExit(worker, 60s), s = test::WaitExit(server, 30s),
             c = test::WaitExit(sched, 30s);
  fin.join();
  host.reset();
  node.reset();
  const std::string server_log = test::ReadFile(dir + "/server.log");
  EXPECT_EQ(w, 0) << "worker:\n" << test::ReadFile(dir + "/worker.log") << server_log;
  EXPECT_EQ(s, 0) << "server 0:\n" << server_log;
  EXPECT_EQ(c, 0) << "scheduler:\n" << test::ReadFile(dir + "/scheduler.log");
  // Each forged request counted (one line at exit), none applied.
  EXPECT_NE(server_log.find("refused 6 request(s)"), std::string::npos) << server_log;
  for (pid_t p : {worker, server, sched}) ::kill(-p, SIGKILL);
  std::filesystem::remove_all(dir);
}

// The rule itself: what a replicated server accepts from whom.
TEST(SecurityServers, PeerRefusalAcceptsOnlyReplicationBetweenServers) {
  using dist::Kind;
  const int server = ServerId(1), worker = WorkerId(0);
  // From a worker: everything but replicated changes.
  for (Kind k : {Kind::kDense, Kind::kInit, Kind::kCompressed, Kind::kStates, Kind::kSparseInit,
                 Kind::kSparsePush, Kind::kSparsePull})
    EXPECT_EQ(PeerRefusal(k, true, true, worker, false), "") << static_cast<int>(k);
  for (Kind k : {Kind::kEmbeddingCreate, Kind::kEmbeddingPush, Kind::kEmbeddingPull})
    EXPECT_EQ(PeerRefusal(k, true, k == Kind::kEmbeddingPull, worker, false), "")
        << static_cast<int>(k);
  for (Kind k :
       {Kind::kReplicate, Kind::kReplicateAsync, Kind::kReplicateSparse, Kind::kReplicateEmbedding})
    EXPECT_NE(PeerRefusal(k, true, false, worker, false), "") << static_cast<int>(k);
  // From a server: replicated changes (pushes), from the range's primary only ...
  for (Kind k : {Kind::kReplicate, Kind::kReplicateAsync, Kind::kReplicateSparse,
                 Kind::kReplicateEmbedding}) {
    EXPECT_EQ(PeerRefusal(k, true, false, server, true), "") << static_cast<int>(k);
    EXPECT_NE(PeerRefusal(k, true, false, server, false), "") << static_cast<int>(k);
    EXPECT_NE(PeerRefusal(k, true, true, server, true), "") << static_cast<int>(k);
    EXPECT_NE(PeerRefusal(k, false, true, server, true), "") << static_cast<int>(k);
  }
  // ... and forwarded inits and states loads, down from the range's primary only (a
  // replica sending a states load up to its primary is refused: issue 42, hole 4) ...
  for (Kind k : {Kind::kInit, Kind::kSparseInit, Kind::kStates, Kind::kEmbeddingCreate}) {
    EXPECT_EQ(PeerRefusal(k, true, false, server, true), "") << static_cast<int>(k);
    EXPECT_NE(PeerRefusal(k, true, false, server, false), "") << static_cast<int>(k);
    EXPECT_NE(PeerRefusal(k, false, true, server, true), "") << static_cast<int>(k);
  }
  // ... never a worker's pushes and pulls.
  for (Kind k : {Kind::kDense, Kind::kCompressed, Kind::kSparsePush, Kind::kSparsePull,
                 Kind::kEmbeddingPush, Kind::kEmbeddingPull}) {
    EXPECT_NE(PeerRefusal(k, true, false, server, true), "") << static_cast<int>(k);
    EXPECT_NE(PeerRefusal(k, false, true, server, true), "") << static_cast<int>(k);
    EXPECT_NE(PeerRefusal(k, true, true, server, true), "") << static_cast<int>(k);
  }
}

}  // namespace
