// Device names and the PSKV_CUDA_FAKE_DEVICES parse: plain C++, in every build.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "common/env_table.h"
#include "device/runtime.h"
#include "pskv/device.h"
#include "pskv/error.h"

namespace pskv {

std::string Device::str() const {
  switch (type) {
    case Type::kCPU:
      return "cpu";
    case Type::kCUDA:
      return "cuda:" + std::to_string(id);
    case Type::kCUDAHost:
      return "cpu_pinned";
  }
  return "device(" + std::to_string(static_cast<int>(type)) + ")";
}

Device ParseDevice(const std::string& s) {
  if (s == "cpu") return Device::CPU();
  if (s == "cpu_pinned") return Device::Pinned();
  if (s == "cuda" || s == "gpu") return Device::CUDA(0);
  for (const char* prefix : {"cuda:", "gpu:"}) {
    const std::string p(prefix);
    if (s.rfind(p, 0) == 0 && s.size() > p.size() && s.size() - p.size() <= 4) {
      int id = 0;
      bool ok = true;
      for (size_t i = p.size(); i < s.size(); ++i) {
        if (s[i] < '0' || s[i] > '9') ok = false;
        id = id * 10 + (s[i] - '0');
      }
      if (ok) return Device::CUDA(id);
    }
  }
  throw InvalidArgument("unknown device '" + s + "'; valid: cpu, cpu_pinned, cuda, cuda:N, gpu:N");
}

namespace cuda {

// The ranges are the environment table's (common/env_table.cc); null or "" is 0 (off).
namespace {
int DeviceCountVariable(const char* name, const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  return static_cast<int>(EnvInt(*FindEnvVar(name), value));
}
}  // namespace

int ParseFakeDevices(const char* value) {
  return DeviceCountVariable("PSKV_CUDA_FAKE_DEVICES", value);
}
int ParseSimDevices(const char* value) {
  return DeviceCountVariable("PSKV_SIM_DEVICES", value);
}

}  // namespace cuda
}  // namespace pskv
