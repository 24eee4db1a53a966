// DistServer with several shard threads, in one process (so ASan and TSan see it):
// a scheduler, one server and three workers as threads over TCP on 127.0.0.1. Every
// round each worker push-pulls single keys (spread over the shards), a multi-key
// request spanning shards (what fusion sends), and a value of several 1 MiB chunks
// (merged chunk-wise on the reducer's pool), with their requests issued in
// different orders by different workers; every answer must be the exact sum.
#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvstore/inprocess_job.h"
#include "pskv/error.h"

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

}  // namespace
}  // namespace pskv
