#include "common/logging.h"

#include <unistd.h>

#include <mutex>

namespace pskv {

namespace {
std::mutex& NameMu() {
  static std::mutex mu;
  return mu;
}
std::string& Name() {
  static std::string name = "pskv";
  return name;
}
}  // namespace

void SetLogName(const std::string& name) {
  std::lock_guard<std::mutex> lk(NameMu());
  Name() = name;
}

std::string LogName() {
  std::lock_guard<std::mutex> lk(NameMu());
  return Name();
}

void LogLine(const char* level, const std::string& msg) {
  std::string line = "[" + LogName() + "] " + level + ": " + msg + "\n";
  // One write() so that lines of concurrent threads do not interleave.
  ssize_t r = ::write(STDERR_FILENO, line.data(), line.size());
  (void)r;
}

}  // namespace pskv
