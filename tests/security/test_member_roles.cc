// A member server may do only what its role in the range table allows (issue 42,
// holes 4, 5 and 6; docs/security.md, "Replicated servers"). A job of three servers
// (PSKV_REPLICAS=1: range 0 on servers 0 and 1, range 1 on 1 and 2, range 2 on 2 and
// 0) and one dist_sync worker whose scheduler, servers 0 and 2 and worker are threads
// of this process over real ZeroMQ, and whose server 1 is a member Node serving its
// ranges (ReplicaHost) that also sends, over the job's own connections:
//  - an optimizer-states load "up" to server 0, the primary of range 0 it replicates
//    (it was applied there and not forwarded: the copies diverged);
//  - a replicated round of key 0 to server 0 claiming a newer range table (a claim was
//    taken on trust: the round was applied, overwriting the real one);
//  - a copy of range 0 to server 2, which does not join it, announcing 513 MiB of
//    optimizer states (server 2 zero-filled them for one 77-byte message).
// Server 0 and 2 must refuse (or hold, for the claimed table, which never comes) each;
// the worker's weights stay exactly what the real rounds make them, the process's peak
// memory does not grow by the announced states, and every role ends cleanly.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/replicated_server.h"
#include "kvstore/distributed/server/role_main.h"
#include "kvstore/states_file.h"
#include "ps/node.h"
#include "pskv/kvstore.h"
#include "support/test_util.h"

using namespace pskv;
using namespace std::chrono_literals;

