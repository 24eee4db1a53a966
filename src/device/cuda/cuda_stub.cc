// MakeCudaBackend for builds without CUDA: a backend with no device, whose Status()
// says that pskv was built without CUDA. The runtime never calls its other methods
// (it checks DeviceCount first); they throw DeviceUnavailable all the same.
#include "device/backend.h"
#include "device/runtime.h"

namespace pskv::device {
namespace {

[[noreturn]] void Unavailable() {
  throw DeviceUnavailable(cuda::kBuiltWithoutCuda);
}

class NoCudaBackend final : public Backend {
 public:
  const char* Kind() const override { return "cuda"; }
  int DeviceCount() const override { return 0; }
  std::string Status() const override { return cuda::kBuiltWithoutCuda; }
  std::string DeviceName(int) const override { Unavailable(); }
  bool CanAccessPeer(int, int) const override { return false; }
  void* Alloc(int, size_t) override { Unavailable(); }
  void Free(int, void*) override { Unavailable(); }
  void* HostAlloc(size_t) override { Unavailable(); }
  void HostFree(void*) override { Unavailable(); }
  Stream CreateStream(int) override { Unavailable(); }
  int StreamDevice(Stream) const override { Unavailable(); }
  void StreamSync(Stream) override { Unavailable(); }
  void Copy(void*, int, const void*, int, size_t, CopyKind, Stream) override { Unavailable(); }
  void Launch(int, const KernelCall&, Stream) override { Unavailable(); }
  void HostCallback(Stream, std::function<void()>) override { Unavailable(); }
  Event CreateEvent(int) override { Unavailable(); }
  void DestroyEvent(Event) override { Unavailable(); }
  void Record(Event, Stream) override { Unavailable(); }
  void WaitEvent(Stream, Event) override { Unavailable(); }
  bool Query(Event) override { Unavailable(); }
  void EventSync(Event) override { Unavailable(); }
};

}  // namespace

std::unique_ptr<Backend> MakeCudaBackend() {
  return std::make_unique<NoCudaBackend>();
}
bool CudaBackendBuilt() {
  return false;
}

}  // namespace pskv::device
