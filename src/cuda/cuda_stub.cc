// The CUDA runtime layer (runtime.h) for builds without CUDA: nothing is available, and
// every entry point that needs a GPU throws DeviceUnavailable(kBuiltWithoutCuda).
#include "cuda/runtime.h"

namespace pskv::cuda {
namespace {
[[noreturn]] void Unavailable() {
  throw DeviceUnavailable(kBuiltWithoutCuda);
}
}  // namespace

bool Built() {
  return false;
}
bool Initialized() {
  return false;
}
int DeviceCount() {
  return 0;
}
std::string Status() {
  return kBuiltWithoutCuda;
}
Counters Stats() {
  return {};
}
void ResetStats() {}

void RequireDevice(int) {
  Unavailable();
}
int PhysicalDevice(int) {
  Unavailable();
}
Stream GetStream(int, StreamKind) {
  Unavailable();
}
void StreamSync(Stream) {
  Unavailable();
}
void WaitStream(int, Stream, Stream) {
  Unavailable();
}
Event RecordEvent(int, Stream) {
  Unavailable();
}
bool EventDone(Event) {
  Unavailable();
}
void EventSync(Event) {
  Unavailable();
}
void ReleaseEvent(int, Event) {
  Unavailable();
}
void* DeviceAlloc(int, size_t) {
  Unavailable();
}
void DeviceFree(int, void*) {
  Unavailable();
}
void* PinnedAlloc(size_t) {
  Unavailable();
}
void PinnedFree(void*, size_t) {
  Unavailable();
}
size_t PinnedPoolCachedBytes() {
  return 0;
}
void CopyAsync(void*, Device, const void*, Device, size_t, Stream) {
  Unavailable();
}
void Sum(const std::vector<NDArray>&, NDArray*, Stream) {
  Unavailable();
}
void Convert(const NDArray&, NDArray*, Stream) {
  Unavailable();
}
void Fill(NDArray*, double, Stream) {
  Unavailable();
}
void Scale(NDArray*, double, Stream) {
  Unavailable();
}

}  // namespace pskv::cuda
