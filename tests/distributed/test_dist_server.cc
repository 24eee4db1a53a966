// DistServer with several shard threads, in one process (so ASan and TSan see it):
// a scheduler, one server and three workers as threads over TCP on 127.0.0.1. Every
// round each worker push-pulls single keys (spread over the shards), a multi-key
// request spanning shards (what fusion sends), and a value of several 1 MiB chunks
// (merged chunk-wise on the reducer's pool), with their requests issued in
// different orders by different workers; every answer must be the exact sum.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "pskv/error.h"
#include "pskv/optimizer.h"
#include "support/inprocess_job.h"

namespace pskv {
namespace {

using namespace std::chrono_literals;

// Shard threads, and chunked merges on the reducer's pool (bound 1000 elements).
Options ShardedServer(int server_threads) {
  Options o;
  o.server_threads = server_threads;
  o.reduction_threads = 2;
  o.bigarray_bound = 1000;
  o.stall_warning = 0ms;
  return o;
}

Frame Floats(int64_t n, float v) {
  auto a = std::make_shared<std::vector<float>>(static_cast<size_t>(n), v);
  Frame f;
  f.data = reinterpret_cast<const char*>(a->data());
  f.size = a->size() * 4;
  f.owner = a;
  return f;
}

// Waits for a count of callbacks (bounded).
struct Countdown {
  std::mutex mu;
  std::condition_variable cv;
  int left;
  std::exception_ptr err;
  explicit Countdown(int n) : left(n) {}
  KVWorker::Callback Callback() {
    return [this](std::exception_ptr e) {
      std::lock_guard<std::mutex> lk(mu);
      if (e && !err) err = e;
      if (--left == 0) cv.notify_all();
    };
  }
  void Wait() {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 60s, [&] { return left == 0; })) << left << " requests left";
    if (err) std::rethrow_exception(err);
  }
};

TEST(DistServerThreads, ShardedKeysMultiShardRequestsAndChunkedValuesSumExactly) {
  const int W = 3;
  InProcessDistJob job(ShardedServer(3), W);
  const uint64_t base = KVWorker::ServerRange(0, 1).first;
  const int cmd = dist::MakeCmd(dist::Kind::kDense, DType::kFloat32);
  const int init = dist::MakeCmd(dist::Kind::kInit, DType::kFloat32);
  const int64_t small = 64, big = 600000;  // big: 2.4 MB, three receive chunks
  std::vector<uint64_t> singles, multi;
  for (int k = 0; k < 9; ++k) singles.push_back(base + static_cast<uint64_t>(k));
  for (int k = 20; k < 28; ++k) multi.push_back(base + static_cast<uint64_t>(k));
  const uint64_t big_key = base + 100;
  {  // init from worker 0: the singles in one multi-key request, the rest one by one
    Countdown c(1 + static_cast<int>(multi.size()) + 1);
    std::vector<uint64_t> lens(singles.size(), small * 4);
    job.workers[0]->Push(singles, Floats(small * static_cast<int64_t>(singles.size()), 0), lens,
                         init, c.Callback());
    for (uint64_t k : multi)
      job.workers[0]->Push({k}, Floats(small, 0), {small * 4}, init, c.Callback());
    job.workers[0]->Push({big_key}, Floats(big, 0), {big * 4}, init, c.Callback());
    c.Wait();
  }
  const int rounds = 4;
  for (int round = 1; round <= rounds; ++round) {
    std::vector<std::vector<float>> single_out(static_cast<size_t>(W) * singles.size(),
                                               std::vector<float>(small));
    std::vector<std::vector<float>> multi_out(W, std::vector<float>(small * multi.size()));
    std::vector<std::vector<float>> big_out(W, std::vector<float>(big));
    Countdown c(W * static_cast<int>(singles.size() + 2));
    for (int w = 0; w < W; ++w) {
      KVWorker& kv = *job.workers[static_cast<size_t>(w)];
      const float v = static_cast<float>(w + 1);
      auto one = [&](size_t i) {
        kv.PushPull(
            {singles[i]}, Floats(small, v), {small * 4},
            reinterpret_cast<char*>(single_out[static_cast<size_t>(w) * singles.size() + i].data()),
            {small * 4}, cmd, c.Callback());
      };
      // Different orders on different workers: the rounds complete out of order.
      if (w % 2 == 0) {
        for (size_t i = 0; i < singles.size(); ++i) one(i);
      } else {
        for (size_t i = singles.size(); i-- > 0;) one(i);
      }
      std::vector<uint64_t> lens(multi.size(), small * 4);
      kv.PushPull(multi, Floats(small * static_cast<int64_t>(multi.size()), v), lens,
                  reinterpret_cast<char*>(multi_out[static_cast<size_t>(w)].data()), lens, cmd,
                  c.Callback());
      kv.PushPull({big_key}, Floats(big, v), {big * 4},
                  reinterpret_cast<char*>(big_out[static_cast<size_t>(w)].data()), {big * 4}, cmd,
                  c.Callback());
    }
    c.Wait();
    const float want = static_cast<float>(W * (W + 1) / 2);  // no optimizer: the round's sum
    int bad = 0;
    for (auto* outs : {&single_out, &multi_out, &big_out})
      for (auto& o : *outs)
        for (float x : o) bad += x != want;
    EXPECT_EQ(bad, 0) << "round " << round;
  }
}

