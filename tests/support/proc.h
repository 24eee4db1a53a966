// Starting and watching real processes in tests (each in its own process group).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace pskv::test {

/// Starts argv with `env` added, stdout/stderr to `log` (appended).
inline pid_t Spawn(const std::vector<std::string>& argv,
                   const std::map<std::string, std::string>& env, const std::string& log) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    FILE* f = std::fopen(log.c_str(), "a");
    if (f) {
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
    }
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execvp(a[0], a.data());
    _exit(127);
  }
  ::setpgid(pid, pid);
  return pid;
}

/// Exit status (or 128+signal) if `pid` ends within `timeout`; nullopt otherwise.
/// Polls every 20 ms: bounded in time by `timeout`.
inline std::optional<int> WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Polls (bounded) until `path` exists.
inline bool WaitFile(const std::string& path, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (::access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

/// Pids of live processes whose environment contains `needle` (e.g. "TAG=xyz").
inline std::vector<pid_t> PidsWithEnv(const std::string& needle) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    // zombies have an empty environ; they are not running
    size_t pos = 0;
    while (pos < env.size()) {
      size_t z = env.find('\0', pos);
      if (z == std::string::npos) z = env.size();
      if (env.compare(pos, z - pos, needle) == 0) {
        out.push_back(pid);
        break;
      }
      pos = z + 1;
    }
  }
  ::closedir(d);
  return out;
}

/// The whole file's bytes ("" when it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace pskv::test
