// Minimal leveled logging to stderr. Every line starts with a name ("[worker[1]] ..."),
// so interleaved output of a job stays readable.
//
// Whose name: a thread a node owns (its receive and timer threads) writes that node's
// name (LogScope), so several nodes of one process keep their lines apart. Other
// threads write the process's name: "pskv" unless the program set one. Only programs
// set process-wide state (pskv/process.h: ConfigureProcess sets the levels and makes
// the process take its first node's name once the node has joined, AdoptNodeLogName);
// creating stores and nodes never does.
//
// Levels per module: a line's module is its source directory under src/ ("ps",
// "kvstore", "transport", "common", "launcher"), taken from __FILE__, so call sites
// name nothing. SetLogLevels("warn,ps=info") (PSKV_LOG_LEVEL) hides INFO lines of all
// modules but ps. PS_VERBOSE still selects what the ps module says at INFO.
#pragma once

#include <functional>
#include <sstream>
#include <string>

namespace pskv {

/// Sets the name printed in the lines of this process's threads that are not in a
/// LogScope (default "pskv"). Process-wide: for programs (pskv/process.h).
void SetLogName(const std::string& name);
/// The process's name (not a LogScope's).
std::string LogName();
/// Makes the process's name follow its first node: `until` now, the node's name once
/// it has joined (AdoptNodeLogName); nothing if a node's name was already taken.
/// Process-wide: for programs (ConfigureProcess).
void SetLogNameFollowingNode(const std::string& until);
/// Called by a node once it has joined its job under `tag` ("worker[1]"): the
/// process's name becomes `tag` if the program asked for it (SetLogNameFollowingNode)
/// and no node's name was taken before. Otherwise nothing changes.
void AdoptNodeLogName(const std::string& tag);

/// While alive, the lines written by this thread carry `name()` (called per line)
/// instead of the process's name. Scopes nest; each thread has its own.
class LogScope {
 public:
  explicit LogScope(std::function<std::string()> name);
  ~LogScope();
  LogScope(const LogScope&) = delete;
  LogScope& operator=(const LogScope&) = delete;

 private:
  std::function<std::string()> name_;
  const LogScope* outer_;
  friend std::string LineName();
};
/// The name the calling thread's lines carry now.
std::string LineName();
/// Writes one line to stderr atomically.
void LogLine(const char* level, const std::string& msg);

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };
/// "LEVEL" or "LEVEL,module=LEVEL,...", levels debug|info|warn|error|off (the first,
/// without a module, is the default; default info). Throws ConfigError naming
/// PSKV_LOG_LEVEL on a malformed spec. Process-wide: for programs (pskv/process.h).
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
