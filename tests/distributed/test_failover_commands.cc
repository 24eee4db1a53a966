// Commands across a failover (docs/fault-tolerance.md, "Commands"): a job with
// PSKV_REPLICAS=1, S=2, one worker, every node a thread of this process over real
// ZeroMQ; server 0 stops (Node::Abort: the scheduler removes it and promotes range 0's
// replica on server 1).
//  * A command whose fan-out still names server 0 — what a worker sends when the range
//    table arrives between choosing the live servers and sending — completes: a send
//    to a server the node knows gone counts as answered, as a server the table removes
//    while the command waits does (every range it held has a live copy, which ran it).
//  * A real error still surfaces: SetGradientCompression after Init fails on the copy
//    of range 0 that server 1 now leads, although server 1's own range holds no key.
//  * Data still goes through: push 2 -> pull 2 of key 0 on its new primary.
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/replicated_server.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/distributed/worker/stall.h"
#include "ps/kv_app.h"
#include "ps/node.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "support/test_util.h"

using namespace pskv;
using namespace std::chrono_literals;

namespace {

Frame Floats(float v) {
  auto a = std::make_shared<std::vector<float>>(4, v);
  Frame f;
  f.data = reinterpret_cast<const char*>(a->data());
  f.size = 16;
  f.owner = a;
  return f;
}

struct Job {
  std::vector<std::unique_ptr<ReplicaHost>> hosts;
  std::unique_ptr<KVWorker> worker;               // worker 0
  std::vector<std::unique_ptr<KVWorker>> others;  // workers 1 ..
  std::vector<std::unique_ptr<Node>> nodes;       // scheduler, server 0, server 1, workers

  // The nodes' threads stop first (their handlers call the hosts and the workers), then
  // the hosts (whose servers' stall inspectors read their nodes) and the workers go
  // before the nodes. Abort is a no-op for a node already finalized.
  ~Job() {
    for (auto& n : nodes) n->Abort("test over");
    hosts.clear();
    worker.reset();
    others.clear();
  }