// Priorities on the wire: with a one-message send window (PSKV_WIRE_WINDOW_BYTES=1)
// and 64 KiB messages, two workers push-pull two chunked keys in opposite orders in
// sync mode. Window credit released by the replies would deadlock (each window holds
// a chunk whose round needs a chunk queued behind the other's); credit released on
// receipt completes. Chunk keys outside the server's chunk range are refused.
TEST(DistServerWire, OneMessageWindowOppositeOrdersComplete) {
  const int W = 2;
  Options o = ShardedServer(2);
  o.wire_window_bytes = 1;
  o.wire_chunk_bytes = 65536;
  InProcessDistJob job(o, W);
  const int cmd = dist::MakeCmd(dist::Kind::kDense, DType::kFloat32);
  const int init = dist::MakeCmd(dist::Kind::kInit, DType::kFloat32);
  const int64_t per = 16384, chunks = 8;  // 8 chunks of 64 KiB per key
  auto keys_of = [&](int key) {
    std::vector<uint64_t> ks;
    for (int64_t c = 0; c < chunks; ++c)
      ks.push_back(dist::PsKey(dist::ChunkKey(key, static_cast<uint64_t>(c)), 0, 1));
    return ks;
  };
  const std::vector<uint64_t> lens(static_cast<size_t>(chunks), per * 4);
  {
    Countdown c(2);
    for (int key : {5, 6})
      job.workers[0]->Push(keys_of(key), Floats(per * chunks, 0), lens, init, c.Callback());
    c.Wait();
  }
  for (int round = 1; round <= 3; ++round) {
    std::vector<std::vector<float>> out(2 * W, std::vector<float>(per * chunks));
    Countdown c(2 * W);
    for (int w = 0; w < W; ++w) {
      const std::vector<int> order = w == 0 ? std::vector<int>{5, 6} : std::vector<int>{6, 5};
      for (size_t i = 0; i < order.size(); ++i)
        job.workers[static_cast<size_t>(w)]->PushPull(
            keys_of(order[i]), Floats(per * chunks, static_cast<float>(w + 1)), lens,
            reinterpret_cast<char*>(out[static_cast<size_t>(2 * w) + i].data()), lens, cmd,
            c.Callback());
    }
    c.Wait();
    int bad = 0;
    for (auto& v : out)
      for (float x : v) bad += x != 3.0f;  // no optimizer: the round's sum 1 + 2
    EXPECT_EQ(bad, 0) << "round " << round;
  }
  // A chunk index beyond the server's range is not one of its keys.
  const uint64_t hostile = dist::PsKey(dist::ChunkKey(5, dist::MaxChunks(1)), 0, 1);
  Countdown c(1);
  job.workers[0]->Push({hostile}, Floats(4, 1), {16}, init, c.Callback());
  EXPECT_THROW(c.Wait(), InvalidArgument);
  // A worker cutting the key into other chunks (another PSKV_WIRE_CHUNK_BYTES) gets
  // errors naming the setting: a chunk that does not exist, a chunk of another size.
  auto expect_hint = [&](uint64_t ps_key, int64_t floats) {
    Countdown one(1);
    job.workers[1]->Push({ps_key}, Floats(floats, 1), {static_cast<uint64_t>(floats) * 4}, cmd,
                         one.Callback());
    try {
      one.Wait();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("PSKV_WIRE_CHUNK_BYTES"), std::string::npos) << e.what();
    }
  };
  expect_hint(dist::PsKey(dist::ChunkKey(5, chunks), 0, 1), per);  // chunk 8 of 0..7
  expect_hint(dist::PsKey(dist::ChunkKey(5, 0), 0, 1), 2 * per);   // twice the size
}

