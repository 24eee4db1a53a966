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

// ------------------------------------------------------------------ RateLimiter
#include "common/rate_limit.h"

namespace pskv {

bool RateLimiter::Allow(const std::string& key, uint64_t* suppressed) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (entries_.size() >= max_keys_) {
      // Forget the entry idle longest: memory stays bounded under a flood of keys.
      auto oldest = entries_.begin();
      for (auto e = entries_.begin(); e != entries_.end(); ++e)
        if (e->second.last < oldest->second.last) oldest = e;
      entries_.erase(oldest);
    }
    entries_[key] = Entry{now, 0};
    *suppressed = 0;
    return true;
  }
  if (now - it->second.last < interval_) {
    ++it->second.suppressed;
    return false;
  }
  *suppressed = it->second.suppressed;
  it->second = Entry{now, 0};
  return true;
}

}  // namespace pskv
