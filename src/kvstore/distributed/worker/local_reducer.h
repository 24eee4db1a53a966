// LocalReducer: where a dist store sums the several values a worker pushes for one
// key before they are sent (MXNet's Comm: CommCPU, CommDevice). The seam for a store
// type whose arrays live elsewhere (a GPU reducer sums on the device and returns a
// host array to send); DistWorkerStore is constructed with one.
//
// Contract:
//  - Reduce is called on the store's engine thread, for one key at a time (the engine
//    runs one operation per key), with 2 or more values of the key's shape and dtype.
//    A single value is sent as it is, without a call.
//  - `*merge` is the key's own buffer: empty on the first call, then whatever the
//    reducer left in it; the store keeps it for the key's lifetime and does not touch
//    it. The returned array is sent, so it must stay valid and unmodified until the
//    operation completes (the next Reduce of the key comes after that).
//  - Errors are thrown (the key's operation fails with them).
#pragma once

#include <memory>
#include <vector>

#include "kvstore/reduce.h"
#include "pskv/ndarray.h"

namespace pskv::dist {

class LocalReducer {
 public:
  virtual ~LocalReducer() = default;
  /// The element-wise sum of `vals` (host memory, the key's shape and dtype).
  virtual NDArray Reduce(const std::vector<NDArray>& vals, NDArray* merge) = 0;
};

/// Sums on this CPU into the key's merge buffer (Reducer: grouped passes, threads for
/// arrays of at least `bigarray_bound` elements).
class CpuLocalReducer : public LocalReducer {
 public:
  CpuLocalReducer(int64_t bigarray_bound, int threads) : reducer_(bigarray_bound, threads) {}
  NDArray Reduce(const std::vector<NDArray>& vals, NDArray* merge) override {
    if (merge->empty()) *merge = NDArray(vals[0].shape(), vals[0].dtype());
    reducer_.Sum(vals, merge);
    return *merge;
  }

 private:
  Reducer reducer_;
};

}  // namespace pskv::dist
