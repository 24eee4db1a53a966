// The narrow waist of the device runtime: the primitives a backend implements.
//
// Two backends implement it:
//  * CudaBackend (device/cuda/cuda_backend.cc): the only code in pskv that calls CUDA;
//  * SimBackend  (device/sim/sim_backend.cc): plain C++, in every build (ASan, TSan
//    included), with device memory the host cannot touch, in-order stream threads and
//    CUDA's event semantics (docs/gpu.md, "The simulated backend").
// Everything else (argument checks, copy kinds, counters, the event and pinned pools,
// aliasing order, placement, logical devices) is backend-independent and lives in
// device/runtime.cc, which talks to the one backend of the process through this
// interface. Devices here are the backend's own ordinals (physical devices).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

#include "device/kernel_ops.h"
#include "pskv/ndarray.h"

namespace pskv::device {

using Stream = void*;  // cudaStream_t, or a SimBackend stream
using Event = void*;   // cudaEvent_t, or a SimBackend event

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kPeer };

inline constexpr int kMaxSumSources = 64;

/// One kernel launch, described by value: the backend runs the element functions of
/// device/kernel_ops.h over [0, n). Pointers are device pointers of `device`.
struct KernelCall {
  enum class Op { kSum, kConvert, kFill, kScale, kUpdate };
  Op op = Op::kSum;
  int64_t n = 0;
  DType dtype = DType::kFloat32;      // kSum, kScale, kFill (element size), kConvert (dst)
  DType src_dtype = DType::kFloat32;  // kConvert
  void* dst = nullptr;                // kSum, kConvert, kFill, kScale; kUpdate: the weight
  const void* src[kMaxSumSources] =
      {};                // kSum: k sources; kConvert: src[0]; kUpdate: src[0] = grad
  int k = 0;             // kSum: sources; kUpdate: slots
  uint64_t pattern = 0;  // kFill: the element's bits
  double alpha = 0;      // kScale
  kops::UpdateKind update = kops::UpdateKind::kNone;  // kUpdate
  kops::UpdateScalars scalars{};                      // kUpdate
  float* slots[kops::kMaxUpdateSlots] = {};           // kUpdate
  /// Bytes each pointer of this call touches, for the backend's pointer checks.
  size_t DstBytes() const;
  size_t SrcBytes(int i) const;
};

/// Calls the visitor's member template for `call`'s operation and types, the one
/// dispatch both backends use (the simulator's loops, the CUDA launches):
///   v.template Sum<T>(call), v.template Convert<S, D>(call), v.template Fill<U>(call)
///   (U: the unsigned integer of the element's size), v.template Scale<T>(call) (float
///   types only), v.template Update<K>(call).
/// T, S, D are kops storage types (kops::Half, kops::BF16 for the 16-bit floats). False
/// for a dtype or rule it does not know.
template <typename V>
bool VisitKernelCall(const KernelCall& c, V&& v) {
  using Op = KernelCall::Op;
  switch (c.op) {
    case Op::kSum:
      return kops::DispatchStorage(c.dtype, [&](auto t) { v.template Sum<decltype(t)>(c); });
    case Op::kConvert: {
      bool ok = false;
      kops::DispatchStorage(c.src_dtype, [&](auto s) {
        ok = kops::DispatchStorage(
            c.dtype, [&](auto d) { v.template Convert<decltype(s), decltype(d)>(c); });
      });
      return ok;
    }
    case Op::kFill:
      switch (DTypeSize(c.dtype)) {
        case 1:
          v.template Fill<uint8_t>(c);
          return true;
        case 2:
          v.template Fill<uint16_t>(c);
          return true;
        case 4:
          v.template Fill<uint32_t>(c);
          return true;
        case 8:
          v.template Fill<uint64_t>(c);
          return true;
      }
      return false;
    case Op::kScale: {
      bool ok = false;
      kops::DispatchStorage(c.dtype, [&](auto t) {
        using T = decltype(t);
        if constexpr (std::is_floating_point_v<T> || kops::kLowPrecision<T>) {
          v.template Scale<T>(c);
          ok = true;
        }
      });
      return ok;
    }
    case Op::kUpdate:
      return kops::DispatchUpdate(c.update,
                                  [&](auto tag) { v.template Update<decltype(tag)::kind>(c); });
  }
  return false;
}

class Backend {
 public:
  virtual ~Backend() = default;

  /// "simulated" or "cuda".
  virtual const char* Kind() const = 0;
  /// Usable devices (0 when none; Status() says why).
  virtual int DeviceCount() const = 0;
  /// One line: "4 simulated devices (PSKV_SIM_DEVICES=4)", "1 device: NVIDIA H200", or
  /// why there is none.
  virtual std::string Status() const = 0;
  /// The device's name for messages ("simulated device 2", "NVIDIA H200").
  virtual std::string DeviceName(int device) const = 0;
  /// Whether `from` may copy directly into `to`'s memory (peer access).
  virtual bool CanAccessPeer(int to, int from) const = 0;

  // Memory. Alloc/Free are synchronous; 0 bytes allocates a minimal block.
  virtual void* Alloc(int device, size_t bytes) = 0;
  virtual void Free(int device, void* p) = 0;
  virtual void* HostAlloc(size_t bytes) = 0;  // pinned host memory
  virtual void HostFree(void* p) = 0;

  // Streams: in-order queues of work on one device; created non-blocking.
  virtual Stream CreateStream(int device) = 0;
  virtual int StreamDevice(Stream s) const = 0;
  virtual void StreamSync(Stream s) = 0;

  // Work enqueued on a stream.
  virtual void Copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                    CopyKind kind, Stream s) = 0;
  virtual void Launch(int device, const KernelCall& call, Stream s) = 0;
  /// Runs `fn` on a backend thread once the work queued on `s` before it finished;
  /// later work on `s` waits for it. `fn` must not call the backend.
  virtual void HostCallback(Stream s, std::function<void()> fn) = 0;

  // Events, with CUDA's semantics: Record captures the work queued on the stream so
  // far; WaitEvent makes a stream wait for the most recent Record at the time of the
  // call; Query/EventSync on an event never recorded report it complete.
  virtual Event CreateEvent(int device) = 0;
  virtual void DestroyEvent(Event e) = 0;
  virtual void Record(Event e, Stream s) = 0;
  virtual void WaitEvent(Stream waiter, Event e) = 0;
  virtual bool Query(Event e) = 0;
  virtual void EventSync(Event e) = 0;
};

/// Options of the simulated backend (PSKV_SIM_DEVICES, PSKV_SIM_JITTER).
struct SimOptions {
  int devices = 0;
  /// 0: off; otherwise the seed of random delays (0-200 us) before each task of each
  /// stream, so that a missing wait shows up as a wrong value or a TSan report.
  uint64_t jitter_seed = 0;
};
std::unique_ptr<Backend> MakeSimBackend(const SimOptions& options);

/// The CUDA backend; in a build without CUDA, a backend with no device whose Status()
/// says so.
std::unique_ptr<Backend> MakeCudaBackend();
/// True when pskv was compiled with the CUDA backend (cuda_backend.cc, not the stub).
bool CudaBackendBuilt();

}  // namespace pskv::device
