// The CUDA runtime layer (runtime.h) for builds with CUDA. Compiled by the host
// compiler against the CUDA runtime API (linked statically: libpskv needs no
// libcudart at run time, and without a driver every call reports DeviceUnavailable).
//
// State: one process-wide Runtime, built on first use. Its lock guards the lazily
// created per-device streams, the event pools and the pinned pool; the counters are
// relaxed atomics. The driver is process-wide, so this is the one place in pskv that
// keeps a process-wide singleton; PSKV_CUDA_FAKE_DEVICES (a test hook of the table in
// common/env_table.cc) is read here, once, when CUDA is initialised.
#include "cuda/runtime.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <bit>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "common/dtype_dispatch.h"
#include "common/env_table.h"
#include "cuda/kernels.h"
#include "ndarray/layout_check.h"

namespace pskv::cuda {
namespace {

std::atomic<bool> g_initialized{false};

struct AtomicCounters {
  std::atomic<uint64_t> d2h_bytes{0}, d2h_count{0}, h2d_bytes{0}, h2d_count{0};
  std::atomic<uint64_t> d2d_bytes{0}, d2d_count{0}, peer_bytes{0}, peer_count{0};
  std::atomic<uint64_t> kernel_launches{0};
};
AtomicCounters g_counters;

void Count(std::atomic<uint64_t>& bytes, std::atomic<uint64_t>& count, size_t n) {
  bytes.fetch_add(n, std::memory_order_relaxed);
  count.fetch_add(1, std::memory_order_relaxed);
}

std::string ErrorText(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  throw DeviceError(std::string("CUDA call ") + what + " failed: " + ErrorText(e));
}

// Sets the current device for the lifetime of the guard and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int physical) {
    Check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != physical) Check(cudaSetDevice(physical), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

class Runtime {
 public:
  static Runtime& Get() {
    static Runtime* r = new Runtime();  // never destroyed: CUDA may be torn down first at exit
    return *r;
  }

  bool ok() const { return ok_; }
  int logical_count() const { return ok_ ? (fake_ > 0 ? fake_ : physical_) : 0; }
  const std::string& status() const { return status_; }

  void Require(int id) const {
    if (!ok_) throw DeviceUnavailable("no CUDA device: " + status_);
    if (id < 0 || id >= logical_count())
      throw DeviceUnavailable("cuda:" + std::to_string(id) + " does not exist (" +
                              std::to_string(logical_count()) + " logical device(s): " + status_ +
                              ")");
  }
  int Physical(int id) const {
    Require(id);
    return fake_ > 0 ? 0 : id;
  }

  Stream GetStream(int id, StreamKind kind) {
    const int phys = Physical(id);
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = streams_[{id, static_cast<int>(kind)}];
    if (!slot) {
      DeviceGuard g(phys);
      cudaStream_t s = nullptr;
      Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      slot = s;
    }
    return slot;
  }

  Event TakeEvent(int id) {
    const int phys = Physical(id);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& pool = events_[phys];
      if (!pool.empty()) {
        Event e = pool.back();
        pool.pop_back();
        return e;
      }
    }
    DeviceGuard g(phys);
    cudaEvent_t e = nullptr;
    Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void GiveEvent(int id, Event e) {
    const int phys = Physical(id);
    std::lock_guard<std::mutex> lock(mu_);
    events_[phys].push_back(e);
  }

  void* PinnedTake(size_t bytes) {
    const size_t cls = SizeClass(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& list = pinned_[cls];
      if (!list.empty()) {
        void* p = list.back();
        list.pop_back();
        pinned_cached_ -= cls;
        return p;
      }
    }
    Require(0);
    void* p = nullptr;
    Check(cudaHostAlloc(&p, cls, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void PinnedGive(void* p, size_t bytes) {
    const size_t cls = SizeClass(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pinned_cached_ + cls <= kPinnedPoolCap) {
        pinned_[cls].push_back(p);
        pinned_cached_ += cls;
        return;
      }
    }
    cudaFreeHost(p);
  }
  size_t pinned_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return pinned_cached_;
  }

 private:
  Runtime() {
    g_initialized.store(true);
    fake_ = ParseFakeDevices(EnvValue("PSKV_CUDA_FAKE_DEVICES"));
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      status_ = ErrorText(e);
      return;
    }
    if (n == 0) {
      status_ = "cudaGetDeviceCount found no CUDA device";
      return;
    }
    physical_ = n;
    ok_ = true;
    cudaDeviceProp prop{};
    std::string name = cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.name : "?";
    status_ = std::to_string(n) + (n == 1 ? " device: " : " devices, the first: ") + name;
    if (fake_ > 0)
      status_ += " (PSKV_CUDA_FAKE_DEVICES=" + std::to_string(fake_) + ": " +
                 std::to_string(fake_) + " logical devices on physical device 0)";
  }

  static size_t SizeClass(size_t bytes) { return std::bit_ceil(std::max<size_t>(bytes, 4096)); }

  bool ok_ = false;
  int physical_ = 0;
  int fake_ = 0;
  std::string status_;
  std::mutex mu_;
  std::map<std::pair<int, int>, Stream> streams_;  // (logical device, kind)
  std::map<int, std::vector<Event>> events_;       // per physical device
  std::map<size_t, std::vector<void*>> pinned_;    // per size class
  size_t pinned_cached_ = 0;
};

cudaStream_t S(Stream s) {
  return static_cast<cudaStream_t>(s);
}

// The logical device every array in `arrays` lives on (UsageError when they differ or
// one is not a CUDA array).
int CommonDevice(const std::vector<const NDArray*>& arrays, const char* what) {
  const Device d = arrays.front()->device();
  for (const NDArray* a : arrays) {
    if (!a->device().is_cuda() || a->device() != d)
      throw UsageError(std::string(what) + ": every array must be on one CUDA device, got " +
                       a->device().str() + " and " + d.str() +
                       " (copy it there first: NDArray::To)");
  }
  return d.id;
}

void Launched(cudaError_t e, const char* what) {
  Check(e, what);
  g_counters.kernel_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

bool Built() {
  return true;
}
bool Initialized() {
  return g_initialized.load();
}
int DeviceCount() {
  return Runtime::Get().logical_count();
}
std::string Status() {
  return Runtime::Get().status();
}

Counters Stats() {
  auto r = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const AtomicCounters& c = g_counters;
  Counters out;
  out.d2h_bytes = r(c.d2h_bytes);
  out.d2h_count = r(c.d2h_count);
  out.h2d_bytes = r(c.h2d_bytes);
  out.h2d_count = r(c.h2d_count);
  out.d2d_bytes = r(c.d2d_bytes);
  out.d2d_count = r(c.d2d_count);
  out.peer_bytes = r(c.peer_bytes);
  out.peer_count = r(c.peer_count);
  out.kernel_launches = r(c.kernel_launches);
  return out;
}

void ResetStats() {
  for (auto* a : {&g_counters.d2h_bytes, &g_counters.d2h_count, &g_counters.h2d_bytes,
                  &g_counters.h2d_count, &g_counters.d2d_bytes, &g_counters.d2d_count,
                  &g_counters.peer_bytes, &g_counters.peer_count, &g_counters.kernel_launches})
    a->store(0, std::memory_order_relaxed);
}

void RequireDevice(int id) {
  Runtime::Get().Require(id);
}
int PhysicalDevice(int id) {
  return Runtime::Get().Physical(id);
}
Stream GetStream(int id, StreamKind kind) {
  return Runtime::Get().GetStream(id, kind);
}

void StreamSync(Stream s) {
  Check(cudaStreamSynchronize(S(s)), "cudaStreamSynchronize");
}

void WaitStream(int id, Stream waiter, Stream producer) {
  if (producer == nullptr || producer == waiter) return;
  // The event must belong to the producer's device: record it with that device
  // current (cudaStreamGetDevice), then let the waiter (any device) wait on it.
  int producer_dev = 0;
  Check(cudaStreamGetDevice(S(producer), &producer_dev), "cudaStreamGetDevice");
  DeviceGuard g(producer_dev);
  cudaEvent_t e = nullptr;
  Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  cudaError_t rc = cudaEventRecord(e, S(producer));
  if (rc == cudaSuccess) rc = cudaStreamWaitEvent(S(waiter), e, 0);
  cudaEventDestroy(e);  // safe: the wait captured the event's state at the call
  Check(rc, "cudaEventRecord/cudaStreamWaitEvent");
}

Event RecordEvent(int id, Stream s) {
  Event e = Runtime::Get().TakeEvent(id);
  DeviceGuard g(PhysicalDevice(id));
  Check(cudaEventRecord(static_cast<cudaEvent_t>(e), S(s)), "cudaEventRecord");
  return e;
}
bool EventDone(Event e) {
  const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(e));
  if (rc == cudaErrorNotReady) return false;
  Check(rc, "cudaEventQuery");
  return true;
}
void EventSync(Event e) {
  Check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize");
}
void ReleaseEvent(int id, Event e) {
  Runtime::Get().GiveEvent(id, e);
}

void* DeviceAlloc(int id, size_t bytes) {
  DeviceGuard g(PhysicalDevice(id));
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw DeviceError("cannot allocate " + std::to_string(bytes) +
                      " bytes on cuda:" + std::to_string(id) + ": " + ErrorText(rc));
  }
  return p;
}
void DeviceFree(int id, void* p) {
  DeviceGuard g(PhysicalDevice(id));
  cudaFree(p);  // a failure here (a sticky error from an earlier fault) has been reported
}

void* PinnedAlloc(size_t bytes) {
  return Runtime::Get().PinnedTake(bytes);
}
void PinnedFree(void* p, size_t bytes) {
  Runtime::Get().PinnedGive(p, bytes);
}
size_t PinnedPoolCachedBytes() {
  return Runtime::Get().pinned_cached();
}

void CopyAsync(void* dst, Device dd, const void* src, Device sd, size_t bytes, Stream s) {
  if (bytes == 0) return;
  if (dd.host_accessible() && sd.host_accessible()) {
    std::memmove(dst, src, bytes);
    return;
  }
  auto& c = g_counters;
  if (dd.is_cuda() && sd.is_cuda()) {
    const int pd = PhysicalDevice(dd.id), ps = PhysicalDevice(sd.id);
    DeviceGuard g(pd);
    if (pd != ps) {
      Check(cudaMemcpyPeerAsync(dst, pd, src, ps, bytes, S(s)), "cudaMemcpyPeerAsync");
    } else {
      Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S(s)), "cudaMemcpyAsync");
    }
    if (dd.id != sd.id) {
      Count(c.peer_bytes, c.peer_count, bytes);
    } else {
      Count(c.d2d_bytes, c.d2d_count, bytes);
    }
    return;
  }
  const bool to_device = dd.is_cuda();
  DeviceGuard g(PhysicalDevice(to_device ? dd.id : sd.id));
  Check(cudaMemcpyAsync(dst, src, bytes,
                        to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, S(s)),
        "cudaMemcpyAsync");
  if (to_device) {
    Count(c.h2d_bytes, c.h2d_count, bytes);
  } else {
    Count(c.d2h_bytes, c.d2h_count, bytes);
  }
}

