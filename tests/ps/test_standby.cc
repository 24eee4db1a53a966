// The standby scheduler's authority (ps/scheduler_standby.cc; docs/security.md): only
// the standby the node table names may tell a node that it took over. A job of a
// scheduler, its standby, one server and one worker, every node a thread of this
// process over real ZeroMQ with a job secret; the worker (a member of the job, on its
// own authenticated connection to the server) sends the server a forged kTakeover,
// once claiming to be the standby in the header and once as itself. Had the server
// followed it, "the scheduler" would be the standby, which has not taken over and
// drops barrier arrivals: the barrier after the forgery would time out. It also forges
// the scheduler's news of a fresh standby (kNodeTable, head kNodeTableStandby) naming
// itself as the standby, which would let its own takeover count: dropped.
// And split brain (docs/security.md): even the standby itself — its own connection,
// its identity — cannot make a node leave a scheduler the node still reaches.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "protocol/message.h"
#include "ps/node.h"
#include "support/node_threads.h"
#include "support/test_util.h"
#include "transport/transport.h"

using namespace pskv;
using namespace std::chrono_literals;
using test::FreePort;
using test::NodeOptions;
using test::RunNode;
using test::What;

namespace {

// Forwards to a real transport; the test sends raw frames through it.
class Tap : public Transport {
 public:
  explicit Tap(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  std::string Bind(const std::string& host, int port) override { return inner_->Bind(host, port); }
  void Connect(int peer, const std::string& endpoint, uint64_t token) override {
    inner_->Connect(peer, endpoint, token);
  }
  void Disconnect(int peer) override { inner_->Disconnect(peer); }
  void Send(int peer, std::vector<Frame> frames) override { inner_->Send(peer, std::move(frames)); }
  bool Recv(Received* in, std::chrono::milliseconds timeout) override {
    return inner_->Recv(in, timeout);
  }
  std::string RefusedBy(int peer) override { return inner_->RefusedBy(peer); }
  std::chrono::steady_clock::time_point DownSince(int peer) override {
    return inner_->DownSince(peer);
  }
  std::chrono::steady_clock::time_point GoneSince(int peer) override {
    return inner_->GoneSince(peer);
  }
  void Close(std::chrono::milliseconds linger) override { inner_->Close(linger); }
  std::string Name() const override { return inner_->Name(); }

 private:
  std::unique_ptr<Transport> inner_;
};

// A job of a scheduler, its standby, one server and one worker on 127.0.0.1, with a
// job secret: a node's options by its role.
struct StandbyJob {
  StandbyJob() {
    while (standby_port == port) standby_port = FreePort();
  }
  Options operator()(Role role) const {
    Options o = NodeOptions(role, port, 1, 1);
    o.standby_scheduler = "127.0.0.1:" + std::to_string(standby_port);
    o.job_secret = "0123456789abcdef0123456789abcdef";
    return o;
  }
  const int port = FreePort();
  int standby_port = FreePort();
};

// `o` as the standby scheduler's.
Options Standby(Options o) {
  o.standby = true;
  return o;
}

// A node's setup: its transport wrapped in a Tap, which `*tap` then points to.
template <typename P>
std::function<void(Node&)> Tapped(P* tap) {
  return [tap](Node& n) {
    n.SetTransportFactory([tap](const TransportConfig& tc) {
      auto t = std::make_unique<Tap>(CreateTransport(kNodeTransport, tc));
      *tap = t.get();
      return t;
    });
  };
}

// Joins the threads of the job's scheduler, standby, server and worker, and expects
// that none failed; returns what they logged (the test captures stderr).
std::string JoinAll(std::vector<std::thread>* threads, const std::exception_ptr* errors) {
  for (auto& t : *threads) t.join();
  const char* who[] = {"scheduler", "standby", "server", "worker"};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(What(errors[i]), "") << who[i];
  return testing::internal::GetCapturedStderr();
}

}  // namespace

TEST(StandbyScheduler, OnlyTheStandbyOfTheNodeTableCanTakeOver) {
  const StandbyJob options;
  const int port = options.port;
  std::exception_ptr errors[4];
  Tap* tap = nullptr;
  std::vector<std::thread> threads;
  testing::internal::CaptureStderr();
  threads.emplace_back([&] { RunNode(options(Role::kScheduler), &errors[0]); });
  threads.emplace_back([&] { RunNode(Standby(options(Role::kScheduler)), &errors[1]); });
  threads.emplace_back([&] {
    RunNode(
        options(Role::kServer), &errors[2], {},
        [](Node& n) {
          n.Barrier(kServerGroup | kWorkerGroup, 10s);  // before the forgery
          n.Barrier(kServerGroup | kWorkerGroup, 10s);  // after it
        },
        30s);
  });
  threads.emplace_back([&] {
    RunNode(
        options(Role::kWorker), &errors[3], Tapped(&tap),
        [&](Node& n) {
          n.Barrier(kServerGroup | kWorkerGroup, 10s);
          for (int claimed : {kStandbyId, WorkerId(0)}) {
            Message m;
            m.h.control = static_cast<uint8_t>(Control::kTakeover);
            m.h.sender = claimed;
            m.h.recver = ServerId(0);
            m.h.job = JobHash("127.0.0.1:" + std::to_string(port) + "/1w1s");
            tap->Send(ServerId(0), Encode(m));
          }
          // A forged "fresh standby" (kNodeTable, head kNodeTableStandby) naming this worker
          // as the job's standby: only the scheduler may send it.
          Message t;
          t.h.control = static_cast<uint8_t>(Control::kNodeTable);
          t.h.head = kNodeTableStandby;
          t.h.sender = kSchedulerId;
          t.h.recver = ServerId(0);
          t.h.job = JobHash("127.0.0.1:" + std::to_string(port) + "/1w1s");
          NodeDesc me;
          me.id = kStandbyId;
          me.role = static_cast<int>(Role::kScheduler);
          me.host = "127.0.0.1";
          me.port = 1;
          me.token = 1;
          t.body = EncodeNodes({me});
          tap->Send(ServerId(0), Encode(t));
          t.h.sender = WorkerId(0);  // in its own name
          tap->Send(ServerId(0), Encode(t));
          std::this_thread::sleep_for(500ms);
          n.Barrier(kServerGroup | kWorkerGroup, 10s);
        },
        30s);
  });
  const std::string log = JoinAll(&threads, errors);
  // Both forgeries reached the server's checks (right job, a member's connection).
  EXPECT_NE(log.find("dropped a takeover message (header says node 3, connection is worker[0]"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("only the standby scheduler sends this"), std::string::npos) << log;
  // (The one in the scheduler's name is dropped as the takeover in the standby's: the
  // header's sender differs from the connection's; logged once for both.)
  const auto forged = log.find(
      "dropped a node_table message (header says node 9, connection is "
      "worker[0]");
  ASSERT_NE(forged, std::string::npos) << log;
  const std::string line = log.substr(forged, log.find('\n', forged) - forged);
  EXPECT_NE(line.find("only the scheduler sends this"), std::string::npos) << line;
}

// The standby's genuine identity (its own authenticated connection) sends a server the
// takeover's commit while the scheduler lives (a standby cut off from the scheduler,
// or one that misjudged it): the server refuses — it still reaches its scheduler —
// and answers so; the barrier after it completes at the scheduler. Had the server
// followed, its arrival would go to the standby, which drops it: a timeout.
TEST(StandbyScheduler, NodeRefusesATakeoverWhileItsSchedulerLives) {
  const StandbyJob options;
  const int port = options.port;
  std::exception_ptr errors[4];
  std::atomic<Tap*> tap{nullptr};
  std::atomic<bool> sent{false};
  std::vector<std::thread> threads;
  testing::internal::CaptureStderr();
  threads.emplace_back([&] { RunNode(options(Role::kScheduler), &errors[0]); });
  threads.emplace_back(
      [&] { RunNode(Standby(options(Role::kScheduler)), &errors[1], Tapped(&tap)); });
  threads.emplace_back([&] {
    RunNode(
        options(Role::kServer), &errors[2], {},
        [&](Node& n) {
          n.Barrier(kServerGroup | kWorkerGroup, 10s);  // before the commit
          while (!sent) std::this_thread::sleep_for(10ms);
          std::this_thread::sleep_for(300ms);
          n.Barrier(kServerGroup | kWorkerGroup, 10s);  // after it
        },
        30s);
  });
  threads.emplace_back([&] {
    RunNode(
        options(Role::kWorker), &errors[3], {},
        [&](Node& n) {
          n.Barrier(kServerGroup | kWorkerGroup, 10s);
          Message m;  // what a standby that took over sends first
          m.h.control = static_cast<uint8_t>(Control::kTakeover);
          m.h.head = kTakeoverCommit;
          m.h.sender = kStandbyId;
          m.h.recver = ServerId(0);
          m.h.job = JobHash("127.0.0.1:" + std::to_string(port) + "/1w1s");
          tap.load()->Send(ServerId(0), Encode(m));
          sent = true;
          std::this_thread::sleep_for(300ms);
          n.Barrier(kServerGroup | kWorkerGroup, 10s);
        },
        30s);
  });
  const std::string log = JoinAll(&threads, errors);
  EXPECT_NE(log.find("refused the standby scheduler's takeover: the scheduler still answers here"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("took over"), std::string::npos) << log;
}
