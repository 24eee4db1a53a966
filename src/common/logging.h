// Minimal leveled logging to stderr. Every line names the process's node
// ("[pskv worker[1]] ..."), so interleaved output of a job stays readable.
//
// Levels per module: a line's module is its source directory under src/ ("ps",
// "kvstore", "transport", "common", "launcher"), taken from __FILE__, so call sites
// name nothing. SetLogLevels("warn,ps=info") (PSKV_LOG_LEVEL) hides INFO lines of all
// modules but ps. PS_VERBOSE still selects what the ps module says at INFO.
#pragma once

#include <sstream>
#include <string>

namespace pskv {

/// Sets the name printed in every line of this process (default "pskv").
void SetLogName(const std::string& name);
std::string LogName();
/// Writes one line to stderr atomically.
void LogLine(const char* level, const std::string& msg);

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };
/// "LEVEL" or "LEVEL,module=LEVEL,...", levels debug|info|warn|error|off (the first,
/// without a module, is the default; default info). Throws ConfigError naming
/// PSKV_LOG_LEVEL on a malformed spec. Process-wide, like the log name.
void SetLogLevels(const std::string& spec);
/// Only checks `spec` (throws like SetLogLevels).
void CheckLogLevels(const std::string& spec);
/// Whether a line at `level` from source file `file` (__FILE__) is written.
bool LogEnabled(const char* file, LogLevel level);
/// The module of a source file: "ps" for ".../src/ps/node.cc", "" if none.
std::string LogModule(const char* file);

}  // namespace pskv

#define PSKV_LOG_AT(lvl, name, expr)                           \
  do {                                                         \
    if (::pskv::LogEnabled(__FILE__, ::pskv::LogLevel::lvl)) { \
      std::ostringstream pskv_log_os_;                         \
      pskv_log_os_ << expr;                                    \
      ::pskv::LogLine(name, pskv_log_os_.str());               \
    }                                                          \
  } while (0)
#define PSKV_DEBUG(expr) PSKV_LOG_AT(kDebug, "DEBUG", expr)
#define PSKV_INFO(expr) PSKV_LOG_AT(kInfo, "INFO", expr)
#define PSKV_WARN(expr) PSKV_LOG_AT(kWarn, "WARN", expr)
#define PSKV_ERROR(expr) PSKV_LOG_AT(kError, "ERROR", expr)
