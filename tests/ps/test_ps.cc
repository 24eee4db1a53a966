// Parameter-server runtime with every node as a thread of this process.
#include <gtest/gtest.h>

#include <future>
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

namespace {

// A server that adds pushed float32 values into its store and answers pulls.
class AddServer {
 public:
  explicit AddServer(Node* node, std::function<void()> on_push = nullptr)
      : on_push_(std::move(on_push)),
        srv_(
            node, [this](KVRequest&& r, KVServer* s) { Handle(std::move(r), s); },
            [this](int, int head, const std::string& body) {
              return "server" + std::to_string(srv_.node()->rank()) + ":" + std::to_string(head) +
                     body;
            }) {}
  int pushes() const { return pushes_; }

 private:
  void Handle(KVRequest&& r, KVServer* s) {
    const Message& m = r.msg;
    std::vector<uint64_t> keys, lens;
    std::string out;
    size_t off = 0;
    for (uint32_t i = 0; i < m.num_keys(); ++i) {
      uint64_t k = m.key_ptr()[i], len = m.len_ptr()[i];
      if (r.push) {
        if (on_push_) on_push_();
        auto& v = store_[k];
        std::vector<float> in(len / 4);
        m.CopyVals(off, len, reinterpret_cast<char*>(in.data()));
        if (v.empty()) v.assign(len / 4, 0.0f);
        if (v.size() != len / 4) return s->RespondError(r, ErrorKind::kShape, "size changed");
        for (size_t j = 0; j < v.size(); ++j) v[j] += in[j];
        ++pushes_;
      }
      if (r.pull) {
        auto it = store_.find(k);
        if (it == store_.end())
          return s->RespondError(r, ErrorKind::kKey,
                                 "key " + std::to_string(k) + " not initialised");
        keys.push_back(k);
        lens.push_back(it->second.size() * 4);
        out.append(reinterpret_cast<const char*>(it->second.data()), it->second.size() * 4);
      }
      off += len;
    }
    s->Respond(r, keys, Frame::FromString(std::move(out)), lens);
  }
  std::map<uint64_t, std::vector<float>> store_;
  int pushes_ = 0;
  std::function<void()> on_push_;
  KVServer srv_;
};

// A callback that fulfils `p`.
KVWorker::Callback Done(std::shared_ptr<std::promise<void>> p) {
  return [p](std::exception_ptr e) {
    if (e)
      p->set_exception(e);
    else
      p->set_value();
  };
}

void Sync(std::function<void(KVWorker::Callback)> op) {
  auto p = std::make_shared<std::promise<void>>();
  auto f = p->get_future();
  op(Done(p));
  if (f.wait_for(30s) != std::future_status::ready) throw TimeoutError("test op timed out");
  f.get();
}

// PS_RESEND with the given timeout.
std::function<void(Options&)> WithResend(std::chrono::milliseconds timeout) {
  return [timeout](Options& o) {
    o.resend = true;
    o.resend_timeout = timeout;
  };
}

// Every node's transport wrapped in faults `fc`, each node with its own seed.
Node::TransportFactory Faulty(FaultConfig fc, uint64_t first_seed) {
  auto seed = std::make_shared<std::atomic<uint64_t>>(first_seed);
  return [fc, seed](const TransportConfig& tc) {
    FaultConfig c = fc;
    c.seed = (*seed)++;
    return CreateFaultTransport(CreateTransport("zmq", tc), c);
  };
}

// Two keys per server so that every request is sliced over all servers.
std::vector<uint64_t> TestKeys(int S) {
  std::vector<uint64_t> keys;
  for (int r = 0; r < S; ++r) {
    auto [b, e] = KVWorker::ServerRange(r, S);
    keys.push_back(b + 3);
    keys.push_back(b + 1000);
  }
  return keys;
}

struct JobResult {
  std::vector<std::exception_ptr> errors;
  std::vector<int> server_pushes;
};

using WorkerFn = std::function<void(Node&, KVWorker&)>;

JobResult RunJob(int S, int n, WorkerFn fn, std::function<void(Options&)> tweak = nullptr,
                 Node::TransportFactory tf = nullptr, std::function<void()> on_push = nullptr) {
  const int port = FreePort();
  JobResult res;
  res.errors.resize(static_cast<size_t>(1 + S + n));
  res.server_pushes.resize(static_cast<size_t>(S));
  std::vector<std::thread> threads;
  auto make = [&](Role role) {
    Options o = NodeOptions(role, port, S, n);
    if (tweak) tweak(o);
    auto node = std::make_unique<Node>(o);
    if (tf) node->SetTransportFactory(tf);
    return node;
  };
  threads.emplace_back([&] {
    try {
      auto node = make(Role::kScheduler);
      node->Start();
      node->Finalize(0ms);
    } catch (...) {
      res.errors[0] = std::current_exception();
    }
  });
  for (int s = 0; s < S; ++s)
    threads.emplace_back([&, s] {
      try {
        auto node = make(Role::kServer);
        AddServer server(node.get(), on_push);
        node->Start();
        node->Finalize(0ms);
        res.server_pushes[static_cast<size_t>(node->rank())] = server.pushes();
      } catch (...) {
        res.errors[static_cast<size_t>(1 + s)] = std::current_exception();
      }
    });
  for (int w = 0; w < n; ++w)
    threads.emplace_back([&, w] {
      try {
        auto node = make(Role::kWorker);
        KVWorker worker(node.get());
        node->Start();
        fn(*node, worker);
        node->Finalize(node->options().op_timeout);  // as the dist KVStore does
      } catch (...) {
        res.errors[static_cast<size_t>(1 + S + w)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return res;
}

void ExpectNoErrors(const JobResult& r) {
  for (auto& e : r.errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      ADD_FAILURE() << ex.what();
    }
  }
}

// Each worker pushes (rank+1) into every key for `rounds` rounds, with barriers,
// then pulls and checks sum over workers exactly.
void PushPullRounds(Node& node, KVWorker& w, int rounds) {
  const int S = node.num_servers(), n = node.num_workers();
  auto keys = TestKeys(S);
  const size_t per = 5;  // floats per key
  std::vector<uint64_t> lens(keys.size(), per * 4);
  std::vector<float> vals(keys.size() * per, static_cast<float>(node.rank() + 1));
  auto frame = Frame::Copy(vals.data(), vals.size() * 4);
  std::vector<float> out(vals.size());
  for (int r = 0; r < rounds; ++r) {
    Sync([&](auto cb) { w.Push(keys, frame, lens, 0, cb); });
    node.Barrier(kWorkerGroup, 30s);
    Sync([&](auto cb) { w.Pull(keys, reinterpret_cast<char*>(out.data()), lens, 0, cb); });
    const float want = static_cast<float>((r + 1) * n * (n + 1) / 2);
    for (float x : out) ASSERT_EQ(x, want);
    node.Barrier(kWorkerGroup, 30s);
  }
  // push-pull in one round trip: the answer includes this worker's own push
  Sync([&](auto cb) {
    w.PushPull(keys, frame, lens, reinterpret_cast<char*>(out.data()), lens, 0, cb);
  });
  for (float x : out) ASSERT_GE(x, static_cast<float>(rounds * n * (n + 1) / 2 + node.rank() + 1));
  node.Barrier(kWorkerGroup, 30s);
  Sync([&](auto cb) { w.Pull(keys, reinterpret_cast<char*>(out.data()), lens, 0, cb); });
  for (float x : out) ASSERT_EQ(x, static_cast<float>((rounds + 1) * n * (n + 1) / 2));
}

}  // namespace

class PsShapes : public ::testing::TestWithParam<std::pair<int, int>> {};
INSTANTIATE_TEST_SUITE_P(Threads, PsShapes,
                         ::testing::Values(std::make_pair(1, 1), std::make_pair(2, 2),
                                           std::make_pair(3, 4)));

TEST_P(PsShapes, PushPullBarrierExactValues) {
  auto [S, n] = GetParam();
  const int rounds = 3;
  auto res = RunJob(S, n, [&](Node& node, KVWorker& w) {
    EXPECT_GE(node.rank(), 0);
    EXPECT_LT(node.rank(), n);
    PushPullRounds(node, w, rounds);
  });
  ExpectNoErrors(res);
  // every server saw exactly (rounds + 1) pushes of each of its 2 keys per worker
  for (int p : res.server_pushes) EXPECT_EQ(p, (rounds + 1) * 2 * n);
}

TEST(Ps, LargeValuesCrossChunkBoundaries) {
  // 2.5 MiB + 12 bytes per key: values travel in several chunks both ways.
  auto res = RunJob(2, 2, [](Node& node, KVWorker& w) {
    auto keys = TestKeys(2);
    const size_t per = (5 << 18) + 3;
    std::vector<uint64_t> lens(keys.size(), per * 4);
    std::vector<float> vals(keys.size() * per);
    for (size_t i = 0; i < vals.size(); ++i)
      vals[i] = static_cast<float>(i % 1000) * (node.rank() + 1);
    Sync([&](auto cb) { w.Push(keys, Frame::Copy(vals.data(), vals.size() * 4), lens, 0, cb); });
    node.Barrier(kWorkerGroup, 30s);
    std::vector<float> out(vals.size());
    Sync([&](auto cb) { w.Pull(keys, reinterpret_cast<char*>(out.data()), lens, 0, cb); });
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_EQ(out[i], static_cast<float>(i % 1000) * 3) << i;  // ranks 1 + 2
    node.Barrier(kWorkerGroup, 30s);
  });
  ExpectNoErrors(res);
}

TEST(Ps, ScatteredAnswersLandInEachKeysOwnOutput) {
  // Pull and PushPull with one output per key (a fused call's answer, scattered):
  // keys of 2 servers, of different sizes, a request cut into several messages
  // (wire chunks of 64 KiB) and keys crossing the 1 MiB chunks of a message.
  auto res = RunJob(
      2, 2,
      [](Node& node, KVWorker& w) {
        std::vector<uint64_t> keys, lens;
        for (int r = 0; r < 2; ++r) {
          const uint64_t b = KVWorker::ServerRange(r, 2).first;
          for (uint64_t k = 0; k < 40; ++k) {
            keys.push_back(b + 7 + k);
            lens.push_back(4 * (k == 5 ? (300 << 10) + 1 : 1 + 997 * (k % 13)));  // floats
          }
        }
        uint64_t total = 0;
        for (auto l : lens) total += l;
        std::vector<float> vals(total / 4);
        for (size_t i = 0; i < vals.size(); ++i)
          vals[i] = static_cast<float>(i % 4099) * static_cast<float>(node.rank() + 1);
        const Frame frame = Frame::Copy(vals.data(), total);
        // Each key's output is its own allocation, one float bigger than the key: a
        // write past it would show.
        auto outputs = [&] {
          std::vector<std::vector<float>> o;
          for (auto l : lens) o.emplace_back(l / 4 + 1, -1.0f);
          return o;
        };
        auto pointers = [](std::vector<std::vector<float>>& o) {
          std::vector<char*> p;
          for (auto& v : o) p.push_back(reinterpret_cast<char*>(v.data()));
          return p;
        };
        auto expect = [&](const std::vector<std::vector<float>>& o, float times) {
          size_t at = 0;
          for (size_t k = 0; k < o.size(); ++k) {
            const size_t n = lens[k] / 4;
            for (size_t i = 0; i < n; ++i)
              ASSERT_EQ(o[k][i], static_cast<float>((at + i) % 4099) * times) << k << " " << i;
            ASSERT_EQ(o[k][n], -1.0f) << "written past key " << k;
            at += n;
          }
        };
        Sync([&](auto cb) { w.Push(keys, frame, lens, 0, cb); });
        node.Barrier(kWorkerGroup, 30s);
        auto pulled = outputs();
        Sync([&](auto cb) { w.Pull(keys, pointers(pulled), lens, 0, cb); });
        expect(pulled, 3);  // ranks 1 + 2
        node.Barrier(kWorkerGroup, 30s);
        auto both = outputs();
        Sync([&](auto cb) { w.PushPull(keys, frame, lens, pointers(both), lens, 0, cb); });
        node.Barrier(kWorkerGroup, 30s);
        Sync([&](auto cb) { w.Pull(keys, pointers(both), lens, 0, cb); });
        expect(both, 6);
        EXPECT_EQ(w.Pending(), 0u);
      },
      [](Options& o) { o.wire_chunk_bytes = 64 << 10; });
  ExpectNoErrors(res);
}

TEST(Ps, CommandsReachEveryServer) {
  auto res = RunJob(3, 1, [](Node&, KVWorker& w) {
    auto bodies = w.Command(7, "x", 10s);
    ASSERT_EQ(bodies.size(), 3u);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(bodies[r], "server" + std::to_string(r) + ":7x");
    EXPECT_EQ(w.Pending(), 0u);
  });
  ExpectNoErrors(res);
}

TEST(Ps, ServerErrorsArriveTyped) {
  auto res = RunJob(2, 1, [](Node&, KVWorker& w) {
    auto keys = TestKeys(2);
    std::vector<uint64_t> lens(keys.size(), 4);
    std::vector<float> out(keys.size());
    try {
      Sync([&](auto cb) { w.Pull(keys, reinterpret_cast<char*>(out.data()), lens, 0, cb); });
      ADD_FAILURE() << "pull of unknown keys must fail";
    } catch (const KeyError& e) {
      EXPECT_NE(std::string(e.what()).find("not initialised"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("server["), std::string::npos);
    }
    EXPECT_EQ(w.Pending(), 0u);
  });
  ExpectNoErrors(res);
}

// Two workers that would cut keys into different chunks (PSKV_WIRE_CHUNK_BYTES, and
// PSKV_LINK_RATE on for one only): every node fails at startup with a ConfigError
// naming both settings, instead of rounds that wait for chunks nobody else pushes.
TEST(Ps, WorkersThatCutKeysDifferentlyFailEveryNodeAtStartup) {
  for (int variant = 0; variant < 2; ++variant) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto started = test::StartAtOnce(FreePort(), 1, 2, [&](int i, Options& o) {
      if (i == 3 && variant == 0) o.wire_chunk_bytes = 64 << 10;
      if (i == 3 && variant == 1) o.link_rate = 12'500'000;
    });
    std::vector<std::string> errors;
    for (auto& s : started)
      errors.push_back(
          (s.error && !test::Threw<ConfigError>(s.error) ? "not a ConfigError: " : "") + s.what);
    const std::string differ = variant == 0 ? "PSKV_WIRE_CHUNK_BYTES=65536" : "PSKV_LINK_RATE=on";
    for (auto& e : errors) {
      EXPECT_NE(e.find("the workers of this job cut their keys differently"), std::string::npos)
          << e;
      EXPECT_NE(e.find(differ), std::string::npos) << e;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  }
}

TEST(Ps, RegistrationTimeoutSaysWhatIsMissing) {
  const int port = FreePort();
  auto opts = [&](Role r) {
    Options o = NodeOptions(r, port, 1, 2);
    o.register_timeout = 1500ms;
    return o;
  };
  std::string sched_err, worker_err;
  std::thread sched([&] {
    Node n(opts(Role::kScheduler));
    try {
      n.Start();
    } catch (const TimeoutError& e) {
      sched_err = e.what();
    }
  });
  std::thread server([&] {
    Node n(opts(Role::kServer));
    try {
      n.Start();
    } catch (const Error& e) {
      worker_err = e.what();
    }
  });
  std::thread worker([&] {
    Node n(opts(Role::kWorker));
    try {
      n.Start();
    } catch (const Error&) {
    }
  });
  sched.join();
  server.join();
  worker.join();
  EXPECT_NE(sched_err.find("1 of 2 workers"), std::string::npos) << sched_err;
  EXPECT_NE(sched_err.find("1 of 1 servers"), std::string::npos) << sched_err;
  // the registered nodes hear the reason instead of waiting for their own timeout
  EXPECT_NE(worker_err.find("1 of 2 workers"), std::string::npos) << worker_err;
}

TEST(Ps, UnreachableSchedulerIsNamed) {
  Options o = NodeOptions(Role::kWorker, FreePort(), 1, 1);
  o.register_timeout = 1000ms;
  Node n(o);
  auto t0 = std::chrono::steady_clock::now();
  try {
    n.Start();
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("not reachable"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(o.root_port)),
              std::string::npos);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
}

TEST(Ps, StrangerFromAnotherJobIsRefused) {
  const int port = FreePort();
  std::promise<void> ready, done;
  auto done_f = done.get_future().share();
  std::thread job([&] {
    Node sched(NodeOptions(Role::kScheduler, port, 1, 1));
    Node server(NodeOptions(Role::kServer, port, 1, 1));
    Node worker(NodeOptions(Role::kWorker, port, 1, 1));
    std::thread a([&] { sched.Start(); });
    std::thread b([&] { server.Start(); });
    worker.Start();
    a.join();
    b.join();
    ready.set_value();
    done_f.wait();
    std::thread c([&] { sched.Finalize(0ms); });
    std::thread d([&] { server.Finalize(0ms); });
    worker.Finalize(10s);
    c.join();
    d.join();
  });
  ready.get_future().wait();
  Options o = NodeOptions(Role::kWorker, port, 1, 1);
  o.job_id = "some-other-job";
  o.register_timeout = 5s;
  Node stranger(o);
  try {
    stranger.Start();
    ADD_FAILURE() << "a node of another job must be refused";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("another job"), std::string::npos) << e.what();
  }
  // A node of the same job arriving after the job is complete is refused too.
  Node extra(NodeOptions(Role::kWorker, port, 1, 1));
  EXPECT_THROW(extra.Start(), ProtocolError);
  done.set_value();
  job.join();
}

TEST(Ps, ResendDeliversExactlyOnceThroughDropsDuplicatesAndDelays) {
  FaultConfig fc;
  fc.disturb = CoveredByResend;
  fc.drop = 0.15;
  fc.duplicate = 0.15;
  fc.delay = 0.15;
  fc.delay_time = 30ms;
  const int rounds = 4;
  auto res = RunJob(
      2, 2, [&](Node& node, KVWorker& w) { PushPullRounds(node, w, rounds); }, WithResend(40ms),
      Faulty(fc, 1));
  ExpectNoErrors(res);
  for (int p : res.server_pushes) EXPECT_EQ(p, (rounds + 1) * 2 * 2);  // no push applied twice
}

// A resent message must not overtake the ones sent after it: a push that was
// dropped and resent, and the pull issued right behind it, must be applied in
// that order (the receiver holds messages that arrive after a gap until it is
// filled). Without that, the pull returned the value from before the push.
TEST(Ps, ResendKeepsEachSendersOrder) {
  FaultConfig fc;
  fc.disturb = CoveredByResend;
  fc.drop = 0.3;
  auto res = RunJob(
      1, 1,
      [&](Node&, KVWorker& w) {
        std::vector<uint64_t> keys{9}, lens{4};
        for (int i = 1; i <= 40; ++i) {
          float one = 1, out = -1;
          auto pushed = std::make_shared<std::promise<void>>();
          auto pulled = std::make_shared<std::promise<void>>();
          // Both in flight at once: the pull must see the push.
          w.Push(keys, Frame::Copy(&one, 4), lens, 0, Done(pushed));
          w.Pull(keys, reinterpret_cast<char*>(&out), lens, 0, Done(pulled));
          auto f1 = pushed->get_future(), f2 = pulled->get_future();
          ASSERT_EQ(f1.wait_for(30s), std::future_status::ready);
          ASSERT_EQ(f2.wait_for(30s), std::future_status::ready);
          f1.get();
          f2.get();
          ASSERT_EQ(out, static_cast<float>(i)) << "iteration " << i;
        }
      },
      WithResend(30ms), Faulty(fc, 7));
  ExpectNoErrors(res);
}

TEST(Ps, WithoutResendDuplicatesWouldBeAppliedTwice) {
  // The control for the test above: the same fault mix without PS_RESEND breaks
  // the values (or the run), so the resend test is not passing by luck.
  FaultConfig fc;
  fc.disturb = CoveredByResend;
  fc.duplicate = 1.0;
  auto res = RunJob(
      1, 1,
      [&](Node& node, KVWorker& w) {
        std::vector<uint64_t> keys{5}, lens{4};
        float one = 1;
        Sync([&](auto cb) { w.Push(keys, Frame::Copy(&one, 4), lens, 0, cb); });
        float out = 0;
        Sync([&](auto cb) { w.Pull(keys, reinterpret_cast<char*>(&out), lens, 0, cb); });
        EXPECT_EQ(out, 2.0f);  // the duplicated push was applied twice
      },
      nullptr,
      [&](const TransportConfig& tc) {
        return CreateFaultTransport(CreateTransport("zmq", tc), fc);
      });
  (void)res;
}

// ------------------------------------------------------------------ liveness

// A server busy in a handler for longer than the heartbeat timeout (a big merge,
// a slow optimizer) neither is declared dead nor declares the healthy scheduler
// dead: silence is counted only while a node listens.
TEST(Liveness, BusyServerIsNotAFailure) {
  std::atomic<bool> slept{false};
  auto res = RunJob(
      1, 1, [&](Node& node, KVWorker& w) { PushPullRounds(node, w, 2); }, nullptr, nullptr,
      [&] {
        if (!slept.exchange(true)) std::this_thread::sleep_for(3s);  // > heartbeat timeout 2 s
      });
  ExpectNoErrors(res);
  EXPECT_TRUE(slept);
}

// A worker that finishes long before the others (rank 0 evaluating) waits at
// the final barrier however long PSKV_TIMEOUT is: it is done, not failed.
// Many short handlers back to back (each shorter than the heartbeat interval,
// together longer than the heartbeat timeout) are busy time too: the scheduler's
// heartbeats queued behind them are not its silence.
TEST(Liveness, ManyShortHandlersAreNotAFailure) {
  std::atomic<int> pushes{0};
  auto res = RunJob(
      1, 1,
      [&](Node&, KVWorker& w) {
        std::vector<std::shared_ptr<std::promise<void>>> ps;
        std::vector<std::future<void>> fs;
        for (int i = 0; i < 25; ++i) {  // all queued at the server at once
          auto p = std::make_shared<std::promise<void>>();
          fs.push_back(p->get_future());
          std::vector<uint64_t> keys{static_cast<uint64_t>(100 + i)}, lens{4};
          float one = 1;
          w.Push(keys, Frame::Copy(&one, 4), lens, 0, Done(p));
        }
        for (auto& f : fs) {
          ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
          f.get();
        }
      },
      nullptr, nullptr,
      [&] {
        ++pushes;
        std::this_thread::sleep_for(150ms);  // < interval 200 ms; 25 x 150 ms > timeout 2 s
      });
  ExpectNoErrors(res);
  EXPECT_EQ(pushes.load(), 25);
}

TEST(Liveness, EarlyFinisherWaitsForTheRestOfTheJob) {
  auto res = RunJob(
      1, 2,
      [&](Node& node, KVWorker& w) {
        PushPullRounds(node, w, 1);
        if (node.rank() == 1) std::this_thread::sleep_for(3s);  // 3x PSKV_TIMEOUT
      },
      [](Options& o) { o.op_timeout = 1s; });
  ExpectNoErrors(res);
}

// PS_RESEND=1 survives a worker<->server partition shorter than the heartbeat
// timeout (before: gave up after 10 resends, ~1.1 s at a 100 ms resend timeout).
TEST(Liveness, ResendSurvivesAPartitionShorterThanTheHeartbeatTimeout) {
  FaultConfig fc;
  fc.disturb = CoveredByResend;
  fc.partition_peers = {ServerId(0), WorkerId(0)};
  fc.partition_from = std::chrono::steady_clock::now() + 1500ms;
  fc.partition_for = 2500ms;
  auto res = RunJob(
      1, 1,
      [&](Node& node, KVWorker& w) {
        std::this_thread::sleep_until(fc.partition_from + 200ms);
        PushPullRounds(node, w, 2);  // starts inside the partition
      },
      [](Options& o) {
        o.resend = true;
        o.resend_timeout = 100ms;
        o.heartbeat_timeout = 5s;
      },
      [&](const TransportConfig& tc) {
        return CreateFaultTransport(CreateTransport("zmq", tc), fc);
      });
  ExpectNoErrors(res);
}

// A worker that cannot reach a server (the scheduler still hears from both)
// fails within heartbeat timeout + interval, naming the server, instead of
// waiting for PSKV_TIMEOUT.
TEST(Liveness, LostConnectionToAServerIsNamedWithinTheBound) {
  FaultConfig fc;
  fc.disturb = CoveredByResend;
  fc.partition_peers = {ServerId(0)};
  // Late enough for the job to have started even under TSan on a loaded machine
  // (the partition must begin while the worker pushes, not during registration).
  fc.partition_from = std::chrono::steady_clock::now() + 4000ms;
  fc.partition_for = 60s;
  fc.partition_reports_down = true;
  std::string seen;
  auto res = RunJob(
      1, 1,
      [&](Node& node, KVWorker& w) {
        std::this_thread::sleep_until(fc.partition_from + 100ms);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          PushPullRounds(node, w, 1);
          ADD_FAILURE() << "a push to an unreachable server must fail";
        } catch (const NodeFailure& e) {
          seen = e.what();
          EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "not within the bound";
        }
      },
      [](Options& o) {
        o.op_timeout = 30s;
        // The partition also drops the scheduler's messages to server 0, which would
        // declare the scheduler dead at its own heartbeat timeout and exit; the
        // scheduler, seeing its port closed, would then name it dead first (about as
        // soon as the worker's bound). The server waits longer: the worker's verdict
        // on the lost connection is the one under test.
        if (o.role == Role::kServer) o.heartbeat_timeout = 8s;
      },
      [&](const TransportConfig& tc) {
        return CreateFaultTransport(CreateTransport("zmq", tc), fc);
      });
  EXPECT_NE(seen.find("cannot reach server[0]"), std::string::npos) << seen;
}

// A barrier that waits too long says, on the scheduler, which nodes it waits for.
TEST(Liveness, StalledBarrierNamesTheMissingNodes) {
  testing::internal::CaptureStderr();
  auto res = RunJob(
      1, 2,
      [&](Node& node, KVWorker&) {
        if (node.rank() == 1) std::this_thread::sleep_for(1500ms);
        node.Barrier(kWorkerGroup, 30s);
      },
      [](Options& o) { o.stall_warning = 400ms; });
  const std::string err = testing::internal::GetCapturedStderr();
  ExpectNoErrors(res);
  EXPECT_NE(err.find("scheduler: barrier of group 4: waiting for worker[1] at 127.0.0.1:"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("worker[0]: waiting at a barrier for"), std::string::npos) << err;
}

TEST(Ps, AMovedLinkRateReachesEveryNodeWithinAWindowNotAHeartbeat) {
  // Heartbeats every 5 s: the job's link rate (ps/link_rate_share.h) does not wait for
  // them. A node whose estimate moved sends it at once, and the scheduler sends a new
  // rate for the job to every node whose estimate counts, so that they change together.
  const auto job_rate = [](Node& node, uint64_t want) {
    const auto until = std::chrono::steady_clock::now() + 3s;
    while (node.link_rates().Job() != want && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(10ms);
    return node.link_rates().Job();
  };
  const auto r = RunJob(
      1, 2,
      [&](Node& node, KVWorker&) {
        node.Barrier(kWorkerGroup, 30s);
        if (node.rank() == 0) {
          node.link_rates().Report(10'000'000);  // its start-up ended
          EXPECT_EQ(job_rate(node, 10'000'000), 10'000'000u);
        }
        node.Barrier(kWorkerGroup, 30s);
        if (node.rank() == 1) node.link_rates().Report(14'000'000);
        // The median of 10 and 14 MB/s (the upper of two), on both, within 3 s of a 5 s
        // interval.
        EXPECT_EQ(job_rate(node, 14'000'000), 14'000'000u) << node.rank();
        node.Barrier(kWorkerGroup, 30s);
      },
      [](Options& o) {
        o.heartbeat_interval = 5s;
        o.heartbeat_timeout = 60s;
      });
  ExpectNoErrors(r);
}

TEST(Ps, TimedOutRequestIsCancelledAndItsLateReplyDropped) {
  // The server answers a pull after 300 ms; the worker's wait gives up after 100 ms.
  // The request must be cancelled: its late reply is dropped instead of being copied
  // into the (by then freed) output buffer — under ASan a write would be reported.
  const int port = FreePort();
  std::exception_ptr sched_err, server_err;
  std::thread sched([&] {
    try {
      Node n(NodeOptions(Role::kScheduler, port, 1, 1));
      n.Start();
      n.Finalize(0ms);
    } catch (...) {
      sched_err = std::current_exception();
    }
  });
  std::thread server([&] {
    try {
      Node n(NodeOptions(Role::kServer, port, 1, 1));
      KVServer srv(
          &n,
          [](KVRequest&& r, KVServer* s) {
            std::this_thread::sleep_for(300ms);
            std::vector<float> v(4, 7.0f);
            s->Respond(r, {r.msg.key_ptr()[0]}, Frame::Copy(v.data(), 16), {16});
          },
          nullptr);
      n.Start();
      n.Finalize(0ms);
    } catch (...) {
      server_err = std::current_exception();
    }
  });
  {
    Node n(NodeOptions(Role::kWorker, port, 1, 1));
    KVWorker w(&n);
    n.Start();
    const std::vector<uint64_t> keys{5}, lens{16};
    auto out = std::make_unique<std::vector<float>>(4, 0.0f);
    auto done = std::make_shared<Completion>();
    auto ts =
        w.Pull(keys, reinterpret_cast<char*>(out->data()), lens, 0, Completion::Callback(done));
    try {
      w.Await(ts, done, 100ms, 0ms, "test pull");
      ADD_FAILURE() << "the pull did not time out";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("server[0]"), std::string::npos) << e.what();
    }
    EXPECT_EQ(w.Pending(), 0u);  // cancelled
    out.reset();
    std::this_thread::sleep_for(600ms);  // the late reply arrives and is dropped
    EXPECT_EQ(w.Pending(), 0u);
    // The connection still works: a pull with enough time succeeds.
    std::vector<float> again(4, 0.0f);
    auto done2 = std::make_shared<Completion>();
    auto ts2 =
        w.Pull(keys, reinterpret_cast<char*>(again.data()), lens, 0, Completion::Callback(done2));
    w.Await(ts2, done2, 10s, 0ms, "test pull");
    EXPECT_EQ(again[0], 7.0f);
    n.Finalize(30s);
  }
  sched.join();
  server.join();
  EXPECT_FALSE(sched_err);
  EXPECT_FALSE(server_err);
}
