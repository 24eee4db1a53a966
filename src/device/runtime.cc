// The backend-independent device runtime (runtime.h): one process-wide Runtime over
// the backend chosen at initialisation (device/backend.h).
//
// State: one process-wide Runtime, built on first use. Its lock guards the lazily
// created per-device streams, the event pools and the pinned pool; the counters are
// relaxed atomics. The driver is process-wide, so this is the one place in pskv that
// keeps a process-wide singleton; PSKV_SIM_DEVICES, PSKV_SIM_JITTER,
// PSKV_CUDA_FAKE_DEVICES and MXNET_ENABLE_GPU_P2P (common/env_table.cc) are read here,
// once, when the runtime initialises.
#include "device/runtime.h"

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/dtype_dispatch.h"
#include "common/env_table.h"
#include "common/logging.h"
#include "device/backend.h"
#include "device/layout_check.h"

namespace pskv {

size_t device::KernelCall::DstBytes() const {
  switch (op) {
    case Op::kUpdate:
      return static_cast<size_t>(n) * 4;
    default:
      return static_cast<size_t>(n) * DTypeSize(dtype);
  }
}
size_t device::KernelCall::SrcBytes(int) const {
  switch (op) {
    case Op::kConvert:
      return static_cast<size_t>(n) * DTypeSize(src_dtype);
    case Op::kUpdate:
      return static_cast<size_t>(n) * 4;
    default:
      return static_cast<size_t>(n) * DTypeSize(dtype);
  }
}

namespace cuda {
namespace {

using device::Backend;
using device::CopyKind;
using device::KernelCall;

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

// Set by UseSimulatedDevices before the runtime exists (under g_choice_mu).
std::mutex g_choice_mu;
device::SimOptions g_sim_choice;

uint64_t ParseJitter(const char* v) {  // the range is the environment table's
  if (v == nullptr || *v == '\0') return 0;
  return static_cast<uint64_t>(EnvInt(*FindEnvVar("PSKV_SIM_JITTER"), v));
}

class Runtime {
 public:
  static Runtime& Get() {
    static Runtime* r = new Runtime();  // never destroyed: streams may run at exit
    return *r;
  }

  Backend& backend() { return *backend_; }
  bool simulated() const { return simulated_; }
  int logical_count() const { return count_ == 0 ? 0 : (fake_ > 0 ? fake_ : count_); }
  const std::string& status() const { return status_; }
  bool p2p() const { return p2p_; }

  void Require(int id) const {
    if (count_ == 0) throw DeviceUnavailable("no CUDA device: " + status_);
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
    if (!slot) slot = backend_->CreateStream(phys);
    return slot;
  }

  Event TakeEvent(int phys) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& pool = events_[phys];
      if (!pool.empty()) {
        Event e = pool.back();
        pool.pop_back();
        return e;
      }
    }
    return backend_->CreateEvent(phys);
  }
  void GiveEvent(int phys, Event e) {
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
    return backend_->HostAlloc(cls);
  }
  // `keep`: put it back even over the cap (a host callback may not call the backend).
  void PinnedGive(void* p, size_t bytes, bool keep = false) {
    const size_t cls = SizeClass(bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (keep || pinned_cached_ + cls <= kPinnedPoolCap) {
        pinned_[cls].push_back(p);
        pinned_cached_ += cls;
        return;
      }
    }
    backend_->HostFree(p);
  }
  size_t pinned_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return pinned_cached_;
  }

 private:
  Runtime() {
    g_initialized.store(true);
    fake_ = ParseFakeDevices(EnvValue("PSKV_CUDA_FAKE_DEVICES"));
    const char* p2p = EnvValue("MXNET_ENABLE_GPU_P2P");
    p2p_ = p2p == nullptr || *p2p == '\0' || std::strcmp(p2p, "0") != 0;
    device::SimOptions sim;
    {
      std::lock_guard<std::mutex> lk(g_choice_mu);
      sim = g_sim_choice;
    }
    const bool by_call = sim.devices > 0;
    if (!by_call) {
      sim.devices = ParseSimDevices(EnvValue("PSKV_SIM_DEVICES"));
      sim.jitter_seed = ParseJitter(EnvValue("PSKV_SIM_JITTER"));
    }
    if (sim.devices > 0) {
      simulated_ = true;
      backend_ = device::MakeSimBackend(sim);
    } else {
      backend_ = device::MakeCudaBackend();
    }
    count_ = backend_->DeviceCount();
    status_ = backend_->Status();
    if (simulated_) status_ += by_call ? ", by UseSimulatedDevices" : ", by PSKV_SIM_DEVICES";
    if (count_ > 0 && fake_ > 0)
      status_ += " (PSKV_CUDA_FAKE_DEVICES=" + std::to_string(fake_) + ": " +
                 std::to_string(fake_) + " logical devices on device 0)";
    if (simulated_) PSKV_INFO("device runtime: " << status_);
  }