// Wraps the server's transport: while closed, the answers to pulls (data replies
// carrying values) are held — frames, owners and all — instead of being sent, as a
// slow connection or a full ring would; Open() sends them.
class Gate {
 public:
  Node::TransportFactory Factory() {
    return [this](const TransportConfig& tc) {
      return std::make_unique<Wrapper>(this, CreateTransport(kNodeTransport, tc));
    };
  }
  void Close() {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  /// Sends what was held; returns how many messages.
  size_t Open() {
    std::vector<std::pair<int, std::vector<Frame>>> held;
    Transport* t;
    {
      std::lock_guard<std::mutex> lk(mu_);
      closed_ = false;
      held.swap(held_);
      t = inner_;
    }
    for (auto& [peer, frames] : held) t->Send(peer, std::move(frames));
    return held.size();
  }

 private:
  class Wrapper final : public Transport {
   public:
    Wrapper(Gate* g, std::unique_ptr<Transport> inner) : g_(g), inner_(std::move(inner)) {
      std::lock_guard<std::mutex> lk(g_->mu_);
      g_->inner_ = inner_.get();
    }
    std::string Bind(const std::string& h, int p) override { return inner_->Bind(h, p); }
    void Connect(int peer, const std::string& ep, uint64_t token) override {
      inner_->Connect(peer, ep, token);
    }
    void Disconnect(int peer) override { inner_->Disconnect(peer); }
    void Send(int peer, std::vector<Frame> frames) override {
      {
        std::lock_guard<std::mutex> lk(g_->mu_);
        if (g_->closed_ && IsPullAnswer(frames)) {
          g_->held_.emplace_back(peer, std::move(frames));
          return;
        }
      }
      inner_->Send(peer, std::move(frames));
    }
    bool Recv(Received* in, std::chrono::milliseconds t) override { return inner_->Recv(in, t); }
    std::chrono::steady_clock::time_point DownSince(int peer) override {
      return inner_->DownSince(peer);
    }
    void Close(std::chrono::milliseconds linger) override {
      {
        std::lock_guard<std::mutex> lk(g_->mu_);
        g_->held_.clear();
        g_->inner_ = nullptr;
      }
      inner_->Close(linger);
    }
    std::string Name() const override { return "gate(" + inner_->Name() + ")"; }

   private:
    static bool IsPullAnswer(const std::vector<Frame>& frames) {
      if (frames.empty() || frames[0].size != kHeaderSize || frames[0].gathered()) return false;
      Header h;
      std::memcpy(&h, frames[0].data, sizeof h);
      return h.control == static_cast<uint8_t>(Control::kData) && (h.flags & kPull) &&
             !(h.flags & (kRequest | kCommand | kError)) && h.vals_len > 0;
    }
    Gate* g_;
    std::unique_ptr<Transport> inner_;
  };
  std::mutex mu_;
  bool closed_ = false;
  std::vector<std::pair<int, std::vector<Frame>>> held_;
  Transport* inner_ = nullptr;
};

// An answer points at the stored values (a multi-key answer gathers them: no copy);
// the values must not change under it while it is on its way. Here every answer to a
// pull is held in the server's transport while later pushes change the keys — sync
// rounds without optimizer (the sum is swapped into the value, the old value becomes
// the next merge buffer), sync rounds with an optimizer and async pushes (updated in
// place) — and must still arrive with the values it was answered with, bit for bit.
TEST(DistServerAnswers, HeldAnswersKeepTheirValuesWhileLaterPushesChangeTheKeys) {
  const int64_t n = 64;  // floats per key
  const int K = 8;       // keys, over both shards: requests run exclusively
  const int cmd = dist::MakeCmd(dist::Kind::kDense, DType::kFloat32);
  const int init = dist::MakeCmd(dist::Kind::kInit, DType::kFloat32);
  const uint64_t base = KVWorker::ServerRange(0, 1).first;
  std::vector<uint64_t> keys;
  for (int k = 0; k < K; ++k) keys.push_back(base + 10 + static_cast<uint64_t>(k));
  const std::vector<uint64_t> lens(K, n * 4);
  enum Mode { kSyncSum, kSyncOptimizer, kAsyncOptimizer };
  for (Mode mode : {kSyncSum, kSyncOptimizer, kAsyncOptimizer}) {
    SCOPED_TRACE(mode == kSyncSum         ? "sync, no optimizer"
                 : mode == kSyncOptimizer ? "sync, sgd"
                                          : "async, sgd");
    Gate gate;
    InProcessDistJob job(ShardedServer(2), 1, gate.Factory());
    KVWorker& w = *job.workers[0];
    if (mode == kAsyncOptimizer) w.Command(dist::kSetMode, payload::EncodeMode(false), 60s);
    if (mode != kSyncSum)  // value += gradient
      w.Command(
          dist::kSetOptimizer,
          payload::EncodeOptimizer(OptimizerConfig::FromParams("sgd", {{"learning_rate", "-1"}})),
          60s);
    {
      Countdown c(1);
      w.Push(keys, Floats(n * K, 1), lens, init, c.Callback());
      c.Wait();
    }
    // What each key holds after pushes of `v` (sync without optimizer: the round's
    // sum; else the sum of every push so far, on top of the init value 1).
    float value = 1;
    auto pushed = [&](float v) { value = mode == kSyncSum ? v : value + v; };
    auto push = [&](float v) {
      Countdown c(1);
      w.Push(keys, Floats(n * K, v), lens, cmd, c.Callback());
      c.Wait();  // applied: its reply passes the gate
      pushed(v);
    };
    push(2);
    gate.Close();
    // A held answer of each kind: a push-pull (sync: answered when its round
    // completes) and a pull.
    std::vector<float> pp(static_cast<size_t>(n * K)), pl(static_cast<size_t>(n * K));
    Countdown held(2);
    float want_pp = value;
    if (mode != kAsyncOptimizer) {
      w.PushPull(keys, Floats(n * K, 10), lens, reinterpret_cast<char*>(pp.data()), lens, cmd,
                 held.Callback());
      pushed(10);
      want_pp = value;
    } else {
      held.Callback()(nullptr);  // async push-pulls answer at once: the pull covers it
    }
    w.Pull(keys, reinterpret_cast<char*>(pl.data()), lens, cmd, held.Callback());
    const float want_pl = value;
    // Later rounds while those answers wait: three, so that a buffer an answer points
    // at would be reused (value -> merge -> written by the next round's first push).
    for (float v : {100.0f, 1000.0f, 10000.0f}) push(v);
    ASSERT_EQ(gate.Open(), mode != kAsyncOptimizer ? 2u : 1u);
    held.Wait();
    int bad_pp = 0, bad_pl = 0;
    for (float x : pl) bad_pl += x != want_pl;
    if (mode != kAsyncOptimizer)
      for (float x : pp) bad_pp += x != want_pp;
    EXPECT_EQ(bad_pl, 0) << "a held pull answer changed (wanted " << want_pl << ", first " << pl[0]
                         << ")";
    EXPECT_EQ(bad_pp, 0) << "a held push-pull answer changed (wanted " << want_pp << ", first "
                         << pp[0] << ")";
    // And the keys hold the latest values.
    std::vector<float> now(static_cast<size_t>(n * K));
    Countdown c(1);
    w.Pull(keys, reinterpret_cast<char*>(now.data()), lens, cmd, c.Callback());
    c.Wait();
    int bad = 0;
    for (float x : now) bad += x != value;
    EXPECT_EQ(bad, 0) << "after the held answers";
  }
}

}  // namespace
}  // namespace pskv
