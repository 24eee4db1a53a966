// A job of real processes with replicated servers (PSKV_REPLICAS) for kill tests:
// a scheduler, servers (pskv-server) and workers (a test program given OUT_DIR as its
// last argument), over real ZeroMQ on loopback, with fast failure detection. One
// server can be killed with SIGKILL once a worker wrote a marker file to OUT_DIR, then
// another, ...; spare servers (PSKV_SPARE_SERVERS) can be started with the job.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/proc.h"
#include "support/test_util.h"

namespace pskv::test {

struct ReplicaJobSpec {
  std::string name;                 // names the job's temporary directory
  std::string server;               // pskv-server
  std::vector<std::string> worker;  // the worker's argv; OUT_DIR is appended
  int servers = 2, workers = 2, replicas = 1;
  int spares = 0;          // PSKV_SPARE_SERVERS: started after the servers, as servers[S..]
  int reply_delay_ms = 0;  // PSKV_TEST_REPLY_DELAY of the servers (spares included)
  std::map<std::string, std::string> env;  // more variables for every process
  // More for server i (a spare's i counts on from the servers: S, S + 1, ...).
  std::map<int, std::map<std::string, std::string>> server_env;
  std::vector<std::string> collect;  // more files of OUT_DIR to return
  // Server i and worker i advertise host 127.0.0.(i + 2) (DMLC_NODE_HOST; a spare its
  // own): one "host" per server and worker pair, as when a server runs on every worker
  // host (Node::HostOf differs between pairs; all still on loopback).
  bool paired_hosts = false;
};

struct ReplicaJobResult {
  bool ok = false;
  std::vector<std::string> weights;          // OUT_DIR/w<rank>.weights of each worker
  double slowest_ms = 0;                     // the largest line of OUT_DIR/w0.times
  std::map<std::string, std::string> files;  // ReplicaJobSpec::collect, by name
  std::string log;                           // every process's output
};

namespace replica_job_detail {

inline std::map<std::string, std::string> Env(const ReplicaJobSpec& s, int port,
                                              const std::string& role) {
  std::map<std::string, std::string> e = {{"DMLC_ROLE", role},
                                          {"DMLC_PS_ROOT_URI", "127.0.0.1"},
                                          {"DMLC_PS_ROOT_PORT", std::to_string(port)},
                                          {"DMLC_NUM_SERVER", std::to_string(s.servers)},
                                          {"DMLC_NUM_WORKER", std::to_string(s.workers)},
                                          {"PSKV_REPLICAS", std::to_string(s.replicas)},
                                          {"PSKV_SPARE_SERVERS", std::to_string(s.spares)},
                                          {"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"},
                                          {"PSKV_WIRE_CHUNK_BYTES", "262144"},
                                          // Fast detection of the silent (killed) server.
                                          {"PS_HEARTBEAT_INTERVAL", "0.2"},
                                          {"PS_HEARTBEAT_TIMEOUT", "1.5"},
                                          {"PSKV_TIMEOUT", "60"}};
  for (auto& [k, v] : s.env) e[k] = v;
  return e;
}

}  // namespace replica_job_detail

/// What a ReplicaKill's `before` sees of the running job.
struct ReplicaJobRun {
  std::string dir;                                  // OUT_DIR
  std::string log;                                  // the path of every process's output
  std::chrono::steady_clock::time_point last_kill;  // of the kill before (or the start)
};

/// A server to kill (SIGKILL) once OUT_DIR/`marker` exists (none: at once), and then
/// `before` (if set) returned "": it may wait for the job to reach a state (a log line,
/// a later round); a non-empty return is why the job fails.
struct ReplicaKill {
  int victim = -1;
  std::string marker;
  std::function<std::string(const ReplicaJobRun&)> before;
};

/// Runs the job, killing the servers of `kills` one after the other (each once its
/// marker exists and its `before` returned). Every worker must exit 0, and the
/// scheduler and the surviving servers (spares included) too; else the test fails
/// (with the job's log) and the result is not ok.
inline ReplicaJobResult RunReplicaJob(const ReplicaJobSpec& s,
                                      const std::vector<ReplicaKill>& kills) {
  using namespace std::chrono_literals;
  namespace d = replica_job_detail;
  ReplicaJobResult res;
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("pskv_replica_" + s.name + "_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/log";
  const int port = FreePort();
  const pid_t scheduler = Spawn({s.server}, d::Env(s, port, "scheduler"), log);
  std::vector<pid_t> servers, workers;
  for (int i = 0; i < s.servers + s.spares; ++i) {
    auto env = d::Env(s, port, "server");
    env["DMLC_TASK_ID"] = std::to_string(i);
    if (i >= s.servers) env["PSKV_SPARE_SERVER"] = "1";
    if (s.reply_delay_ms) env["PSKV_TEST_REPLY_DELAY"] = std::to_string(s.reply_delay_ms);
    if (s.paired_hosts) env["DMLC_NODE_HOST"] = "127.0.0." + std::to_string(i + 2);
    if (auto it = s.server_env.find(i); it != s.server_env.end())
      for (auto& [k, v] : it->second) env[k] = v;
    servers.push_back(Spawn({s.server}, env, log));
  }
  std::vector<std::string> argv = s.worker;
  argv.push_back(dir);
  for (int i = 0; i < s.workers; ++i) {
    auto env = d::Env(s, port, "worker");
    if (s.paired_hosts) env["DMLC_NODE_HOST"] = "127.0.0." + std::to_string(i + 2);
    workers.push_back(Spawn(argv, env, log));
  }
  auto stop = [&] {
    std::vector<pid_t> all = {scheduler};
    all.insert(all.end(), servers.begin(), servers.end());
    all.insert(all.end(), workers.begin(), workers.end());
    for (pid_t p : all) {
      ::kill(-p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  };
  ReplicaJobRun run{dir, log, std::chrono::steady_clock::now()};
  for (const ReplicaKill& k : kills) {
    std::string why;
    if (!k.marker.empty() && !WaitFile(dir + "/" + k.marker, 60s))
      why = k.marker + " never written";
    if (why.empty() && k.before) why = k.before(run);
    if (!why.empty()) {
      ADD_FAILURE() << s.name << ": " << why << "; log:\n" << ReadFile(log);
      stop();
      return res;
    }
    ::kill(servers[static_cast<size_t>(k.victim)], SIGKILL);
    run.last_kill = std::chrono::steady_clock::now();
  }
  for (size_t w = 0; w < workers.size(); ++w) {
    auto st = WaitExit(workers[w], 90s);
    if (!st || *st != 0) {
      ADD_FAILURE() << s.name << ": worker " << w << " "
                    << (st ? "exited " + std::to_string(*st) : std::string("hung")) << "; log:\n"
                    << ReadFile(log);
      stop();
      return res;
    }
    res.weights.push_back(ReadFile(dir + "/w" + std::to_string(w) + ".weights"));
  }
  bool rest_ok = true;
  std::vector<pid_t> rest = {scheduler};
  for (size_t i = 0; i < servers.size(); ++i)
    if (std::none_of(kills.begin(), kills.end(),
                     [&](const ReplicaKill& k) { return k.victim == static_cast<int>(i); }))
      rest.push_back(servers[i]);
  for (pid_t p : rest) {
    auto st = WaitExit(p, 30s);
    if (!st || *st != 0) rest_ok = false;
    EXPECT_TRUE(st.has_value() && *st == 0)
        << s.name << ": pid " << p << " " << (st ? std::to_string(*st) : "hung") << "; log:\n"
        << ReadFile(log);
  }
  for (const std::string& name : s.collect) res.files[name] = ReadFile(dir + "/" + name);
  res.log = ReadFile(log);
  std::ifstream t(dir + "/w0.times");
  double ms = 0;
  while (t >> ms) res.slowest_ms = std::max(res.slowest_ms, ms);
  stop();
  std::filesystem::remove_all(dir);
  res.ok = rest_ok;
  return res;
}

/// Every worker's final weights in `got` are bitwise-equal to the undisturbed job's
/// `want` (whose workers agree with each other); `what` names the disturbance.
inline void ExpectSameWeights(const std::vector<std::string>& want,
                              const std::vector<std::string>& got, const std::string& what) {
  ASSERT_FALSE(want.empty());
  ASSERT_FALSE(want[0].empty());
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t w = 0; w < want.size(); ++w) {
    EXPECT_EQ(want[w], want[0]) << "the workers of the undisturbed job disagree";
    ASSERT_EQ(got[w].size(), want[w].size()) << what << ": worker " << w;
    EXPECT_TRUE(got[w] == want[w])
        << what << ": worker " << w << "'s final weights differ from the undisturbed job's";
  }
}

/// A kill's `before` for jobs with spares: waits until the scheduler reported
/// `copies` installed copies in all ("back to full strength", docs/fault-tolerance.md),
/// stores the time since the kill before in *ms, then until worker 0 wrote the next
/// marker `prefix`<n> (w0.r<n>: a round finished; of `rounds`).
inline std::function<std::string(const ReplicaJobRun&)> AfterFullStrength(
    int copies, int rounds, double* ms, const std::string& prefix = "w0.r") {
  return [=](const ReplicaJobRun& run) -> std::string {
    using namespace std::chrono_literals;
    const auto until = std::chrono::steady_clock::now() + 30s;
    int copied = 0;
    while (std::chrono::steady_clock::now() < until) {
      const std::string text = ReadFile(run.log);
      copied = 0;
      for (size_t at = 0; (at = text.find("and is now its replica", at)) != std::string::npos; ++at)
        ++copied;
      if (copied >= copies) break;
      std::this_thread::sleep_for(20ms);
    }
    if (copied < copies)
      return "the spare became the replica of " + std::to_string(copied) + " key range(s), not " +
             std::to_string(copies);
    *ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - run.last_kill)
            .count();
    auto round_done = [&](int r) {
      return std::filesystem::exists(run.dir + "/" + prefix + std::to_string(r));
    };
    int next = 1;
    while (round_done(next)) ++next;
    if (next >= rounds) return "the job finished before the spare was a replica";
    if (!WaitFile(run.dir + "/" + prefix + std::to_string(next), 60s))
      return "no round finished after the spare joined";
    return {};
  };
}

/// A kill's `before` for a server that exits by a test hook: waits (at most 60 s) until
/// the job's log says `line`; the kill then finds the server gone.
inline std::function<std::string(const ReplicaJobRun&)> AfterLogLine(const std::string& line) {
  return [line](const ReplicaJobRun& run) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (ReadFile(run.log).find(line) == std::string::npos) {
      if (std::chrono::steady_clock::now() > until) return "never logged \"" + line + "\"";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::string();
  };
}

/// Runs the job; if `victim` >= 0, kills server `victim` once OUT_DIR/`marker` exists.
inline ReplicaJobResult RunReplicaJob(const ReplicaJobSpec& s, int victim = -1,
                                      const std::string& marker = "") {
  std::vector<ReplicaKill> kills;
  if (victim >= 0) kills.push_back({victim, marker, nullptr});
  return RunReplicaJob(s, kills);
}

}  // namespace pskv::test
