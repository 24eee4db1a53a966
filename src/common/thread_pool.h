// A small fixed-size pool for data-parallel loops (reduction of big arrays).
//
// Thread model: ParallelFor is called by one thread at a time per pool (calls are
// serialised by an internal mutex); the calling thread runs the first chunk itself
// and blocks until all chunks are done. Worker threads only ever run chunks.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pskv {

class ThreadPool {
 public:
  /// `num_threads` counts the calling thread: a pool of 4 starts 3 workers.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  /// Splits [0, n) into size() contiguous ranges whose boundaries are multiples
  /// of `align` and runs fn(begin, end) on each, in parallel.
  void ParallelFor(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);

  std::mutex call_mu_;  // serialises ParallelFor calls
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace pskv
