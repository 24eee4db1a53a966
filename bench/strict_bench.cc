// pskv-bench strictrounds: what PSKV_STRICT_ROUNDS=1 costs. Two dist_sync jobs run
// side by side in this process (scheduler, 1 server and 2 worker KVStores each, as
// threads over 127.0.0.1), one with strict rounds, one without (the ceiling); both
// do push + pull + WaitAll rounds of a small key (latency-bound, where a per-call
// check weighs most), in alternating blocks. ratio = plain time / strict time.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/syncround_bench.h"
#include "common/net.h"
#include "pskv/kvstore.h"

namespace pskv::bench {

namespace {

struct KvJob {
  std::vector<std::thread> infra;  // scheduler and server
  std::vector<std::unique_ptr<KVStore>> kv;

  explicit KvJob(bool strict) {
    Options o = LoopbackJob(Options::FromEnv(), 2);
    o.strict_rounds = strict;
    for (Role r : {Role::kScheduler, Role::kServer}) {
      Options x = o;
      x.role = r;
      infra.emplace_back([x] { RunServerRoleIfAsked(x); });
    }
    kv.resize(2);
    std::vector<std::thread> ws;
    for (int w = 0; w < 2; ++w)
      ws.emplace_back([&, w] {
        Options x = o;
        x.role = Role::kWorker;
        x.rank_hint = w;
        kv[static_cast<size_t>(w)] = KVStore::Create("dist_sync", x);
      });
    for (auto& t : ws) t.join();
    std::vector<std::thread> init;
    for (auto& s : kv)
      init.emplace_back([&s] {
        NDArray v({16});
        v.Fill(0);
        s->Init(0, v);
      });
    for (auto& t : init) t.join();
  }
  ~KvJob() {
    std::vector<std::thread> close;
    for (auto& s : kv) close.emplace_back([&s] { s.reset(); });
    for (auto& t : close) t.join();
    for (auto& t : infra) t.join();
  }
  // `rounds` push + pull rounds on both workers; seconds per round.
  double Block(int rounds) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ws;
    for (auto& s : kv)
      ws.emplace_back([&s, rounds] {
        NDArray g({16}), out({16});
        g.Fill(1);
        for (int i = 0; i < rounds; ++i) {
          s->Push(0, {g});
          s->Pull(0, {out});
          s->WaitAll();
        }
      });
    for (auto& t : ws) t.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / rounds;
  }
};

}  // namespace

int BenchStrictRounds(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const int blocks = static_cast<int>(ArgInt(argc, argv, "--blocks", 11));
  const int rounds = static_cast<int>(ArgInt(argc, argv, "--rounds", 300));
  KvJob plain(false), strict(true);
  std::vector<double> tp, ts;
  for (int b = 0; b < blocks; ++b) {
    tp.push_back(plain.Block(rounds));
    ts.push_back(strict.Block(rounds));
  }
  std::sort(tp.begin(), tp.end());
  std::sort(ts.begin(), ts.end());
  const double p = tp[tp.size() / 2], s = ts[ts.size() / 2];
  // Spread of the blocks (quartiles), to judge whether a difference is noise.
  const double p1 = tp[tp.size() / 4], p3 = tp[tp.size() * 3 / 4];
  const double s1 = ts[ts.size() / 4], s3 = ts[ts.size() * 3 / 4];
  if (json)
    std::printf(
        "{\"bench\":\"strictrounds\",\"plain_us\":%.2f,\"strict_us\":%.2f,\"ratio\":%.3f,"
        "\"plain_q1_us\":%.2f,\"plain_q3_us\":%.2f,\"strict_q1_us\":%.2f,\"strict_q3_us\":%.2f}\n",
        p * 1e6, s * 1e6, p / s, p1 * 1e6, p3 * 1e6, s1 * 1e6, s3 * 1e6);
  else
    std::printf(
        "strictrounds: 2 workers, 1 server (threads, 127.0.0.1), push+pull+WaitAll of a 16-float "
        "key\n%14s %14s %10s %22s %22s\n%14.2f %14.2f %10.3f %10.2f..%-10.2f %10.2f..%-10.2f\n",
        "plain us/round", "strict us/round", "ratio", "plain quartiles", "strict quartiles",
        p * 1e6, s * 1e6, p / s, p1 * 1e6, p3 * 1e6, s1 * 1e6, s3 * 1e6);
  return 0;
}

}  // namespace pskv::bench
