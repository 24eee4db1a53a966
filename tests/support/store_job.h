// A dist job whose scheduler, servers and worker stores are threads of this process,
// over TCP on 127.0.0.1, each role run as in a real job (RunServerOrScheduler for the
// scheduler and servers, KVStore::Create for workers): for tests that follow a recipe
// of docs/design.md end to end or compare whole jobs (ASan and TSan see every role).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "common/net.h"
#include "kvstore/distributed/server/role_main.h"
#include "pskv/options.h"

namespace pskv {

/// The environment's options for a job of `servers` servers and `workers` workers on
/// a free port of 127.0.0.1; callers adjust the rest (bigarray_bound, chunking, ...).
inline Options StoreJobOptions(int servers, int workers) {
  Options o = Options::FromEnv();
  o.root_uri = "127.0.0.1";
  o.root_port = FreePort();
  o.num_servers = servers;
  o.num_workers = workers;
  o.role_set = true;
  return o;
}

/// Runs the job `o` describes: `worker(w, x)` runs on worker w's thread with that
/// worker's options `x` (role and rank hint set) and makes its own store. A worker's
/// exception is a test failure naming the worker; RunStoreJob returns once every role
/// ended (servers end when the workers' stores are destroyed).
inline void RunStoreJob(const Options& o, const std::function<void(int, const Options&)>& worker) {
  std::vector<std::thread> infra;
  for (int i = 0; i <= o.num_servers; ++i) {
    Options x = o;
    x.role = i == 0 ? Role::kScheduler : Role::kServer;
    infra.emplace_back([x] { EXPECT_EQ(RunServerOrScheduler(x), 0); });
  }
  std::vector<std::thread> workers;
  for (int w = 0; w < o.num_workers; ++w)
    workers.emplace_back([&o, &worker, w] {
      Options x = o;
      x.role = Role::kWorker;
      x.rank_hint = w;
      try {
        worker(w, x);
      } catch (const std::exception& e) {
        ADD_FAILURE() << o.num_servers << " servers, worker " << w << ": " << e.what();
      }
    });
  for (auto& t : workers) t.join();
  for (auto& t : infra) t.join();
}

}  // namespace pskv
