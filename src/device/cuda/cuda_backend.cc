// CudaBackend (device/backend.h): the only code in pskv that calls the CUDA runtime.
// Linked against the static cudart, so libpskv needs no libcudart at run time and runs
// on machines without a driver (DeviceCount() is 0 there, Status() says why).
//
// Verified only on a real GPU (docs/gpu.md, "What only a GPU executes"): this file,
// kernels.cu's launches, and nvcc's code for device/kernel_ops.h.
#include <cuda_runtime_api.h>

#include <string>

#include "device/backend.h"
#include "device/cuda/kernels.h"
#include "pskv/device.h"

namespace pskv::device {
namespace {

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
  explicit DeviceGuard(int device) {
    Check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) Check(cudaSetDevice(device), "cudaSetDevice");
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

cudaStream_t S(Stream s) {
  return static_cast<cudaStream_t>(s);
}
cudaEvent_t E(Event e) {
  return static_cast<cudaEvent_t>(e);
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
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
    count_ = n;
    status_ = std::to_string(n) + (n == 1 ? " device: " : " devices, the first: ") + DeviceName(0);
  }

  const char* Kind() const override { return "cuda"; }
  int DeviceCount() const override { return count_; }
  std::string Status() const override { return status_; }
  std::string DeviceName(int device) const override {
    cudaDeviceProp prop{};
    return cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "?";
  }
  bool CanAccessPeer(int to, int from) const override {
    if (to == from) return true;
    int ok = 0;
    return cudaDeviceCanAccessPeer(&ok, to, from) == cudaSuccess && ok;
  }

  void* Alloc(int device, size_t bytes) override {
    DeviceGuard g(device);
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      throw DeviceError("cannot allocate " + std::to_string(bytes) +
                        " bytes on cuda:" + std::to_string(device) + ": " + ErrorText(rc));
    }
    return p;
  }
  void Free(int device, void* p) override {
    DeviceGuard g(device);
    cudaFree(p);  // a failure here (a sticky error from an earlier fault) has been reported
  }
  void* HostAlloc(size_t bytes) override {
    void* p = nullptr;
    Check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void HostFree(void* p) override { cudaFreeHost(p); }

  Stream CreateStream(int device) override {
    DeviceGuard g(device);
    cudaStream_t s = nullptr;
    // Non-blocking: a blocking stream would synchronise with the legacy default stream
    // that frameworks train on.
    Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  int StreamDevice(Stream s) const override {
    int d = 0;
    Check(cudaStreamGetDevice(S(s), &d), "cudaStreamGetDevice");
    return d;
  }
  void StreamSync(Stream s) override {
    Check(cudaStreamSynchronize(S(s)), "cudaStreamSynchronize");
  }

  void Copy(void* dst, int dst_device, const void* src, int src_device, size_t bytes, CopyKind kind,
            Stream s) override {
    switch (kind) {
      case CopyKind::kPeer: {
        DeviceGuard g(dst_device);
        Check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, S(s)),
              "cudaMemcpyPeerAsync");
        return;
      }
      case CopyKind::kDeviceToDevice: {
        DeviceGuard g(dst_device);
        Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S(s)), "cudaMemcpyAsync");
        return;
      }
      case CopyKind::kHostToDevice: {
        DeviceGuard g(dst_device);
        Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, S(s)), "cudaMemcpyAsync");
        return;
      }
      case CopyKind::kDeviceToHost: {
        DeviceGuard g(src_device);
        Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, S(s)), "cudaMemcpyAsync");
        return;
      }
    }
  }

  void Launch(int device, const KernelCall& call, Stream s) override {
    DeviceGuard g(device);
    Check(cuda_kernels::Launch(call, S(s)), "kernel launch");
  }

  void HostCallback(Stream s, std::function<void()> fn) override {
    auto* heap = new std::function<void()>(std::move(fn));
    const cudaError_t rc = cudaLaunchHostFunc(
        S(s),
        [](void* p) {
          auto* f = static_cast<std::function<void()>*>(p);
          (*f)();
          delete f;
        },
        heap);
    if (rc != cudaSuccess) delete heap;
    Check(rc, "cudaLaunchHostFunc");
  }

  Event CreateEvent(int device) override {
    DeviceGuard g(device);
    cudaEvent_t e = nullptr;
    Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void DestroyEvent(Event e) override { cudaEventDestroy(E(e)); }
  void Record(Event e, Stream s) override {
    // An event must be recorded with its stream's device current.
    DeviceGuard g(StreamDevice(s));
    Check(cudaEventRecord(E(e), S(s)), "cudaEventRecord");
  }
  void WaitEvent(Stream waiter, Event e) override {
    Check(cudaStreamWaitEvent(S(waiter), E(e), 0), "cudaStreamWaitEvent");
  }
  bool Query(Event e) override {
    const cudaError_t rc = cudaEventQuery(E(e));
    if (rc == cudaErrorNotReady) return false;
    Check(rc, "cudaEventQuery");
    return true;
  }
  void EventSync(Event e) override { Check(cudaEventSynchronize(E(e)), "cudaEventSynchronize"); }

 private:
  int count_ = 0;
  std::string status_;
};

}  // namespace

std::unique_ptr<Backend> MakeCudaBackend() {
  return std::make_unique<CudaBackend>();
}
bool CudaBackendBuilt() {
  return true;
}

}  // namespace pskv::device