void Sum(const std::vector<NDArray>& srcs, NDArray* dst, Stream s) {
  if (srcs.empty()) throw InvalidArgument("cuda::Sum needs at least one source");
  if (srcs.size() > static_cast<size_t>(kMaxSumSources))
    throw InvalidArgument("cuda::Sum takes at most " + std::to_string(kMaxSumSources) +
                          " sources, got " + std::to_string(srcs.size()));
  std::vector<const NDArray*> all{dst};
  for (const auto& a : srcs) {
    CheckSameLayout(a, *dst, "reduce");
    all.push_back(&a);
  }
  const int id = CommonDevice(all, "cuda::Sum");
  // Reducer::Sum's aliasing rule, applied identically: a source that aliases dst is
  // swapped to the front, so the summation order matches the CPU's bit for bit.
  std::vector<const void*> order;
  for (const auto& a : srcs) order.push_back(a.raw());
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i] == dst->raw()) std::swap(order[0], order[i]);
  kernels::Sources p{};
  for (size_t i = 0; i < order.size(); ++i) p.p[i] = order[i];
  DeviceGuard g(PhysicalDevice(id));
  Launched(kernels::LaunchSum(dst->dtype(), dst->raw(), p, static_cast<int>(order.size()),
                              dst->size(), S(s)),
           "sum kernel launch");
}

