// SimBackend: simulated CUDA-like devices on the CPU (device/backend.h), switched on
// only explicitly (PSKV_SIM_DEVICES=k, or cuda::UseSimulatedDevices). It models the
// rules pskv relies on, stricter than CUDA where that helps find bugs:
//  * Device memory the host cannot touch: each allocation is a memfd mapped twice; the
//    pointer handed out is mapped PROT_NONE (a host read or write faults), the stream
//    threads work through a second, read-write mapping.
//  * Every pointer is checked at each copy and launch: it must lie inside one live
//    allocation of the right device (bounds included); a host pointer must not be a
//    device pointer. A violation throws DeviceError at the call, naming the pointer.
//  * Streams are in-order queues, one thread each (CUDA Programming Guide, "Streams":
//    work in one stream runs in issue order; streams are unordered with each other).
//  * Events follow cudaEventRecord/cudaStreamWaitEvent/cudaEventQuery: a wait waits
//    for the most recent record at the time of the wait call; an event never recorded
//    is complete. All ordering between streams goes through a mutex and a condition
//    variable, so TSan sees exactly the happens-before CUDA promises: a missing wait is
//    a data race report (and, with jitter, a wrong value).
//  * Free waits for every stream first (cudaFree synchronises the device).
//  * Optional jitter: a random delay before each task, per stream, from a seed.
// It is not a performance model: kernels run as plain loops on the stream's thread.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "device/backend.h"
#include "device/sim/sim_kernels.h"
#include "pskv/device.h"

namespace pskv::device {
namespace {

constexpr size_t kPage = 4096;

std::string Hex(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

struct Allocation {
  int device = 0;
  char* host_view = nullptr;  // PROT_NONE: the pointer pskv hands out
  char* dev_view = nullptr;   // read-write: what the stream threads use
  size_t bytes = 0;           // asked for
  size_t mapped = 0;          // page-rounded
};

class SimStream {
 public:
  SimStream(int device, uint64_t jitter_seed, int index)
      : device_(device), jitter_(jitter_seed != 0), rng_(jitter_seed * 1000003u + index) {
    thread_ = std::thread([this] { Loop(); });
    thread_.detach();  // the backend lives for the process
  }
  int device() const { return device_; }

  void Enqueue(std::function<void()> task) {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(task));
    ++enqueued_;
    cv_.notify_all();
  }
  void Sync() {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t target = enqueued_;
    cv_.wait(lk, [&] { return completed_ >= target; });
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return !queue_.empty(); });
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      if (jitter_) {
        std::uniform_int_distribution<int> us(0, 200);
        std::this_thread::sleep_for(std::chrono::microseconds(us(rng_)));
      }
      task();
      {
        std::lock_guard<std::mutex> lk(mu_);
        ++completed_;
      }
      cv_.notify_all();
    }
  }

  const int device_;
  const bool jitter_;
  std::mt19937_64 rng_;  // only the stream's thread uses it
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, completed_ = 0;
  std::thread thread_;
};

struct SimEvent {
  int device = 0;
  uint64_t recorded = 0;   // records issued (under the backend's event lock)
  uint64_t completed = 0;  // the latest record whose stream position was reached
};

class SimBackend final : public Backend {
 public:
  explicit SimBackend(const SimOptions& o) : opts_(o) {}

  const char* Kind() const override { return "simulated"; }
  int DeviceCount() const override { return opts_.devices; }
  std::string Status() const override {
    std::string s = std::to_string(opts_.devices) + " simulated device" +
                    (opts_.devices == 1 ? "" : "s") +
                    " (no GPU is used: device memory is host memory the host cannot touch, "
                    "streams are threads)";
    if (opts_.jitter_seed != 0) s += ", jitter seed " + std::to_string(opts_.jitter_seed);
    return s;
  }
  std::string DeviceName(int device) const override {
    return "simulated device " + std::to_string(device);
  }
  bool CanAccessPeer(int, int) const override { return true; }

