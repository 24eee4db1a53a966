#include "common/logging.h"

#include <unistd.h>

#include <map>
#include <mutex>
#include <sstream>

#include "pskv/error.h"

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
bool g_follow_node = false;   // guarded by NameMu()
bool g_adopted_node = false;  // guarded by NameMu()
thread_local const LogScope* t_scope = nullptr;
}  // namespace

void SetLogName(const std::string& name) {
  std::lock_guard<std::mutex> lk(NameMu());
  Name() = name;
}

std::string LogName() {
  std::lock_guard<std::mutex> lk(NameMu());
  return Name();
}

void SetLogNameFollowingNode(const std::string& until) {
  std::lock_guard<std::mutex> lk(NameMu());
  g_follow_node = true;
  if (!g_adopted_node) Name() = until;
}

void AdoptNodeLogName(const std::string& tag) {
  std::lock_guard<std::mutex> lk(NameMu());
  if (!g_follow_node || g_adopted_node) return;
  g_adopted_node = true;
  Name() = tag;
}

LogScope::LogScope(std::function<std::string()> name) : name_(std::move(name)), outer_(t_scope) {
  t_scope = this;
}

LogScope::~LogScope() {
  t_scope = outer_;
}

std::string LineName() {
  return t_scope ? t_scope->name_() : LogName();
}

namespace {
struct Levels {
  std::mutex mu;
  LogLevel fallback = LogLevel::kInfo;
  std::map<std::string, LogLevel> modules;
};
Levels& L() {
  static Levels* l = new Levels;  // used from any thread until exit
  return *l;
}
LogLevel ParseLevel(const std::string& spec, const std::string& v) {
  if (v == "debug") return LogLevel::kDebug;
  if (v == "info") return LogLevel::kInfo;
  if (v == "warn" || v == "warning") return LogLevel::kWarn;
  if (v == "error") return LogLevel::kError;
  if (v == "off") return LogLevel::kOff;
  throw ConfigError("PSKV_LOG_LEVEL='" + spec + "': unknown level '" + v +
                    "'; use debug, info, warn, error or off, e.g. PSKV_LOG_LEVEL=warn,ps=info");
}
}  // namespace

namespace {
void Parse(const std::string& spec, LogLevel& fallback, std::map<std::string, LogLevel>& modules) {
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos)
      fallback = ParseLevel(spec, item);
    else if (eq == 0)
      throw ConfigError("PSKV_LOG_LEVEL='" + spec + "': '" + item + "' names no module");
    else
      modules[item.substr(0, eq)] = ParseLevel(spec, item.substr(eq + 1));
  }
}
}  // namespace

void CheckLogLevels(const std::string& spec) {
  LogLevel f;
  std::map<std::string, LogLevel> m;
  Parse(spec, f, m);
}

void SetLogLevels(const std::string& spec) {
  LogLevel fallback = LogLevel::kInfo;
  std::map<std::string, LogLevel> modules;
  Parse(spec, fallback, modules);
  Levels& l = L();
  std::lock_guard<std::mutex> lk(l.mu);
  l.fallback = fallback;
  l.modules = std::move(modules);
}

std::string LogModule(const char* file) {
  std::string f = file ? file : "";
  auto at = f.rfind("src/");
  if (at == std::string::npos) return "";
  auto end = f.find('/', at + 4);
  return end == std::string::npos ? "" : f.substr(at + 4, end - at - 4);
}

bool LogEnabled(const char* file, LogLevel level) {
  Levels& l = L();
  std::lock_guard<std::mutex> lk(l.mu);
  if (l.modules.empty()) return level >= l.fallback;
  auto it = l.modules.find(LogModule(file));
  return level >= (it == l.modules.end() ? l.fallback : it->second);
}

void LogLine(const char* level, const std::string& msg) {
  std::string line = "[" + LineName() + "] " + level + ": " + msg + "\n";
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
