// A job of real processes (scheduler, servers, workers running dist_worker
// scenarios) started directly, each with its own environment; every exit status is
// collected within a bound. Needs PSKV_SERVER and DIST_WORKER defined.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "support/proc.h"
#include "support/test_util.h"

namespace pskv::test {

using Env = std::map<std::string, std::string>;

struct Spec {
  int workers = 2, servers = 1;
  std::string scenario;
  std::string
      program;  // worker program instead of dist_worker (then `scenario` only names the job)
  int rounds = 4;
  Env env;                        // every process
  std::map<int, Env> server_env;  // by server start index
  std::chrono::milliseconds bound{90000};
};

struct Result {
  std::vector<int> workers;  // exit status per worker start index (-1: still running)
  std::vector<int> others;   // scheduler, servers
  std::string log;
};

inline Result RunJob(const Spec& s) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("pskv_rounds_" + s.scenario + "_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/log";
  const int port = FreePort();
  auto env = [&](const std::string& role, const Env& extra) {
    Env e = {{"DMLC_ROLE", role},
             {"DMLC_PS_ROOT_URI", "127.0.0.1"},
             {"DMLC_PS_ROOT_PORT", std::to_string(port)},
             {"DMLC_NUM_SERVER", std::to_string(s.servers)},
             {"DMLC_NUM_WORKER", std::to_string(s.workers)},
             {"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"},
             {"PS_HEARTBEAT_INTERVAL", "0.5"},
             {"PS_HEARTBEAT_TIMEOUT", "5"},
             {"PSKV_TIMEOUT", "60"}};
    for (auto& [k, v] : s.env) e[k] = v;
    for (auto& [k, v] : extra) e[k] = v;
    return e;
  };
  std::vector<pid_t> others, workers;
  others.push_back(Spawn({PSKV_SERVER}, env("scheduler", {}), log));
  for (int i = 0; i < s.servers; ++i) {
    auto it = s.server_env.find(i);
    others.push_back(
        Spawn({PSKV_SERVER}, env("server", it == s.server_env.end() ? Env{} : it->second), log));
  }
  for (int i = 0; i < s.workers; ++i)
    workers.push_back(Spawn(s.program.empty() ? std::vector<std::string>{DIST_WORKER, s.scenario,
                                                                         std::to_string(s.rounds)}
                                              : std::vector<std::string>{s.program},
                            env("worker", {{"DMLC_TASK_ID", std::to_string(i)}}), log));
  Result r;
  const auto end = std::chrono::steady_clock::now() + s.bound;
  auto wait = [&](pid_t p) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    return WaitExit(p, std::max(left, std::chrono::milliseconds(1))).value_or(-1);
  };
  for (pid_t p : workers) r.workers.push_back(wait(p));
  for (pid_t p : others) r.others.push_back(wait(p));
  for (pid_t p : others) ::kill(-p, SIGKILL), ::waitpid(p, nullptr, WNOHANG);
  for (pid_t p : workers) ::kill(-p, SIGKILL), ::waitpid(p, nullptr, WNOHANG);
  r.log = ReadFile(log);
  std::filesystem::remove_all(dir);
  return r;
}

inline bool Has(const std::string& log, const std::string& needle) {
  return log.find(needle) != std::string::npos;
}

inline void ExpectWorkersPassed(const Result& r) {
  for (size_t i = 0; i < r.workers.size(); ++i)
    EXPECT_EQ(r.workers[i], 0) << "worker " << i << "; log:\n" << r.log;
}

}  // namespace pskv::test
