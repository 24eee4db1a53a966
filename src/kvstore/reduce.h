// Reduction engine: element-wise sums of k arrays of any supported dtype.
//
// float16/bfloat16 are accumulated in float32 over all sources and rounded once.
// float32/float64/integers are summed in groups of up to four sources per pass
// (dst = s0+s1+s2+s3, then dst += s4+s5+s6+s7, ...), loops the compiler vectorises.
// Arrays with at least `bigarray_bound` elements are split over `threads` threads.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "common/thread_pool.h"
#include "pskv/ndarray.h"

namespace pskv {

class Reducer {
 public:
  Reducer(int64_t bigarray_bound, int threads);

  /// dst = srcs[0] + ... + srcs[k-1]. All arrays have dst's dtype and element
  /// count (ShapeError otherwise). dst may be one of the sources.
  void Sum(const std::vector<NDArray>& srcs, NDArray* dst);
  /// dst += src (same dtype and size).
  void AddTo(const NDArray& src, NDArray* dst);
  /// dst = src, parallel for big arrays (the benchmark's ceiling uses it too).
  void Copy(const NDArray& src, NDArray* dst);

  /// Splits [0, n) over the pool (one range when there is none) and runs fn on each
  /// range in parallel; for work the caller cuts itself (a message's pieces). fn must
  /// not use this Reducer's pool (it is busy): use a pool-less Reducer inside.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

  int64_t bigarray_bound() const { return bound_; }
  int threads() const { return pool_ ? pool_->size() : 1; }

 private:
  template <typename F>
  void For(int64_t n, F&& f);

  int64_t bound_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace pskv