  static size_t SizeClass(size_t bytes) { return std::bit_ceil(std::max<size_t>(bytes, 4096)); }

  std::unique_ptr<Backend> backend_;
  bool simulated_ = false;
  int count_ = 0;
  int fake_ = 0;
  bool p2p_ = true;
  std::string status_;
  std::mutex mu_;
  std::map<std::pair<int, int>, Stream> streams_;  // (logical device, kind)
  std::map<int, std::vector<Event>> events_;       // per backend device
  std::map<size_t, std::vector<void*>> pinned_;    // per size class
  size_t pinned_cached_ = 0;
};

Backend& B() {
  return Runtime::Get().backend();
}

// The logical device every array in `arrays` lives on (UsageError when they differ or
// one is not a device array).
int CommonDevice(const std::vector<const NDArray*>& arrays, const char* what) {
  const Device d = arrays.front()->device();
  for (const NDArray* a : arrays) {
    if (!a->device().is_cuda() || a->device() != d)
      throw UsageError(std::string(what) + ": every array must be on one device, got " +
                       a->device().str() + " and " + d.str() +
                       " (copy it there first: NDArray::To)");
  }
  return d.id;
}

void Launch(int id, const KernelCall& call, Stream s) {
  if (call.n == 0) return;
  B().Launch(PhysicalDevice(id), call, s);
  g_counters.kernel_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

bool Built() {
  return device::CudaBackendBuilt();
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
bool Simulated() {
  return Runtime::Get().simulated();
}
std::string DeviceName(int id) {
  const int phys = PhysicalDevice(id);
  return B().DeviceName(phys);
}

void UseSimulatedDevices(int devices, uint64_t jitter_seed) {
  if (devices < 1 || devices > 64)
    throw InvalidArgument("UseSimulatedDevices: devices must be in [1, 64], got " +
                          std::to_string(devices));
  std::lock_guard<std::mutex> lk(g_choice_mu);
  if (g_initialized.load()) {
    const Runtime& r = Runtime::Get();
    if (r.simulated() && r.logical_count() == devices) return;  // already so
    throw UsageError(
        "UseSimulatedDevices must be called before the first use of a device (the device "
        "runtime already runs: " +
        r.status() + "); call it first, or set PSKV_SIM_DEVICES before the process starts");
  }
  g_sim_choice = {devices, jitter_seed};
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
Stream NewStream(int id) {
  return B().CreateStream(PhysicalDevice(id));
}

void StreamSync(Stream s) {
  B().StreamSync(s);
}

void WaitStream(int id, Stream waiter, Stream producer) {
  if (producer == nullptr || producer == waiter) return;
  RequireDevice(id);
  Backend& b = B();
  // The event belongs to the producer's device; the waiter (any device) waits on it.
  // Returning it to the pool right away is safe: the wait captured the record.
  const int producer_dev = b.StreamDevice(producer);
  Runtime& r = Runtime::Get();
  Event e = r.TakeEvent(producer_dev);
  try {
    b.Record(e, producer);
    b.WaitEvent(waiter, e);
  } catch (...) {
    r.GiveEvent(producer_dev, e);
    throw;
  }
  r.GiveEvent(producer_dev, e);
}

void OnStreamDone(Stream s, std::function<void()> fn) {
  B().HostCallback(s, std::move(fn));
}

Event RecordEvent(int id, Stream s) {
  const int phys = PhysicalDevice(id);
  Event e = Runtime::Get().TakeEvent(phys);
  B().Record(e, s);
  return e;
}
bool EventDone(Event e) {
  return B().Query(e);
}
void EventSync(Event e) {
  B().EventSync(e);
}
void ReleaseEvent(int id, Event e) {
  Runtime::Get().GiveEvent(PhysicalDevice(id), e);
}

void* DeviceAlloc(int id, size_t bytes) {
  return B().Alloc(PhysicalDevice(id), bytes);
}
void DeviceFree(int id, void* p) noexcept {
  try {
    B().Free(PhysicalDevice(id), p);
  } catch (const std::exception& e) {
    PSKV_ERROR("freeing device memory of cuda:" << id << ": " << e.what());
  }
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

bool PeerCopies(int a, int b) {
  Runtime& r = Runtime::Get();
  return r.p2p() && r.backend().CanAccessPeer(r.Physical(a), r.Physical(b));
}

void CopyAsync(void* dst, Device dd, const void* src, Device sd, size_t bytes, Stream s) {
  if (bytes == 0) return;
  if (dd.host_accessible() && sd.host_accessible()) {
    std::memmove(dst, src, bytes);
    return;
  }
  auto& c = g_counters;
  Backend& b = B();
  if (dd.is_cuda() && sd.is_cuda()) {
    const int pd = PhysicalDevice(dd.id), ps = PhysicalDevice(sd.id);
    if (dd.id != sd.id && !PeerCopies(dd.id, sd.id)) {
      // No peer access (or MXNET_ENABLE_GPU_P2P=0): through a pinned host buffer, both
      // halves on `s`, in order; the buffer goes back to the pool when `s` passed them.
      void* staging = PinnedAlloc(bytes);
      b.Copy(staging, -1, src, ps, bytes, CopyKind::kDeviceToHost, s);
      b.Copy(dst, pd, staging, -1, bytes, CopyKind::kHostToDevice, s);
      b.HostCallback(s, [staging, bytes] { Runtime::Get().PinnedGive(staging, bytes, true); });
      Count(c.d2h_bytes, c.d2h_count, bytes);
      Count(c.h2d_bytes, c.h2d_count, bytes);
      return;
    }
    b.Copy(dst, pd, src, ps, bytes, pd != ps ? CopyKind::kPeer : CopyKind::kDeviceToDevice, s);
    if (dd.id != sd.id) {
      Count(c.peer_bytes, c.peer_count, bytes);
    } else {
      Count(c.d2d_bytes, c.d2d_count, bytes);
    }
    return;
  }
  if (dd.is_cuda()) {
    b.Copy(dst, PhysicalDevice(dd.id), src, -1, bytes, CopyKind::kHostToDevice, s);
    Count(c.h2d_bytes, c.h2d_count, bytes);
  } else {
    b.Copy(dst, -1, src, PhysicalDevice(sd.id), bytes, CopyKind::kDeviceToHost, s);
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
  KernelCall call;
  call.op = KernelCall::Op::kSum;
  call.n = dst->size();
  call.dtype = dst->dtype();
  call.dst = dst->raw();
  call.k = static_cast<int>(order.size());
  for (size_t i = 0; i < order.size(); ++i) call.src[i] = order[i];
  Launch(id, call, s);
}

void Convert(const NDArray& src, NDArray* dst, Stream s) {
  if (src.size() != dst->size())
    throw ShapeError("cuda::Convert: " + std::to_string(src.size()) + " elements into " +
                     std::to_string(dst->size()));
  const int id = CommonDevice({dst, &src}, "cuda::Convert");
  KernelCall call;
  call.op = KernelCall::Op::kConvert;
  call.n = dst->size();
  call.dtype = dst->dtype();
  call.src_dtype = src.dtype();
  call.dst = dst->raw();
  call.src[0] = src.raw();
  Launch(id, call, s);
}

void Fill(NDArray* dst, double v, Stream s) {
  const int id = CommonDevice({dst}, "cuda::Fill");
  KernelCall call;
  call.op = KernelCall::Op::kFill;
  call.n = dst->size();
  call.dtype = dst->dtype();
  call.dst = dst->raw();
  DispatchDType(dst->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T bits = FromDouble<T>(v);  // the host's conversion: identical to NDArray::Fill
    std::memcpy(&call.pattern, &bits, sizeof(T));
  });
  Launch(id, call, s);
}

void Scale(NDArray* dst, double alpha, Stream s) {
  const DType t = dst->dtype();
  if (t != DType::kFloat32 && t != DType::kFloat64 && !IsLowPrecision(t))
    throw InvalidArgument("cuda::Scale: " + DTypeName(t) + " is not a float dtype");
  const int id = CommonDevice({dst}, "cuda::Scale");
  KernelCall call;
  call.op = KernelCall::Op::kScale;
  call.n = dst->size();
  call.dtype = t;
  call.dst = dst->raw();
  call.alpha = alpha;
  Launch(id, call, s);
}

void Update(kops::UpdateKind kind, const kops::UpdateScalars& scalars, const NDArray& grad,
            NDArray* w, const std::vector<NDArray*>& slots, Stream s) {
  if (kind == kops::UpdateKind::kNone)
    throw InvalidArgument("cuda::Update: the rule has no device kernel");
  if (slots.size() > static_cast<size_t>(kops::kMaxUpdateSlots))
    throw InvalidArgument("cuda::Update: at most 3 state buffers");
  std::vector<const NDArray*> all{w, &grad};
  for (NDArray* sl : slots) all.push_back(sl);
  for (const NDArray* a : all)
    if (a->dtype() != DType::kFloat32 || a->size() != w->size())
      throw ShapeError("cuda::Update: every array must be float32 with " +
                       std::to_string(w->size()) + " elements, got " + DTypeName(a->dtype()) +
                       " with " + std::to_string(a->size()));
  const int id = CommonDevice(all, "cuda::Update");
  KernelCall call;
  call.op = KernelCall::Op::kUpdate;
  call.n = w->size();
  call.dtype = DType::kFloat32;
  call.dst = w->raw();
  call.src[0] = grad.raw();
  call.update = kind;
  call.scalars = scalars;
  call.k = static_cast<int>(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) call.slots[i] = slots[i]->data<float>();
  Launch(id, call, s);
}

}  // namespace cuda
}  // namespace pskv
