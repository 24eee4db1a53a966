#include "common/thread_pool.h"

#include <algorithm>

namespace pskv {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < std::max(1, num_threads); ++i)
    workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t align,
                             const std::function<void(int64_t, int64_t)>& fn) {
  std::lock_guard<std::mutex> call_lk(call_mu_);
  const int parts = size();
  if (parts == 1 || n < 2 * align) {
    fn(0, n);
    return;
  }
  std::vector<std::pair<int64_t, int64_t>> ranges(parts);
  int64_t per = (n + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  for (int i = 0; i < parts; ++i) {
    int64_t b = std::min<int64_t>(n, per * i), e = std::min<int64_t>(n, per * (i + 1));
    ranges[i] = {b, e};
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    ranges_ = ranges;
    pending_ = parts - 1;
    ++generation_;
  }
  cv_work_.notify_all();
  fn(ranges[0].first, ranges[0].second);
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return pending_ == 0; });
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    std::pair<int64_t, int64_t> r;
    const std::function<void(int64_t, int64_t)>* fn;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      r = ranges_[index];
      fn = fn_;
    }
    if (r.first < r.second) (*fn)(r.first, r.second);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) cv_done_.notify_all();
    }
  }
}

}  // namespace pskv
