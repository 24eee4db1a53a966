// Minimal leveled logging to stderr. Every line names the process's node
// ("[pskv worker[1]] ..."), so interleaved output of a job stays readable.
#pragma once

#include <sstream>
#include <string>

namespace pskv {

/// Sets the name printed in every line of this process (default "pskv").
void SetLogName(const std::string& name);
std::string LogName();
/// Writes one line to stderr atomically.
void LogLine(const char* level, const std::string& msg);

}  // namespace pskv

#define PSKV_LOG(level, expr)                   \
  do {                                          \
    std::ostringstream pskv_log_os_;            \
    pskv_log_os_ << expr;                       \
    ::pskv::LogLine(level, pskv_log_os_.str()); \
  } while (0)
#define PSKV_INFO(expr) PSKV_LOG("INFO", expr)
#define PSKV_WARN(expr) PSKV_LOG("WARN", expr)
#define PSKV_ERROR(expr) PSKV_LOG("ERROR", expr)
