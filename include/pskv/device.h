// Devices: where an NDArray's memory lives, and what pskv's CUDA layer can say about
// the machine.
//
// Three kinds of memory (the codes are DLPack's device types):
//  * kCPU      — ordinary host memory;
//  * kCUDA     — device memory of CUDA device `id` (a *logical* ordinal, see below):
//                never dereferenced by the host; CPU-only operations on it throw
//                UsageError naming the way out (NDArray::To(Device::CPU()));
//  * kCUDAHost — page-locked (pinned) host memory: reachable from the host, so every
//                CPU operation works on it, and copies to/from the GPU run at full
//                PCIe speed.
//
// CUDA is initialised lazily: nothing here or in NDArray touches the CUDA driver until
// the first operation that needs a GPU (allocating or copying a kCUDA/kCUDAHost array,
// DeviceCount()). A process that never sees a CUDA array (servers, the scheduler,
// forked children such as data-loader workers) never initialises CUDA.
//
// Simulated devices: with PSKV_SIM_DEVICES=k (or cuda::UseSimulatedDevices(k)) the
// devices cuda:0..k-1 are pskv's simulated devices (docs/gpu.md): every kCUDA code
// path runs on a machine without a GPU, with memory the host cannot touch.
//
// Logical devices: Device::CUDA(i) names logical device i. In production logical i is
// physical i. The test mode PSKV_CUDA_FAKE_DEVICES=k maps logical devices 0..k-1 onto
// physical device 0, so that multi-GPU code paths (placement, peer copies) run on a
// machine with one GPU; copies between different logical devices are counted as peer
// copies there too. See docs/gpu.md.
#pragma once

#include <cstdint>
#include <string>

#include "pskv/error.h"

namespace pskv {

struct Device {
  enum class Type : uint8_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3 };
  Type type = Type::kCPU;
  int id = 0;  // the CUDA ordinal for kCUDA; 0 otherwise

  static Device CPU() { return {}; }
  static Device CUDA(int id) { return {Type::kCUDA, id}; }
  static Device Pinned() { return {Type::kCUDAHost, 0}; }

  bool is_cuda() const { return type == Type::kCUDA; }
  /// True when the host may read and write the memory (kCPU and kCUDAHost).
  bool host_accessible() const { return type != Type::kCUDA; }
  /// "cpu", "cuda:1", "cpu_pinned".
  std::string str() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.id == b.id;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

/// Parses "cpu", "cuda", "cuda:N", "gpu:N" (MXNet's name) and "cpu_pinned";
/// InvalidArgument otherwise.
Device ParseDevice(const std::string& s);

/// No usable CUDA device for an operation that needs one: pskv was built without CUDA,
/// the machine has no driver (cudaErrorInsufficientDriver) or no device
/// (cudaErrorNoDevice), or the logical ordinal is out of range. The message says which.
class DeviceUnavailable : public UsageError {
 public:
  using UsageError::UsageError;
};

/// A CUDA call failed on a machine that has a GPU (out of device memory, a kernel
/// fault, ...). The message names the call and CUDA's error name.
class DeviceError : public Error {
 public:
  using Error::Error;
};

namespace cuda {

/// True when pskv was compiled with CUDA (PSKV_WITH_CUDA). Does not touch the driver.
bool Built();
/// True once something in this process initialised CUDA through pskv. Does not
/// initialise it (tests use it to prove that CPU-only processes never do).
bool Initialized();
/// Number of usable logical CUDA devices; 0 when not built, without a driver or
/// without a device. Initialises CUDA on the first call.
int DeviceCount();
/// One line for messages and test skips: "pskv was built without CUDA (...)",
/// "cudaErrorInsufficientDriver: ...", "1 device: NVIDIA H100 80GB HBM3", or
/// "4 simulated devices (...)". Initialises CUDA on the first call.
std::string Status();
/// True when the devices are simulated (PSKV_SIM_DEVICES=k, or UseSimulatedDevices):
/// pskv's own CPU-backed device runtime, for dry runs of multi-device code and for CI
/// (docs/gpu.md). Initialises the runtime on the first call.
bool Simulated();
/// Switches this process to `devices` simulated devices (1..64). Must come before the
/// first use of any device (UsageError otherwise, unless the runtime already simulates
/// that many). `jitter_seed` != 0 adds random delays to every simulated stream (as
/// PSKV_SIM_JITTER). Never a fallback: a process asks for it explicitly.
void UseSimulatedDevices(int devices, uint64_t jitter_seed = 0);
/// The device's name: "simulated device 1", "NVIDIA H200". DeviceUnavailable if none.
std::string DeviceName(int id);

/// Bytes and counts of the copies pskv's device runtime made since the start (or the
/// last ResetStats), with either backend (the simulated one counts exactly as the CUDA
/// one). Always on (relaxed atomics); read from any thread. Copies between different
/// logical devices count as peer copies even when they map onto one physical GPU; a
/// copy between devices without peer access (or with MXNET_ENABLE_GPU_P2P=0) goes
/// through pinned host memory and counts as one d2h and one h2d.
struct Counters {
  uint64_t d2h_bytes = 0, d2h_count = 0;
  uint64_t h2d_bytes = 0, h2d_count = 0;
  uint64_t d2d_bytes = 0, d2d_count = 0;    // within one logical device
  uint64_t peer_bytes = 0, peer_count = 0;  // between logical devices
  uint64_t kernel_launches = 0;
};
Counters Stats();
void ResetStats();

}  // namespace cuda
}  // namespace pskv
