// NDArray: a contiguous, row-major array with a shape, a dtype and a device.
//
// Two forms share one type:
//  * owning   — `NDArray(shape, dtype)` allocates 64-byte aligned, zero-filled memory;
//  * wrapping — `NDArray::Wrap(ptr, shape, dtype, keepalive)` views memory owned by
//    someone else (a torch tensor, a numpy array) without copying. `keepalive`, if
//    given, is held for as long as any copy of the NDArray exists.
//
// Copying an NDArray object is cheap and shares the memory (a handle, like MXNet's
// NDArray); use Clone() for a deep copy. All sizes are 64-bit: arrays over 2 GiB work.
//
// Devices (pskv/device.h): an array lives on the CPU (the default), on a CUDA device,
// or in pinned host memory. The element-wise methods below (Clone, CopyFrom, AsType,
// Fill, At, ToDoubles) run on the host: they accept kCPU and kCUDAHost arrays and throw
// UsageError for a kCUDA array (they never read device memory from the host); use
// To(Device::CPU()) first. Views (Slice1D, Reshape) keep the device. A wrapped array may
// carry a *ready stream* (an opaque cudaStream_t): its contents are valid once the work
// queued on that stream up to the wrap has finished.
//
// Thread safety: the handle itself is a value type; concurrent reads are safe,
// concurrent writes to the same elements are the caller's problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pskv/device.h"
#include "pskv/dtype.h"

namespace pskv {

using Shape = std::vector<int64_t>;
/// Product of the dimensions (1 for a scalar shape {}). ShapeError on a negative
/// dimension, or when the product of the nonzero dimensions exceeds INT64_MAX (also
/// for a shape with a zero dimension: every partial product, such as a row size,
/// must fit).
int64_t NumElements(const Shape& s);
/// NumElements(s) * DTypeSize(t), checked: ShapeError when the bytes (counted as if
/// every zero dimension were 1, so that a row's bytes fit too) exceed INT64_MAX.
/// Every array pskv allocates or wraps passes this check, so byte offsets of
/// elements within an array (and of rows within a row_sparse table) never overflow.
size_t NumBytes(const Shape& s, DType t);
std::string ShapeToString(const Shape& s);

class NDArray {
 public:
  /// An empty array (no storage). `empty()` is true.
  NDArray() = default;
  /// Owning, zero-filled array.
  NDArray(Shape shape, DType dtype = DType::kFloat32);
  /// Owning, zero-filled array on `device` (kCUDA: device memory; kCUDAHost: pinned
  /// host memory from pskv's pool). Initialises CUDA for a non-CPU device;
  /// DeviceUnavailable when there is none (or pskv was built without CUDA).
  NDArray(Shape shape, DType dtype, Device device);
  /// Non-owning view of `data`, which must hold NumElements(shape) elements of
  /// `dtype` and stay valid while `keepalive` (or, if null, the caller) keeps it.
  static NDArray Wrap(void* data, Shape shape, DType dtype,
                      std::shared_ptr<void> keepalive = nullptr);
  /// The same for memory on `device`. `ready_stream` (a cudaStream_t, may be null) is
  /// the stream whose queued work produces the contents. Does not touch CUDA: the
  /// device is checked when an operation first needs it.
  static NDArray Wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> keepalive,
                      Device device, void* ready_stream = nullptr);
  /// Owning float32 array from values (convenience for tests and examples).
  static NDArray FromVector(const std::vector<float>& v, Shape shape = {});

  bool empty() const { return data_ == nullptr && size_ == 0; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t size() const { return size_; }
  size_t nbytes() const { return static_cast<size_t>(size_) * DTypeSize(dtype_); }
  bool is_view() const { return !owning_; }
  Device device() const { return device_; }
  /// The producer stream given to Wrap (an opaque cudaStream_t), or null.
  void* ready_stream() const { return ready_stream_; }
  /// The raw pointer: a device pointer for a kCUDA array (never dereference it on the
  /// host).
  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  /// True when both handles refer to the same memory.
  bool SameData(const NDArray& o) const { return data_ == o.data_ && size_ == o.size_; }

  /// Deep copy into a new owning array of the same shape and dtype (host arrays).
  NDArray Clone() const;
  /// Owning copy on `device` (same shape and dtype), synchronous: the copy has finished
  /// when it returns (it waits for the ready stream first). Works between any two
  /// devices; initialises CUDA when either side is not kCPU.
  NDArray To(Device device) const;
  /// Copies `src` into this array, converting dtype when they differ. Element
  /// counts must match (ShapeError otherwise); shapes may differ only if
  /// `allow_reshape`.
  void CopyFrom(const NDArray& src, bool allow_reshape = false);
  /// Owning copy converted to `dtype`.
  NDArray AsType(DType dtype) const;
  /// Sets every element to `v` (converted to the dtype).
  void Fill(double v);
  /// Element i converted to double (slow; for tests and diagnostics).
  double At(int64_t i) const;
  /// All elements as doubles (slow; for tests).
  std::vector<double> ToDoubles() const;
  /// A view of elements [begin, begin+count) as a 1-D array sharing memory.
  NDArray Slice1D(int64_t begin, int64_t count) const;
  /// Same memory with another shape of equal element count.
  NDArray Reshape(Shape shape) const;

 private:
  std::shared_ptr<void> holder_;  // owns the memory (owning) or the keepalive (view)
  void* data_ = nullptr;
  Shape shape_;
  int64_t size_ = 0;
  DType dtype_ = DType::kFloat32;
  bool owning_ = false;
  Device device_;
  void* ready_stream_ = nullptr;

  // Throws UsageError naming `op` when this array is on a CUDA device.
  void RequireHost(const char* op) const;
};

}  // namespace pskv
