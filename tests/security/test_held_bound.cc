// A replicated server holds a worker's requests for a key range it holds but does not
// lead yet, until the range table promoting it arrives (docs/fault-tolerance.md,
// "Promotion on the servers"); a worker that floods it with such requests must not
// grow that without bound (docs/security.md, "Replicated servers"). An in-process job:
// scheduler and two servers (PSKV_REPLICAS=1) as in a real job, and a worker that
// speaks to server 0 directly: pushes for key range 1 (led by server 1, which no
// table says is gone). Server 0 keeps at most PSKV_HELD_REQUEST_BYTES of them and
// answers the rest at once with an error saying what to do.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/role_main.h"
#include "ps/node.h"
#include "support/test_util.h"

using namespace pskv;
using namespace std::chrono_literals;

TEST(SecurityServers, AWorkerFloodingARangeTheServerDoesNotLeadIsBounded) {
  constexpr int kRequests = 40;
  constexpr uint64_t kBytes = 4096;  // each push's values: 4112 bytes held with key and len
  const int port = test::FreePort();
  Options o = test::NodeOptions(Role::kServer, port, 2, 1);
  o.replicas = 1;
  o.held_request_bytes = 16384;  // three pushes
  std::vector<std::thread> infra;
  for (int i = 0; i < 3; ++i) {
    Options x = o;
    x.role = i == 0 ? Role::kScheduler : Role::kServer;
    x.rank_hint = i == 0 ? -1 : i - 1;
    infra.emplace_back([x] { EXPECT_EQ(RunServerOrScheduler(x), 0); });
  }
  Options w = o;
  w.role = Role::kWorker;
  Node node(w);
  std::mutex mu;
  std::vector<std::string> errors;
  std::atomic<int> answers{0};
  node.SetDataHandler([&](Message&& m) {
    if (m.h.flags & kError) {
      std::lock_guard<std::mutex> lk(mu);
      errors.push_back(m.body);
    }
    ++answers;
  });
  node.Start();
  const std::vector<float> vals(kBytes / sizeof(float), 1.0f);
  for (int i = 0; i < kRequests; ++i) {
    Message m;
    m.h.flags = kRequest | kPush;
    m.h.head = dist::MakeCmd(dist::Kind::kDense, DType::kFloat32);
    m.h.timestamp = 1000 + static_cast<uint64_t>(i);
    m.h.num_keys = 1;
    m.keys = U64Frame({dist::PsKey(0, 1, 2)});  // key 0 of range 1: server 1 leads it
    m.lens = U64Frame({kBytes});
    m.vals = Frame::Copy(vals.data(), kBytes);
    m.h.vals_len = kBytes;
    node.Send(ServerId(0), std::move(m));
  }
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (answers.load() < kRequests - 3 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(300ms);  // no more answers come
  {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_EQ(answers.load(), kRequests - 3) << "three requests held, the rest refused";
    EXPECT_EQ(errors.size(), static_cast<size_t>(kRequests - 3));
    for (const std::string& e : errors) {
      EXPECT_NE(e.find("PSKV_HELD_REQUEST_BYTES=16384"), std::string::npos) << e;
      EXPECT_NE(e.find("does not lead yet"), std::string::npos) << e;
    }
  }
  node.Finalize(30s);
  for (auto& t : infra) t.join();
}
