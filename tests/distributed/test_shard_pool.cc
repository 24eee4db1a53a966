// ShardPool alone: FIFO order per shard, parallel shards, exclusive sections,
// back-pressure (task and byte bounds) and shutdown. Tasks that block wait on a Gate
// the test opens; nothing waits "long enough".
#include "kvstore/distributed/server/shard_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace pskv {
namespace {

using namespace std::chrono_literals;

// A latch that tasks wait on until the test opens it (bounded: a broken pool fails
// the test instead of hanging it).
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool Wait(std::chrono::milliseconds limit = 20s) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, limit, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

struct Task {
  int seq = 0;
  Gate* gate = nullptr;  // if set, the task waits for it
};

TEST(ShardPool, EachShardRunsItsTasksInSubmissionOrder) {
  constexpr int kShards = 4, kTasks = 2000;
  std::vector<std::vector<int>> seen(kShards);  // each written by its shard's thread only
  ShardPool<Task> pool(kShards, {}, [&](size_t shard, Task&& t) { seen[shard].push_back(t.seq); });
  ASSERT_EQ(pool.size(), size_t{kShards});
  for (int i = 0; i < kTasks; ++i) pool.Submit(static_cast<size_t>(i * 7 % kShards), {i}, 1);
  pool.Exclusive([&] {
    size_t total = 0;
    for (int s = 0; s < kShards; ++s) {
      total += seen[s].size();
      for (size_t j = 1; j < seen[s].size(); ++j) EXPECT_LT(seen[s][j - 1], seen[s][j]);
      for (int v : seen[s]) EXPECT_EQ(v * 7 % kShards, s);
    }
    EXPECT_EQ(total, size_t{kTasks});
  });
}

TEST(ShardPool, ShardsRunInParallel) {
  // Shard 0's task waits for shard 1's: it only ends if both run at once.
  Gate second_ran;
  std::atomic<bool> first_saw{false};
  ShardPool<Task> pool(2, {}, [&](size_t shard, Task&&) {
    if (shard == 0)
      first_saw = second_ran.Wait();
    else
      second_ran.Open();
  });
  pool.Submit(0, {}, 0);
  pool.Submit(1, {}, 0);
  pool.Exclusive([] {});
  EXPECT_TRUE(first_saw);
}

TEST(ShardPool, ExclusiveSeesEveryEarlierTaskDoneAndNoTaskRunsDuringIt) {
  std::atomic<int> running{0}, done{0};
  std::atomic<bool> in_exclusive{false}, overlapped{false};
  ShardPool<Task> pool(3, {}, [&](size_t, Task&&) {
    if (in_exclusive) overlapped = true;
    ++running;
    std::this_thread::yield();
    --running;
    ++done;
  });
  for (int i = 0; i < 300; ++i) pool.Submit(static_cast<size_t>(i % 3), {i}, 1);
  std::thread late;
  pool.Exclusive([&] {
    in_exclusive = true;
    EXPECT_EQ(running.load(), 0);
    EXPECT_EQ(done.load(), 300);
    // A Submit from another thread waits for the section to end.
    late = std::thread([&] { pool.Submit(0, {}, 1); });
    std::this_thread::sleep_for(20ms);  // gives `late` the chance to get in, if it could
    EXPECT_EQ(done.load(), 300);
    in_exclusive = false;
  });
  late.join();
  pool.Exclusive([&] { EXPECT_EQ(done.load(), 301); });
  EXPECT_FALSE(overlapped);
}

TEST(ShardPool, ExclusiveReturnsTheValueOfItsFunction) {
  ShardPool<Task> pool(2, {}, [](size_t, Task&&) {});
  EXPECT_EQ(pool.Exclusive([] { return 42; }), 42);
}

// Fills shard 0 behind a task blocked on `gate`: one running, `queued` waiting.
void FillBehindGate(ShardPool<Task>& pool, Gate& gate, int queued, uint64_t bytes,
                    std::atomic<int>& started) {
  pool.Submit(0, {0, &gate}, 0);
  while (started.load() == 0) std::this_thread::yield();  // it left the queue
  for (int i = 1; i <= queued; ++i) pool.Submit(0, {i}, bytes);
}

TEST(ShardPool, AFullShardMakesSubmitWaitForRoom) {
  std::atomic<int> started{0};
  ShardPool<Task> pool(2, {4, uint64_t{1} << 30}, [&](size_t, Task&& t) {
    ++started;
    if (t.gate) {
      EXPECT_TRUE(t.gate->Wait());
    }
  });
  Gate gate;
  FillBehindGate(pool, gate, 4, 1, started);  // 4 queued: the bound
  std::atomic<bool> returned{false};
  std::thread extra([&] {
    pool.Submit(0, {5}, 1);
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(returned) << "a fifth queued task was admitted to a shard bounded at 4";
  gate.Open();
  extra.join();
  EXPECT_TRUE(returned);
  pool.Exclusive([&] { EXPECT_EQ(started.load(), 6); });
}

TEST(ShardPool, TheByteBoundAdmitsOneBigTaskToAnEmptyQueueOnly) {
  std::atomic<int> started{0};
  ShardPool<Task> pool(2, {100, 10}, [&](size_t, Task&& t) {
    ++started;
    if (t.gate) {
      EXPECT_TRUE(t.gate->Wait());
    }
  });
  Gate gate;
  FillBehindGate(pool, gate, 1, 1000, started);  // 1000 bytes > the bound: admitted (empty)
  std::atomic<bool> returned{false};
  std::thread extra([&] {
    pool.Submit(0, {2}, 1);
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(returned) << "a task was queued behind more bytes than the bound";
  gate.Open();
  extra.join();
  pool.Exclusive([&] { EXPECT_EQ(started.load(), 3); });
}

TEST(ShardPool, StopDropsQueuedTasksAndReleasesAWaitingSubmit) {
  std::atomic<int> started{0};
  ShardPool<Task> pool(2, {2, uint64_t{1} << 30}, [&](size_t, Task&& t) {
    ++started;
    if (t.gate) {
      EXPECT_TRUE(t.gate->Wait());
    }
  });
  Gate gate;
  FillBehindGate(pool, gate, 2, 1, started);
  std::thread waiting([&] { pool.Submit(0, {3}, 1); });  // the shard is full: it waits
  std::thread stopper([&] { pool.Stop(); });             // joins the blocked task's thread
  waiting.join();  // released by Stop, before the blocked task ends
  gate.Open();
  stopper.join();
  EXPECT_EQ(started.load(), 1) << "queued tasks ran after Stop";
  pool.Stop();                                     // idempotent
  EXPECT_EQ(pool.Exclusive([] { return 7; }), 7);  // a stopped pool does not block
}

TEST(ShardPool, OneShardRunsTasksInTheCallersThread) {
  std::thread::id ran_on;
  int ran = 0;
  ShardPool<Task> pool(1, {}, [&](size_t shard, Task&&) {
    EXPECT_EQ(shard, 0u);
    ran_on = std::this_thread::get_id();
    ++ran;
  });
  pool.Submit(0, {}, 0);
  EXPECT_EQ(ran, 1);  // already done when Submit returns
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(ShardPool, SizeForARequestedThreadCount) {
  EXPECT_EQ(ShardPoolSize(3), 3);
  EXPECT_GE(ShardPoolSize(0), 1);
  EXPECT_LE(ShardPoolSize(0), 8);
  EXPECT_EQ(ShardPoolSize(-1), ShardPoolSize(0));
}

}  // namespace
}  // namespace pskv
