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

#include "kvstore/dist/server/replicated_server.h"
#include "kvstore/dist_protocol.h"
#include "protocol/payload.h"
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
  std::unique_ptr<KVWorker> worker;
  std::vector<std::unique_ptr<Node>> nodes;  // scheduler, server 0, server 1, worker

  // The nodes' threads stop first (their handlers call the hosts and the worker), then
  // the hosts (whose servers' stall inspectors read their nodes) and the worker go
  // before the nodes. Abort is a no-op for a node already finalized.
  ~Job() {
    for (auto& n : nodes) n->Abort("test over");
    hosts.clear();
    worker.reset();
  }

  Job() {
    const int port = test::FreePort();
    auto make = [&](Role r, int rank) {
      Options o = test::NodeOptions(r, port, 2, 1);
      o.replicas = 1;
      o.rank_hint = rank;
      nodes.push_back(std::make_unique<Node>(o));
      return nodes.back().get();
    };
    make(Role::kScheduler, -1);
    for (int s = 0; s < 2; ++s)
      hosts.push_back(std::make_unique<ReplicaHost>(make(Role::kServer, s)));
    worker = std::make_unique<KVWorker>(make(Role::kWorker, 0));
    std::vector<std::thread> ts;
    for (auto& n : nodes) ts.emplace_back([&n] { n->Start(); });
    for (auto& t : ts) t.join();
  }
  Node* server(int s) { return nodes[1 + static_cast<size_t>(s)].get(); }
  Node* worker_node() { return nodes[3].get(); }

  void Await(uint64_t ts, const std::shared_ptr<Completion>& c, const std::string& what) {
    worker->Await(ts, c, 30s, 0ms, what);
  }
  void Init(float v) {
    auto c = std::make_shared<Completion>();
    Await(worker->Push({dist::PsKey(0, 0, 2)}, Floats(v), {16},
                       dist::MakeCmd(dist::Kind::kInit, DType::kFloat32), Completion::Callback(c)),
          c, "init");
  }
  void Push(float v) {
    auto c = std::make_shared<Completion>();
    Await(worker->Push({dist::PsKey(0, 0, 2)}, Floats(v), {16},
                       dist::MakeCmd(dist::Kind::kDense, DType::kFloat32), Completion::Callback(c)),
          c, "push");
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
    for (size_t i : {size_t{0}, size_t{2}, size_t{3}})
      ts.emplace_back([this, i] { nodes[i]->Finalize(30s); });
    for (auto& t : ts) t.join();
  }
};

TEST(FailoverCommands, CommandsGoOnAcrossAFailoverAndReportRealErrors) {
  Job job;
  ASSERT_EQ(job.server(1)->rank(), 1);
  job.worker->Command(dist::kSetMode, payload::EncodeMode(true), 30s);
  job.Init(1);
  EXPECT_EQ(job.Pull(), std::vector<float>(4, 1));

  job.server(0)->Abort("test: server 0 stops");
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (job.worker_node()->RangePrimary(0).first != ServerId(1) &&
         std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(10ms);
  ASSERT_EQ(job.worker_node()->RangePrimary(0).first, ServerId(1)) << "no failover";
  std::this_thread::sleep_for(200ms);  // the worker has closed its connection to server 0

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

}  // namespace
