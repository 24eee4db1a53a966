// Membership of a job with replicated servers (docs/fault-tolerance.md, "Replicated
// servers"): every node must agree on PSKV_REPLICAS; a server the job went on without
// yet still running changes nothing and is told to stop; a node cut off from a server
// the scheduler keeps fails within a bound. Every node is a thread of this process
// over real ZeroMQ.
#include <gtest/gtest.h>

#include <thread>

#include "ps/kv_app.h"
#include "ps/node.h"
#include "pskv/error.h"
#include "support/node_threads.h"
#include "support/test_util.h"
#include "transport/fault/fault_transport.h"

using namespace pskv;
using namespace std::chrono_literals;
using test::FreePort;
using test::NodeOptions;
using test::RunNode;
using test::StartAtOnce;
using test::Threw;
using test::What;

// Server 1 arrives at a barrier of the servers while it is cut off (its arrival is
// resent once the partition heals): by then the scheduler has removed it, so its
// arrival must not stand in for server 2's, which never comes. Server 1 itself is
// told that it was removed from the job.
TEST(Departed, RemovedServerNeitherCountsInBarriersNorGoesOn) {
  const int port = FreePort(), S = 3;
  const auto cut_from = std::chrono::steady_clock::now() + 3s;
  const auto cut_for = 3s;
  auto cut = [&](int peer) {
    return [=](const TransportConfig& tc) {
      FaultConfig fc;
      fc.partition_peers = {peer};
      fc.partition_from = cut_from;
      fc.partition_for = cut_for;
      return CreateFaultTransport(CreateTransport("zmq", tc), fc);
    };
  };
  std::exception_ptr sched_error, worker_error, server_errors[3];
  std::string barrier_of_server0 = "released", removed;
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    Options o = NodeOptions(Role::kScheduler, port, S, 1);
    o.replicas = 1;
    o.rank_hint = -1;
    o.heartbeat_timeout = 1500ms;
    RunNode(o, &sched_error, [&](Node& n) { n.SetTransportFactory(cut(ServerId(1))); });
  });
  for (int s = 0; s < S; ++s)
    threads.emplace_back([&, s] {
      try {
        Options o = NodeOptions(Role::kServer, port, S, 1);
        o.replicas = 1;
        o.rank_hint = s;
        if (s == 1) {
          o.heartbeat_timeout = 60s;  // it must not give up on the scheduler itself
          o.resend = true;            // its barrier arrival goes out again after the cut
          o.resend_timeout = 100ms;
        }
        Node node(o);
        if (s == 1) node.SetTransportFactory(cut(kSchedulerId));
        node.Start();
        ASSERT_EQ(node.rank(), s);
        if (s == 1) {
          std::this_thread::sleep_until(cut_from + 200ms);
          try {
            node.Barrier(kServerGroup, 20s);
            removed = "its barrier was released";
          } catch (const NodeFailure& e) {
            removed = e.what();
          }
          return;
        }
        if (s == 0) {
          std::this_thread::sleep_until(cut_from + cut_for + 1s);
          try {
            node.Barrier(kServerGroup, 2s);  // server 2 never arrives
          } catch (const TimeoutError& e) {
            barrier_of_server0 = e.what();
          }
        }
        node.Finalize(30s);
      } catch (...) {
        server_errors[s] = std::current_exception();
      }
    });
  threads.emplace_back([&] {
    Options o = NodeOptions(Role::kWorker, port, S, 1);
    o.replicas = 1;
    RunNode(
        o, &worker_error, {},
        [&](Node&) { std::this_thread::sleep_until(cut_from + cut_for + 4s); }, 30s);
  });
  for (auto& t : threads) t.join();
  EXPECT_NE(barrier_of_server0.find("barrier timed out"), std::string::npos)
      << "server 0's barrier of the servers: " << barrier_of_server0;
  EXPECT_NE(removed.find("server[1] was removed from the job by the scheduler"), std::string::npos)
      << removed;
  EXPECT_FALSE(sched_error) << What(sched_error);
  EXPECT_FALSE(worker_error) << What(worker_error);
  EXPECT_FALSE(server_errors[0]) << What(server_errors[0]);
  EXPECT_FALSE(server_errors[2]) << What(server_errors[2]);
}

