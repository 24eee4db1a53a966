// Device names and the PSKV_CUDA_FAKE_DEVICES parse: plain C++, in every build.
#include <cerrno>
#include <cstdlib>
#include <string>

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

int ParseFakeDevices(const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < 1 || v > 64)
    throw ConfigError(std::string("environment variable PSKV_CUDA_FAKE_DEVICES='") + value +
                      "' must be an integer in [1, 64] (logical GPUs mapped onto GPU 0; "
                      "unset it to use the real devices)");
  return static_cast<int>(v);
}

}  // namespace cuda
}  // namespace pskv
