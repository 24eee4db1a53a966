// pskv's device runtime: the host-side calls every device code path goes through.
//
// Backend-independent: argument checks, copy kinds, counters, the event and pinned
// pools, aliasing order and logical devices live here (runtime.cc); the one backend of
// the process (device/backend.h) does the rest. The backend is chosen once, at the first
// call that needs a device:
//  * the simulated backend when PSKV_SIM_DEVICES=k is set or UseSimulatedDevices(k) was
//    called first (never as a silent fallback: every status line says "simulated");
//  * otherwise the CUDA backend (in a build without CUDA: none, "built without CUDA").
// Failure to find a device is remembered and reported as DeviceUnavailable by every
// later call; it never aborts.
//
// This header does not include CUDA: streams and events are opaque handles.
//
// Logical devices (pskv/device.h): PSKV_CUDA_FAKE_DEVICES=k maps logical devices 0..k-1
// onto device 0 of the backend; copies between different logical devices are counted
// as peer copies there too. Each logical device has its own three non-blocking streams
// (compute, d2h, h2d), created on first use and kept for the life of the process.
//
// Ordering contract: the calls below enqueue work on the stream they are given and
// return; they do not look at an array's ready_stream() (callers order streams with
// WaitStream). Peer copies go directly when the backend allows peer access and
// MXNET_ENABLE_GPU_P2P is not 0; otherwise through a pinned host buffer (counted as a
// d2h and an h2d).
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "device/kernel_ops.h"
#include "pskv/device.h"
#include "pskv/ndarray.h"

namespace pskv::cuda {

using Stream = void*;
using Event = void*;

/// The message of DeviceUnavailable in a build without CUDA.
inline constexpr const char* kBuiltWithoutCuda =
    "pskv was built without CUDA (rebuild with PSKV_WITH_CUDA=ON on a machine with nvcc, or "
    "set PSKV_SIM_DEVICES=k for simulated devices)";

/// The value of PSKV_CUDA_FAKE_DEVICES (common/env_table.cc): null or "" is 0 (off),
/// otherwise an integer in [1, 64]; ConfigError naming the variable otherwise. The
/// variable is read once, when the runtime initialises.
int ParseFakeDevices(const char* value);
/// The value of PSKV_SIM_DEVICES: null or "" is 0 (off), else an integer in [1, 64].
int ParseSimDevices(const char* value);

/// Throws DeviceUnavailable unless logical device `id` is usable (initialises).
void RequireDevice(int id);
/// The backend's device behind logical device `id`.
int PhysicalDevice(int id);

enum class StreamKind { kCompute = 0, kD2H = 1, kH2D = 2 };
/// pskv's own stream of that kind on logical device `id`.
Stream GetStream(int id, StreamKind kind);
/// A new stream on logical device `id`, never destroyed (tests and frameworks'
/// stand-ins; a producer stream for NDArray::Wrap).
Stream NewStream(int id);
/// Blocks until the work queued on `s` has finished.
void StreamSync(Stream s);
/// Makes `waiter` (on logical device `id`) wait for the work queued on `producer` so
/// far. `producer` may belong to any device or be a framework's stream; null or
/// `waiter` itself: nothing to do.
void WaitStream(int id, Stream waiter, Stream producer);
/// Runs `fn` once the work queued on `s` so far finished (fn must not call the runtime).
void OnStreamDone(Stream s, std::function<void()> fn);

/// Events from a per-device pool.
Event RecordEvent(int id, Stream s);
bool EventDone(Event e);
void EventSync(Event e);
void ReleaseEvent(int id, Event e);

/// Device memory on logical device `id` (synchronous allocation and release).
void* DeviceAlloc(int id, size_t bytes);
/// Never throws (a deleter calls it): a failure is logged.
void DeviceFree(int id, void* p) noexcept;
/// Pinned host memory from a process-wide pool kept per power-of-two size class (at
/// most kPinnedPoolCap bytes stay cached; the rest goes back to the backend).
void* PinnedAlloc(size_t bytes);
void PinnedFree(void* p, size_t bytes);
inline constexpr size_t kPinnedPoolCap = size_t{1} << 30;
/// Bytes currently cached in the pinned pool (not handed out).
size_t PinnedPoolCachedBytes();

/// Whether copies between logical devices `a` and `b` go directly (peer access allowed
/// by the backend and MXNET_ENABLE_GPU_P2P not 0).
bool PeerCopies(int a, int b);

/// Copies `bytes` from `src` (on `sd`) to `dst` (on `dd`), enqueued on `s`, and counts
/// it (Counters): host to host is a plain memcpy (synchronous, not counted).
void CopyAsync(void* dst, Device dd, const void* src, Device sd, size_t bytes, Stream s);

/// Kernels, enqueued on `s`; every array is a device array on the same logical device
/// (UsageError otherwise), of the same dtype and element count (ShapeError otherwise).
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
/// One optimizer update of a built-in rule (device/kernel_ops.h): `w` (float32) updated
/// in place from `grad` (float32) with state buffers `slots` (float32), all on one
/// device with w's element count.
void Update(kops::UpdateKind kind, const kops::UpdateScalars& scalars, const NDArray& grad,
            NDArray* w, const std::vector<NDArray*>& slots, Stream s);

}  // namespace pskv::cuda
