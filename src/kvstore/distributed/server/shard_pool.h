// ShardPool<Task>: a keyed FIFO executor with exclusive sections and back-pressure.
//
// The pool has N shards. A caller picks a task's shard (DistServer: a hash of the
// wire key, so one key always lands on one shard) and Submit()s it there; each shard
// runs its tasks one at a time, in submission order, on its own thread. Tasks of
// different shards run in parallel.
//
// Exclusive(fn) runs fn with every shard drained and idle and nothing else being
// submitted: it takes the pool's exclusive lock (which Submit also holds while it
// queues) and waits until every shard's queue is empty and no task runs. Tasks must
// therefore hold finite work (never wait for another task or for Exclusive), or an
// exclusive section waits forever.
//
// Back-pressure: a shard holds at most Limits::max_tasks queued tasks and
// Limits::max_bytes of queued task bytes (the weight the caller gives each task);
// Submit waits for room while its shard is full. A task is always admitted to an
// empty queue, whatever its weight, so a single big task never waits forever.
//
// One shard (`shards == 1`) means no thread at all: Submit runs the task itself, in
// the caller's thread, as an exclusive section (no hand-off, no wake-up).
//
// Stop() (and the destructor) wakes and joins the shard threads; tasks still queued
// are destroyed unrun, and a Submit waiting for room returns (its task is dropped
// with the queue). Thread-safety: Submit and Exclusive from any threads except the
// shard threads themselves; the runner is called on shard threads (or inline) and
// must not throw.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pskv {

/// The shard count for a requested thread count: `requested` if positive, else the
/// hardware's concurrency clamped to [1, 8].
int ShardPoolSize(int requested);

template <typename Task>
class ShardPool {
 public:
  struct Limits {
    size_t max_tasks = 256;
    uint64_t max_bytes = uint64_t{256} << 20;
  };
  /// Runs one task of shard `shard`. Must not throw.
  using Runner = std::function<void(size_t shard, Task&& task)>;

  ShardPool(int shards, Limits limits, Runner run) : limits_(limits), run_(std::move(run)) {
    for (int i = 0; i < std::max(shards, 1); ++i) shards_.push_back(std::make_unique<Shard>());
    if (shards_.size() == 1) return;  // inline: Submit runs tasks itself
    for (size_t i = 0; i < shards_.size(); ++i)
      shards_[i]->thread = std::thread([this, i] { Loop(i); });
  }
  ~ShardPool() { Stop(); }
  ShardPool(const ShardPool&) = delete;
  ShardPool& operator=(const ShardPool&) = delete;

  size_t size() const { return shards_.size(); }

  /// Queues `task` of weight `bytes` on `shard` (< size()), waiting while that shard
  /// is full; with one shard, runs it now as an exclusive section.
  void Submit(size_t shard, Task&& task, uint64_t bytes) {
    std::lock_guard<std::mutex> excl(excl_mu_);
    if (shards_.size() == 1) return run_(0, std::move(task));
    Shard& sh = *shards_[shard];
    {
      std::unique_lock<std::mutex> lk(sh.mu);
      sh.space.wait(lk, [&] {
        return sh.stop || sh.tasks.empty() ||
               (sh.tasks.size() < limits_.max_tasks && sh.queued_bytes < limits_.max_bytes);
      });
      sh.queued_bytes += bytes;
      sh.tasks.push_back({std::move(task), bytes});
    }
    sh.work.notify_one();
  }

  /// Runs fn() with every shard drained and idle, and no Submit in progress; returns
  /// what fn returns.
  template <typename F>
  auto Exclusive(F&& fn) {
    std::lock_guard<std::mutex> excl(excl_mu_);
    for (auto& sh : shards_) {
      std::unique_lock<std::mutex> lk(sh->mu);
      sh->idle.wait(lk, [&] { return sh->stop || (sh->tasks.empty() && !sh->busy); });
    }
    return fn();
  }

  /// Stops and joins the shard threads; queued tasks are dropped. Idempotent.
  void Stop() {
    for (auto& sh : shards_) {
      {
        std::lock_guard<std::mutex> lk(sh->mu);
        sh->stop = true;
      }
      sh->work.notify_all();
      sh->space.notify_all();
      sh->idle.notify_all();
    }
    for (auto& sh : shards_)
      if (sh->thread.joinable()) sh->thread.join();
  }

 private:
  struct Queued {
    Task task;
    uint64_t bytes;
  };
  struct Shard {
    std::mutex mu;  // guards tasks, queued_bytes, busy, stop
    std::condition_variable work, idle, space;
    std::deque<Queued> tasks;
    uint64_t queued_bytes = 0;
    bool busy = false, stop = false;
    std::thread thread;
  };

  void Loop(size_t index) {
    Shard& sh = *shards_[index];
    std::unique_lock<std::mutex> lk(sh.mu);
    for (;;) {
      sh.work.wait(lk, [&] { return sh.stop || !sh.tasks.empty(); });
      if (sh.stop) return;
      Queued q = std::move(sh.tasks.front());
      sh.tasks.pop_front();
      sh.queued_bytes -= q.bytes;
      sh.space.notify_one();
      sh.busy = true;
      lk.unlock();
      run_(index, std::move(q.task));
      lk.lock();
      sh.busy = false;
      if (sh.tasks.empty()) sh.idle.notify_all();
    }
  }

  const Limits limits_;
  const Runner run_;
  std::mutex excl_mu_;  // held by Submit and by exclusive sections
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace pskv
