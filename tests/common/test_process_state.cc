// The library changes no process-wide state (pskv/process.h): creating and destroying
// dist stores and running nodes leaves the log name and levels, the timeline and
// metrics recorder and the allocator as they were; only ConfigureProcess and
// TuneAllocatorForLargeMessages, called by programs, change them. Lines written by a
// node's threads carry the node's name (LogScope). Its own process: the state checked
// is process-wide.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "common/logging.h"
#include "common/net.h"
#include "common/observe.h"
#include "common/process.h"
#include "kvstore/distributed/server/role_main.h"
#include "pskv/kvstore.h"
#include "pskv/process.h"
#include "pskv/tuning.h"

using namespace pskv;

namespace {

struct Snapshot {
  std::string name;
  bool info_enabled, debug_enabled;
  bool obs_enabled;
  int metrics_port;
  bool allocator_tuned;
  bool operator==(const Snapshot&) const = default;
};

Snapshot Take() {
  return {LogName(),
          LogEnabled(__FILE__, LogLevel::kInfo),
          LogEnabled(__FILE__, LogLevel::kDebug),
          obs::Enabled(),
          obs::MetricsPort(),
          AllocatorTuned()};
}

std::string Describe(const Snapshot& s) {
  return "name=" + s.name + " info=" + std::to_string(s.info_enabled) +
         " debug=" + std::to_string(s.debug_enabled) + " obs=" + std::to_string(s.obs_enabled) +
         " port=" + std::to_string(s.metrics_port) + " tuned=" + std::to_string(s.allocator_tuned);
}

}  // namespace

// A job of this process (scheduler, server, 2 workers as threads), each worker with two
// dist stores whose options ask for log levels, a timeline, a metrics file and a
// metrics port: none of it happens, during the job or after.
TEST(ProcessState, StoresAndNodesLeaveItUnchanged) {
  const Snapshot before = Take();
  const auto dir =
      std::filesystem::temp_directory_path() / ("pskv_process_state_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Options o = Options::FromEnv();
  o.root_uri = "127.0.0.1";
  o.root_port = FreePort();
  o.num_servers = 1;
  o.num_workers = 2;
  o.role_set = true;
  o.log_levels = "error";
  o.timeline_path = (dir / "trace.json").string();
  o.metrics_file = (dir / "metrics.prom").string();
  o.metrics_port = 20000 + static_cast<int>(::getpid() % 20000);
  std::vector<std::thread> infra;
  for (int i = 0; i < 2; ++i) {
    Options x = o;
    x.role = i == 0 ? Role::kScheduler : Role::kServer;
    infra.emplace_back([x] { EXPECT_EQ(RunServerOrScheduler(x), 0); });
  }
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w)
    workers.emplace_back([&, w] {
      Options x = o;
      x.role = Role::kWorker;
      x.rank_hint = w;
      try {
        auto a = KVStore::Create("dist_sync", x);
        auto b = KVStore::Create("dist_sync", x);
        NDArray v({4}), out({4});
        v.Fill(1);
        a->Init(0, v);
        b->Init(0, v);
        const std::vector<int> keys = {0};
        a->PushPull(keys, {v}, keys, {out});
        a->WaitAll();
        EXPECT_EQ(out.data<float>()[0], 2.0f);
        a->Barrier();
        EXPECT_EQ(Take(), before) << Describe(Take());  // while the stores live
        a.reset();
        b->Barrier();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "worker " << w << ": " << e.what();
      }
    });
  for (auto& t : workers) t.join();
  for (auto& t : infra) t.join();
  EXPECT_EQ(Take(), before) << Describe(Take());
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "a timeline or metrics file was written";
  std::filesystem::remove_all(dir);
}

TEST(ProcessState, LinesOfAScopeCarryItsName) {
  const std::string process = LogName();
  EXPECT_EQ(LineName(), process);
  std::thread([&] {
    LogScope outer([] { return std::string("worker[1]"); });
    EXPECT_EQ(LineName(), "worker[1]");
    {
      LogScope inner([] { return std::string("server[0]"); });
      EXPECT_EQ(LineName(), "server[0]");
    }
    EXPECT_EQ(LineName(), "worker[1]");
  }).join();
  EXPECT_EQ(LineName(), process);  // another thread's scope is not this one's
}

// What a program asks for does happen (in a child process: it changes this one).
TEST(ProcessStateDeathTest, ConfigureProcessAndTuningAreThePrograms) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        bool ok = LogName() == "pskv" && !AllocatorTuned();
        Options o;
        o.role_set = true;
        o.role = Role::kWorker;
        o.log_levels = "warn";
        ConfigureProcess(o);
        ok = ok && LogName() == "worker" && !LogEnabled(__FILE__, LogLevel::kInfo);
        AdoptNodeLogName("worker[3]");  // the process's first node joined
        AdoptNodeLogName("worker[4]");  // a second node does not rename the process
        ok = ok && LogName() == "worker[3]";
        ConfigureProcess(o);
        ok = ok && LogName() == "worker[3]" && !obs::Enabled() && !AllocatorTuned();
        TuneAllocatorForLargeMessages();
        ok = ok && AllocatorTuned();
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(ProcessStateDeathTest, WithoutARoleTheNameStaysAndNoNodeRenamesIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ConfigureProcess(Options{});  // a program holding a whole job (bench, tests)
        AdoptNodeLogName("scheduler");
        std::exit(LogName() == "pskv" ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}