  explicit Job(int workers = 1) {
    const int port = test::FreePort();
    auto make = [&](Role r, int rank) {
      Options o = test::NodeOptions(r, port, 2, workers);
      o.replicas = 1;
      o.rank_hint = rank;
      nodes.push_back(std::make_unique<Node>(o));
      return nodes.back().get();
    };
    make(Role::kScheduler, -1);
    for (int s = 0; s < 2; ++s)
      hosts.push_back(std::make_unique<ReplicaHost>(make(Role::kServer, s)));
    worker = std::make_unique<KVWorker>(make(Role::kWorker, 0));
    for (int w = 1; w < workers; ++w)
      others.push_back(std::make_unique<KVWorker>(make(Role::kWorker, w)));
    std::vector<std::thread> ts;
    for (auto& n : nodes) ts.emplace_back([&n] { n->Start(); });
    for (auto& t : ts) t.join();
  }
  Node* server(int s) { return nodes[1 + static_cast<size_t>(s)].get(); }
  Node* worker_node() { return nodes[3].get(); }
  /// Stops server 0 and waits until worker 0 has the table that promoted server 1.
  void LoseServer0() {
    server(0)->Abort("test: server 0 stops");
    const auto end = std::chrono::steady_clock::now() + 20s;
    while (worker_node()->RangePrimary(0).first != ServerId(1) &&
           std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(10ms);
    ASSERT_EQ(worker_node()->RangePrimary(0).first, ServerId(1)) << "no failover";
    std::this_thread::sleep_for(200ms);  // the worker has closed its connection to server 0
  }

  void Await(uint64_t ts, const std::shared_ptr<Completion>& c, const std::string& what) {
    worker->Await(ts, c, 30s, 0ms, what);
  }
  void Init(float v) {
    auto c = std::make_shared<Completion>();
    Await(worker->Push({dist::PsKey(0, 0, 2)}, Floats(v), {16},
                       dist::MakeCmd(dist::Kind::kInit, DType::kFloat32), Completion::Callback(c)),
          c, "init");
  }
  /// Worker `by` pushes `v` to key 0; returns the request and its completion.
  std::pair<uint64_t, std::shared_ptr<Completion>> StartPush(float v, int by = 0) {
    KVWorker* w = by == 0 ? worker.get() : others[static_cast<size_t>(by - 1)].get();
    auto c = std::make_shared<Completion>();
    const uint64_t ts =
        w->Push({dist::PsKey(0, 0, 2)}, Floats(v), {16},
                dist::MakeCmd(dist::Kind::kDense, DType::kFloat32), Completion::Callback(c));
    return {ts, c};
  }
  void Push(float v) {
    auto [ts, c] = StartPush(v);
    Await(ts, c, "push");
  }
  std::vector<float> Pull() {
    std::vector<float> out(4, -1);
    auto c = std::make_shared<Completion>();
    Await(worker->Pull({dist::PsKey(0, 0, 2)}, reinterpret_cast<char*>(out.data()), {16},
                       dist::MakeCmd(dist::Kind::kDense, DType::kFloat32), Completion::Callback(c)),
          c, "pull");
    return out;
  }
  void Finish() {
    std::vector<std::thread> ts;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (i != 1) ts.emplace_back([this, i] { nodes[i]->Finalize(30s); });
    for (auto& t : ts) t.join();
  }
};

TEST(FailoverCommands, CommandsGoOnAcrossAFailoverAndReportRealErrors) {
  Job job;
  ASSERT_EQ(job.server(1)->rank(), 1);
  job.worker->Command(dist::kSetMode, payload::EncodeMode(true), 30s);
  job.Init(1);
  EXPECT_EQ(job.Pull(), std::vector<float>(4, 1));

  job.LoseServer0();
  if (::testing::Test::HasFatalFailure()) return;

  // A fan-out that still names server 0.
  EXPECT_NO_THROW(job.worker->Command(dist::kSetMode, payload::EncodeMode(true), 30s,
                                      {ServerId(0), ServerId(1)}));
  // Compression after Init: refused by the copy of range 0 on server 1.
  CompressionConfig two_bit;
  two_bit.type = "2bit";
  EXPECT_THROW(job.worker->Command(dist::kSetCompression, payload::EncodeCompression(two_bit), 30s),
               UsageError);
  job.Push(2);
  EXPECT_EQ(job.Pull(), std::vector<float>(4, 2));
  job.Finish();
}

// The round status a stalled worker asks for (distributed/worker/stall.h) after a failover:
// server 1 reports the open round of range 0, which it now leads, and the empty reply
// standing for server 0 (gone: counted as answered) is skipped, not a decoding error.
TEST(FailoverCommands, RoundStatusReportsPromotedRangesAndSkipsServersGone) {
  Job job(2);
  job.worker->Command(dist::kSetMode, payload::EncodeMode(true), 30s);
  job.Init(1);
  job.LoseServer0();
  if (::testing::Test::HasFatalFailure()) return;
  auto [ts, pushed] = job.StartPush(2);  // a round of key 0 on server 1, waiting for worker 1
  payload::RoundStatus status;
  const auto end = std::chrono::steady_clock::now() + 20s;
  do {
    std::this_thread::sleep_for(20ms);
    std::vector<std::string> replies;
    ASSERT_NO_THROW(
        replies = job.worker->Command(dist::kRoundStatus, "", 10s, {ServerId(0), ServerId(1)}));
    ASSERT_EQ(replies.size(), 2u);
    EXPECT_TRUE(replies[0].empty()) << "server 0 is gone";
    ASSERT_NO_THROW(status = dist::JoinRoundStatus(replies));
  } while (status.lines.empty() && std::chrono::steady_clock::now() < end);
  ASSERT_EQ(status.lines.size(), 1u);
  EXPECT_NE(status.lines[0].find("(key range 0) round 1 on server[1]: waiting for worker[1]"),
            std::string::npos)
      << status.lines[0];
  EXPECT_TRUE(status.deadlocks.empty());
  auto [ts1, pushed1] = job.StartPush(4, 1);
  job.Await(ts, pushed, "worker 0's push");
  job.Await(ts1, pushed1, "worker 1's push");
  EXPECT_EQ(job.Pull(), std::vector<float>(4, 6));
  job.Finish();
}

}  // namespace
