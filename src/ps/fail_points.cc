#include "ps/fail_points.h"

#include <mutex>

namespace pskv {

namespace {
std::mutex& FactoryMutex() {
  static std::mutex mu;
  return mu;
}
FailPointsFactory& Factory() {
  static FailPointsFactory f;
  return f;
}
}  // namespace

void InstallFailPoints(FailPointsFactory factory) {
  std::lock_guard<std::mutex> lk(FactoryMutex());
  Factory() = std::move(factory);
}

std::unique_ptr<FailPoints> MakeFailPoints(const Node& node) {
  FailPointsFactory f;
  {
    std::lock_guard<std::mutex> lk(FactoryMutex());
    f = Factory();
  }
  if (f)
    if (auto fp = f(node)) return fp;
  return std::make_unique<FailPoints>();
}

}  // namespace pskv