  void* Alloc(int device, size_t bytes) override {
    CheckDevice(device, "Alloc");
    const size_t mapped = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
    const int fd = memfd_create("pskv-sim-device", MFD_CLOEXEC);
    if (fd < 0)
      throw DeviceError(std::string("simulated device: memfd_create: ") + strerror(errno));
    if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      const int e = errno;
      close(fd);
      throw DeviceError("simulated device " + std::to_string(device) + ": cannot allocate " +
                        std::to_string(bytes) + " bytes: " + strerror(e));
    }
    void* host = mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
    void* dev = host == MAP_FAILED
                    ? MAP_FAILED
                    : mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (host == MAP_FAILED || dev == MAP_FAILED) {
      if (host != MAP_FAILED) munmap(host, mapped);
      throw DeviceError("simulated device " + std::to_string(device) + ": cannot map " +
                        std::to_string(bytes) + " bytes: " + strerror(e));
    }
    Allocation a{device, static_cast<char*>(host), static_cast<char*>(dev), bytes, mapped};
    std::lock_guard<std::mutex> lk(mem_mu_);
    allocs_[reinterpret_cast<uintptr_t>(host)] = a;
    return host;
  }

  void Free(int device, void* p) override {
    SyncAll();  // as cudaFree: no queued work may still use the memory
    Allocation a;
    {
      std::lock_guard<std::mutex> lk(mem_mu_);
      auto it = allocs_.find(reinterpret_cast<uintptr_t>(p));
      if (it == allocs_.end() || it->second.device != device)
        throw DeviceError("simulated device " + std::to_string(device) + ": Free of " + Hex(p) +
                          ", which is not the start of a live allocation of this device");
      a = it->second;
      allocs_.erase(it);
    }
    munmap(a.host_view, a.mapped);
    munmap(a.dev_view, a.mapped);
  }

  void* HostAlloc(size_t bytes) override {
    void* p = std::aligned_alloc(kPage, (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage);
    if (!p) throw DeviceError("simulated pinned memory: cannot allocate " + std::to_string(bytes));
    return p;
  }
  void HostFree(void* p) override { std::free(p); }

  Stream CreateStream(int device) override {
    CheckDevice(device, "CreateStream");
    std::lock_guard<std::mutex> lk(streams_mu_);
    streams_.push_back(
        std::make_unique<SimStream>(device, opts_.jitter_seed, static_cast<int>(streams_.size())));
    return streams_.back().get();
  }
  int StreamDevice(Stream s) const override { return Of(s, "StreamDevice")->device(); }
  void StreamSync(Stream s) override { Of(s, "StreamSync")->Sync(); }

  void Copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes, CopyKind kind,
            Stream s) override {
    SimStream* st = Of(s, "Copy");
    char* d = nullptr;
    const char* sp = nullptr;
    switch (kind) {
      case CopyKind::kHostToDevice:
        d = Translate(dst, bytes, dst_device, "copy destination");
        sp = static_cast<const char*>(RequireHost(src, bytes, "host source of a copy"));
        break;
      case CopyKind::kDeviceToHost:
        RequireHost(dst, bytes, "host destination of a copy");
        d = static_cast<char*>(dst);
        sp = Translate(src, bytes, src_device, "copy source");
        break;
      case CopyKind::kDeviceToDevice:
      case CopyKind::kPeer:
        if ((kind == CopyKind::kPeer) == (dst_device == src_device))
          throw DeviceError(
              "simulated device: a peer copy is between two devices, a "
              "device-to-device copy within one");
        d = Translate(dst, bytes, dst_device, "copy destination");
        sp = Translate(src, bytes, src_device, "copy source");
        break;
    }
    st->Enqueue([d, sp, bytes] { std::memmove(d, sp, bytes); });
  }

  void Launch(int device, const KernelCall& call, Stream s) override {
    SimStream* st = Of(s, "Launch");
    if (st->device() != device)
      throw DeviceError("simulated device " + std::to_string(device) +
                        ": kernel launched on a stream of device " + std::to_string(st->device()));
    KernelCall c = call;  // with the stream threads' pointers
    c.dst = Translate(call.dst, call.DstBytes(), device, "kernel output");
    const int nsrc = call.op == KernelCall::Op::kSum ? call.k
                     : (call.op == KernelCall::Op::kConvert || call.op == KernelCall::Op::kUpdate)
                         ? 1
                         : 0;
    for (int i = 0; i < nsrc; ++i)
      c.src[i] = Translate(call.src[i], call.SrcBytes(i), device, "kernel input");
    if (call.op == KernelCall::Op::kUpdate)
      for (int i = 0; i < call.k; ++i)
        c.slots[i] = reinterpret_cast<float*>(
            Translate(call.slots[i], static_cast<size_t>(call.n) * 4, device, "optimizer state"));
    st->Enqueue([c] { RunSimKernel(c); });
  }

  void HostCallback(Stream s, std::function<void()> fn) override {
    Of(s, "HostCallback")->Enqueue(std::move(fn));
  }

  Event CreateEvent(int device) override {
    CheckDevice(device, "CreateEvent");
    auto* e = new SimEvent;
    e->device = device;
    return e;
  }
  void DestroyEvent(Event e) override { delete static_cast<SimEvent*>(e); }
  void Record(Event ev, Stream s) override {
    auto* e = static_cast<SimEvent*>(ev);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lk(ev_mu_);
      gen = ++e->recorded;
    }
    Of(s, "Record")->Enqueue([this, e, gen] {
      {
        std::lock_guard<std::mutex> lk(ev_mu_);
        if (e->completed < gen) e->completed = gen;
      }
      ev_cv_.notify_all();
    });
  }
  void WaitEvent(Stream waiter, Event ev) override {
    auto* e = static_cast<SimEvent*>(ev);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lk(ev_mu_);
      gen = e->recorded;  // the most recent record at the time of the call
    }
    if (gen == 0) return;
    Of(waiter, "WaitEvent")->Enqueue([this, e, gen] {
      std::unique_lock<std::mutex> lk(ev_mu_);
      ev_cv_.wait(lk, [&] { return e->completed >= gen; });
    });
  }
  bool Query(Event ev) override {
    auto* e = static_cast<SimEvent*>(ev);
    std::lock_guard<std::mutex> lk(ev_mu_);
    return e->completed >= e->recorded;
  }
  void EventSync(Event ev) override {
    auto* e = static_cast<SimEvent*>(ev);
    std::unique_lock<std::mutex> lk(ev_mu_);
    const uint64_t gen = e->recorded;
    ev_cv_.wait(lk, [&] { return e->completed >= gen; });
  }

 private:
  void CheckDevice(int device, const char* what) const {
    if (device < 0 || device >= opts_.devices)
      throw DeviceUnavailable(std::string("simulated ") + what + ": device " +
                              std::to_string(device) + " does not exist (" +
                              std::to_string(opts_.devices) + " simulated devices)");
  }
  SimStream* Of(Stream s, const char* what) const {
    std::lock_guard<std::mutex> lk(streams_mu_);
    for (auto& p : streams_)
      if (p.get() == s) return p.get();
    throw DeviceError(std::string("simulated device: ") + what + " on " + Hex(s) +
                      ", which is not a stream of the simulated backend");
  }
  void SyncAll() {
    std::vector<SimStream*> all;
    {
      std::lock_guard<std::mutex> lk(streams_mu_);
      for (auto& p : streams_) all.push_back(p.get());
    }
    for (SimStream* s : all) s->Sync();
  }

  // The stream threads' view of [p, p+bytes) on `device`; DeviceError when the range is
  // not inside one live allocation of that device.
  char* Translate(const void* p, size_t bytes, int device, const char* what) {
    const auto u = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lk(mem_mu_);
    auto it = allocs_.upper_bound(u);
    if (it != allocs_.begin()) {
      --it;
      const Allocation& a = it->second;
      const uintptr_t base = it->first;
      if (u >= base && u - base <= a.bytes && bytes <= a.bytes - (u - base)) {
        if (a.device != device)
          throw DeviceError("simulated device: the " + std::string(what) + " " + Hex(p) +
                            " is memory of device " + std::to_string(a.device) +
                            ", used as memory of device " + std::to_string(device));
        return a.dev_view + (u - base);
      }
    }
    throw DeviceError("simulated device " + std::to_string(device) + ": the " + what + " " +
                      Hex(p) + " (" + std::to_string(bytes) +
                      " bytes) is not inside a live allocation of this device (host memory, "
                      "freed, or out of bounds)");
  }
  const void* RequireHost(const void* p, size_t bytes, const char* what) {
    const auto u = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lk(mem_mu_);
    auto it = allocs_.upper_bound(u + (bytes ? bytes - 1 : 0));
    if (it != allocs_.begin()) {
      --it;
      if (it->first + it->second.mapped > u)
        throw DeviceError(std::string("simulated device: the ") + what + " " + Hex(p) +
                          " is device memory (of device " + std::to_string(it->second.device) +
                          ")");
    }
    return p;
  }

  const SimOptions opts_;
  std::mutex mem_mu_;
  std::map<uintptr_t, Allocation> allocs_;  // by host_view
  mutable std::mutex streams_mu_;
  std::vector<std::unique_ptr<SimStream>> streams_;
  std::mutex ev_mu_;
  std::condition_variable ev_cv_;
};

}  // namespace

std::unique_ptr<Backend> MakeSimBackend(const SimOptions& options) {
  return std::make_unique<SimBackend>(options);
}

}  // namespace pskv::device
