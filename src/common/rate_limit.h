// Rate-limited warnings: at most one line per (peer, reason) per interval, the
// next one saying how many were suppressed. Bounded: at most `max_keys` keys are
// remembered (the oldest are forgotten), so a flood of distinct peers cannot grow
// memory either. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace pskv {

class RateLimiter {
 public:
  explicit RateLimiter(std::chrono::milliseconds interval = std::chrono::seconds(10),
                       size_t max_keys = 256)
      : interval_(interval), max_keys_(max_keys) {}

  /// True when a line for `key` may be written now; then *suppressed is the
  /// number of calls for `key` that returned false since the last line.
  bool Allow(const std::string& key, uint64_t* suppressed);

 private:
  struct Entry {
    std::chrono::steady_clock::time_point last;
    uint64_t suppressed = 0;
  };
  std::chrono::milliseconds interval_;
  size_t max_keys_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

}  // namespace pskv

/// Logs `expr` at `level` unless a line with the same key was logged within the
/// limiter's interval; appends "(N similar suppressed)".
#define PSKV_LOG_LIMITED(limiter, key, level, expr)                                       \
  do {                                                                                    \
    uint64_t pskv_supp_ = 0;                                                              \
    if ((limiter).Allow((key), &pskv_supp_)) {                                            \
      std::ostringstream pskv_log_os_;                                                    \
      pskv_log_os_ << expr;                                                               \
      if (pskv_supp_) pskv_log_os_ << " (" << pskv_supp_ << " similar lines suppressed)"; \
      ::pskv::LogLine(level, pskv_log_os_.str());                                         \
    }                                                                                     \
  } while (0)