namespace {

constexpr int kServers = 3;

// The peak resident memory of this process (VmHWM), in bytes.
uint64_t PeakBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

NDArray Filled(float v) {
  NDArray a(Shape{4}, DType::kFloat32);
  a.Fill(v);
  return a;
}

bool AllEqual(const NDArray& a, float v) {
  for (int64_t i = 0; i < a.size(); ++i)
    if (a.data<float>()[i] != v) return false;
  return true;
}

// A push of `kind` to server `to` from this (member) node, as servers send each other.
Message ServerPush(dist::Kind kind, DType dtype, uint64_t ps_key, std::string body,
                   const std::string& vals, uint64_t ts) {
  Message m;
  m.h.flags = kRequest | kPush;
  m.h.head = dist::MakeCmd(kind, dtype);
  m.h.timestamp = ts;
  m.h.num_keys = 1;
  m.keys = U64Frame({ps_key});
  m.lens = U64Frame({vals.size()});
  m.h.vals_len = vals.size();
  if (!vals.empty()) m.vals = Frame::Copy(vals.data(), vals.size());
  m.body = std::move(body);
  return m;
}

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

TEST(SecurityServers, AMemberServerMayOnlyDoWhatItsRoleInTheRangeTableAllows) {
  const int port = test::FreePort();
  Options o = test::NodeOptions(Role::kServer, port, kServers, 1);
  o.replicas = 1;
  o.heartbeat_interval = 500ms;
  o.heartbeat_timeout = 20s;
  std::vector<std::thread> infra;
  for (int rank : {-1, 0, 2}) {
    Options x = o;
    x.role = rank < 0 ? Role::kScheduler : Role::kServer;
    x.rank_hint = rank;
    infra.emplace_back([x] { EXPECT_EQ(RunServerOrScheduler(x), 0); });
  }
  // The worker: SGD with momentum (the states a load changes), keys 0 (range 0) and
  // 2 (range 2: key * 9973 mod 3).
  const OptimizerConfig sgd =
      OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.5"}, {"momentum", "0.5"}});
  std::atomic<bool> ready{false}, go{false};
  std::string worker_error;
  std::thread worker([&] {
    Options x = o;
    x.role = Role::kWorker;
    x.rank_hint = 0;
    try {
      auto kv = KVStore::Create("dist_sync", x);
      kv->SetOptimizer(sgd);
      kv->Init({0, 2}, {Filled(1), Filled(1)});
      kv->WaitAll();
      ready = true;
      for (int i = 0; i < 600 && !go; ++i) std::this_thread::sleep_for(100ms);
      // Zero gradients: with the momentum states as the real rounds left them (none),
      // the weights stay 1; then one step of 2: momentum -1, weights 0.
      NDArray out0 = Filled(-1), out2 = Filled(-1);
      kv->Push(0, {Filled(0)});
      kv->Push(2, {Filled(0)});
      kv->Pull(0, {out0});
      kv->Pull(2, {out2});
      kv->WaitAll();
      if (!AllEqual(out0, 1) || !AllEqual(out2, 1))
        worker_error = "after zero gradients key 0 is " + std::to_string(out0.data<float>()[0]) +
                       " and key 2 " + std::to_string(out2.data<float>()[0]) + ", want 1";
      kv->Push(0, {Filled(2)});
      kv->Pull(0, {out0});
      kv->WaitAll();
      if (worker_error.empty() && !AllEqual(out0, 0))
        worker_error =
            "after a step key 0 is " + std::to_string(out0.data<float>()[0]) + ", want 0";
    } catch (const std::exception& e) {
      worker_error = e.what();
      ready = true;
    }
  });

  // Server 1: a member of the job in this thread.
  Options a = o;
  a.rank_hint = 1;
  auto node = std::make_unique<Node>(a);
  auto host = std::make_unique<ReplicaHost>(node.get());
  node->Start();
  ASSERT_EQ(node->rank(), 1);
  for (int i = 0; i < 600 && !ready; ++i) std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(ready.load());
  ASSERT_EQ(worker_error, "");
  const uint64_t version = node->range_table().version();
  ASSERT_EQ(version, 1u);
  const uint64_t peak = PeakBytes();
  uint64_t ts = uint64_t{1} << 50;
  const uint64_t key0 = dist::PsKey(dist::WireKey(0, 0), 0, kServers);

  // Hole 4: a states load "up" to range 0's primary: momentum 1000 for key 0.
  states::Blob blob;
  blob.config = sgd.Serialize();
  blob.keys.push_back({dist::OptimizerKey(dist::WireKey(0, 0)), 1, {Filled(1000)}, NDArray()});
  std::string current;
  Put<uint64_t>(&current, version);
  node->Send(ServerId(0), ServerPush(dist::Kind::kStates, DType::kUInt8, key0, current,
                                     states::EncodeBlob(blob), ts++));

  // Hole 6: a round of key 0 (range 0, led by server 0) claiming range table v2, which
  // the scheduler never made; and one claiming a table no job of this size reaches.
  const std::string sum(16, '\0');
  std::string big_sum(16, '\0');
  for (int i = 0; i < 4; ++i) reinterpret_cast<float*>(big_sum.data())[i] = 1000.0f;
  for (uint64_t claimed : {version + 1, uint64_t{1} << 40}) {
    std::string round;
    Put<uint64_t>(&round, claimed);
    Put<int64_t>(&round, 1);   // the key's open round
    Put<uint32_t>(&round, 0);  // no push counts
    node->Send(ServerId(0),
               ServerPush(dist::Kind::kReplicate, DType::kFloat32, key0, round, big_sum, ts++));
  }

  // Hole 5: a copy of range 0 to server 2 (not joining it), announcing 64 MiB of
  // values and 513 MiB of optimizer states for store 0; as of the current table and
  // claiming a newer one.
  for (uint64_t claimed : {version, version + 1}) {
    std::string begin;
    Put<uint64_t>(&begin, claimed);
    Put<uint8_t>(&begin, static_cast<uint8_t>(dist::CopyPart::kBegin));
    Put<int32_t>(&begin, 0);  // range 0
    Put<uint8_t>(&begin, 1);  // sync
    Put<uint64_t>(&begin, 0);
    Put<uint64_t>(&begin, uint64_t{64} << 20);
    Put<uint32_t>(&begin, 1);
    Put<int32_t>(&begin, 0);
    Put<uint64_t>(&begin, uint64_t{513} << 20);
    node->Send(ServerId(2),
               ServerPush(dist::Kind::kRangeCopy, DType::kUInt8, key0, begin, "", ts++));
  }
  std::this_thread::sleep_for(1500ms);
  const uint64_t grown = PeakBytes() - peak;
  EXPECT_LT(grown, uint64_t{256} << 20)
      << "a copy to a server that does not join the range reserved its announced states";

  go = true;
  std::thread fin([&] {
    try {
      node->Finalize(60s);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "server 1: " << e.what();
    }
  });
  worker.join();
  fin.join();
  host.reset();
  node.reset();
  for (auto& t : infra) t.join();
  EXPECT_EQ(worker_error, "") << "a member server changed what only the range's primary may";
}
