// pskv's CUDA runtime layer: the host-side calls every GPU code path goes through.
//
// This header does not include CUDA: streams and events are opaque handles
// (cudaStream_t, cudaEvent_t), so code built without CUDA compiles against it too.
// Two implementations exist: runtime.cc (+ kernels.cu) when pskv is built with CUDA,
// and cuda_stub.cc otherwise, whose entry points throw DeviceUnavailable("pskv was
// built without CUDA ...").
//
// Initialisation is lazy and happens once per process, at the first call that needs
// the driver (RequireDevice and everything that takes a device, DeviceCount, Status).
// Failure to find a usable GPU (no driver: cudaErrorInsufficientDriver; no device:
// cudaErrorNoDevice) is remembered and reported as DeviceUnavailable by every later
// call; it never aborts.
//
// Devices are logical ordinals (pskv/device.h); each logical device has its own three
// non-blocking streams (compute, d2h, h2d), created on first use and kept for the life
// of the process. Non-blocking matters: a blocking stream would synchronise with the
// legacy default stream that frameworks train on.
//
// Ordering contract: the calls below enqueue work on the stream they are given and
// return; they do not look at an array's ready_stream() (callers order streams with
// WaitStream). Every call sets the current CUDA device for its own duration and
// restores the caller's.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pskv/device.h"
#include "pskv/ndarray.h"

namespace pskv::cuda {

using Stream = void*;  // cudaStream_t
using Event = void*;   // cudaEvent_t

/// The message of DeviceUnavailable in a build without CUDA.
inline constexpr const char* kBuiltWithoutCuda =
    "pskv was built without CUDA (rebuild with PSKV_WITH_CUDA=ON on a machine with nvcc)";

/// The value of PSKV_CUDA_FAKE_DEVICES (common/env_table.cc): null or "" is 0 (off),
/// otherwise an integer in [1, 64]; ConfigError naming the variable otherwise. The
/// variable is read once, when CUDA is initialised.
int ParseFakeDevices(const char* value);

/// Throws DeviceUnavailable unless logical CUDA device `id` is usable (initialises CUDA).
void RequireDevice(int id);
/// The physical CUDA ordinal behind logical device `id`.
int PhysicalDevice(int id);

enum class StreamKind { kCompute = 0, kD2H = 1, kH2D = 2 };
/// pskv's own stream of that kind on logical device `id`.
Stream GetStream(int id, StreamKind kind);
/// Blocks until the work queued on `s` has finished.
void StreamSync(Stream s);
/// Makes `waiter` (on logical device `id`) wait for the work queued on `producer` so
/// far (an event recorded on `producer` now). `producer` may belong to any device or be
/// a framework's stream.
void WaitStream(int id, Stream waiter, Stream producer);

/// Events from a per-device pool (created with cudaEventDisableTiming).
Event RecordEvent(int id, Stream s);
bool EventDone(Event e);
void EventSync(Event e);
void ReleaseEvent(int id, Event e);

/// Device memory on logical device `id` (synchronous allocation and release).
void* DeviceAlloc(int id, size_t bytes);
void DeviceFree(int id, void* p);
/// Pinned host memory from a process-wide pool kept per power-of-two size class (at
/// most kPinnedPoolCap bytes stay cached; the rest goes back to the driver).
void* PinnedAlloc(size_t bytes);
void PinnedFree(void* p, size_t bytes);
inline constexpr size_t kPinnedPoolCap = size_t{1} << 30;
/// Bytes currently cached in the pinned pool (not handed out).
size_t PinnedPoolCachedBytes();

/// Copies `bytes` from `src` (on `sd`) to `dst` (on `dd`), enqueued on `s`, and counts
/// it (Counters): host to host is a plain memcpy (synchronous, not counted); a copy
/// between CUDA devices of different physical ordinals is a peer copy.
void CopyAsync(void* dst, Device dd, const void* src, Device sd, size_t bytes, Stream s);

/// Kernels (kernels.cu), enqueued on `s`; every array is a kCUDA array on the same
/// logical device (UsageError otherwise), of the same dtype and element count
/// (ShapeError otherwise).
///
/// dst = srcs[0] + ... + srcs[k-1] in exactly Reducer::Sum's order (kvstore/reduce.h):
/// bit-identical results for every dtype; float16/bfloat16 accumulate in float32 and
/// round once. dst may alias a source. At most kMaxSumSources sources.
inline constexpr int kMaxSumSources = 64;
void Sum(const std::vector<NDArray>& srcs, NDArray* dst, Stream s);
/// dst = src converted element by element as NDArray::CopyFrom does (element counts
/// must match; dtypes may differ).
void Convert(const NDArray& src, NDArray* dst, Stream s);
/// Every element = v, converted to the dtype on the host exactly as NDArray::Fill does.
void Fill(NDArray* dst, double v, Stream s);
/// dst *= alpha for the float dtypes (float16/bfloat16 through float32, rounded once);
/// InvalidArgument for integer dtypes.
void Scale(NDArray* dst, double alpha, Stream s);

}  // namespace pskv::cuda