// A worker that cannot reach a primary while the scheduler still hears from it (a
// one-sided partition: no range table will ever remove that server) fails within
// about twice the heartbeat bound, naming the server, instead of waiting for the
// request's timeout.
TEST(Departed, OneSidedPartitionFromAPrimaryFailsWithinTheBound) {
  const int port = FreePort(), S = 2;
  const auto cut_from = std::chrono::steady_clock::now() + 3s;
  auto make = [&](Role role) {
    Options o = NodeOptions(role, port, S, 1);
    o.replicas = 1;
    o.heartbeat_timeout = 1500ms;
    return o;
  };
  std::string seen;
  std::chrono::steady_clock::duration took{};
  std::vector<std::thread> threads;
  threads.emplace_back([&] { RunNode(make(Role::kScheduler), nullptr); });
  for (int s = 0; s < S; ++s)
    threads.emplace_back([&] { RunNode(make(Role::kServer), nullptr, {}, {}, 30s); });
  threads.emplace_back([&] {
    try {
      Node node(make(Role::kWorker));
      node.SetTransportFactory([&](const TransportConfig& tc) {
        FaultConfig fc;
        fc.partition_peers = {ServerId(0)};
        fc.partition_from = cut_from;
        fc.partition_for = 60s;
        fc.partition_reports_down = true;
        return CreateFaultTransport(CreateTransport("zmq", tc), fc);
      });
      KVWorker w(&node);
      node.Start();
      std::this_thread::sleep_until(cut_from + 100ms);
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<float> v(4, 1.0f);
      auto done = std::make_shared<Completion>();
      const uint64_t key = KVWorker::ServerRange(0, S).first + 1;
      const uint64_t ts =
          w.Push({key}, Frame::Copy(v.data(), 16), {16}, 0, Completion::Callback(done));
      try {
        w.Await(ts, done, 20s, 0ms, "push");
        seen = "the push completed";
      } catch (const NodeFailure& e) {
        seen = e.what();
      } catch (const TimeoutError& e) {
        seen = e.what();
      }
      took = std::chrono::steady_clock::now() - t0;
      node.Finalize(1s);
    } catch (...) {
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_NE(seen.find("server[0]"), std::string::npos) << seen;
  EXPECT_NE(seen.find("network partition"), std::string::npos) << seen;
  // Detection (1.7 s after the connection is down) plus as long again.
  EXPECT_LT(took, 8s) << seen;
}

// One server set another PSKV_REPLICAS than the rest: every node fails at startup
// with an error naming the variable (none waits for the registration timeout).
TEST(Departed, ReplicasSettingThatDiffersFailsEveryNodeAtStartup) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto started =
      StartAtOnce(FreePort(), 2, 1, [](int i, Options& o) { o.replicas = i == 2 ? 0 : 1; });
  for (auto& e : started)
    EXPECT_NE(e.what.find("PSKV_REPLICAS differs"), std::string::npos) << e.what;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

// One worker set PSKV_ELASTIC=1, the rest of the job not: every node fails at startup
// with a typed error naming the variable (ConfigError on the scheduler, the refusal —
// ProtocolError — on the others), none after the registration timeout.
TEST(Departed, ElasticSettingThatDiffersFailsEveryNodeAtStartup) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto started = StartAtOnce(FreePort(), 1, 2, [](int i, Options& o) { o.elastic = i == 3; });
  for (size_t i = 0; i < started.size(); ++i) {
    const auto& e = started[i];
    EXPECT_NE(e.what.find("PSKV_ELASTIC differs"), std::string::npos) << e.what;
    EXPECT_TRUE(i == 0 ? Threw<ConfigError>(e.error) : Threw<ProtocolError>(e.error))
        << "node " << i << ": " << e.what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}