void Convert(const NDArray& src, NDArray* dst, Stream s) {
  if (src.size() != dst->size())
    throw ShapeError("cuda::Convert: " + std::to_string(src.size()) + " elements into " +
                     std::to_string(dst->size()));
  const int id = CommonDevice({dst, &src}, "cuda::Convert");
  DeviceGuard g(PhysicalDevice(id));
  Launched(
      kernels::LaunchConvert(src.dtype(), src.raw(), dst->dtype(), dst->raw(), dst->size(), S(s)),
      "convert kernel launch");
}

void Fill(NDArray* dst, double v, Stream s) {
  const int id = CommonDevice({dst}, "cuda::Fill");
  uint64_t pattern = 0;
  DispatchDType(dst->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T bits = FromDouble<T>(v);  // the host's conversion: identical to NDArray::Fill
    std::memcpy(&pattern, &bits, sizeof(T));
  });
  DeviceGuard g(PhysicalDevice(id));
  Launched(kernels::LaunchFill(dst->raw(), static_cast<int>(DTypeSize(dst->dtype())), pattern,
                               dst->size(), S(s)),
           "fill kernel launch");
}

void Scale(NDArray* dst, double alpha, Stream s) {
  const DType t = dst->dtype();
  if (t != DType::kFloat32 && t != DType::kFloat64 && !IsLowPrecision(t))
    throw InvalidArgument("cuda::Scale: " + DTypeName(t) + " is not a float dtype");
  const int id = CommonDevice({dst}, "cuda::Scale");
  DeviceGuard g(PhysicalDevice(id));
  Launched(kernels::LaunchScale(t, dst->raw(), dst->size(), alpha, S(s)), "scale kernel launch");
}

}  // namespace pskv::cuda
