// pskv-bench syncround: the cost of summing a dist_sync round in worker-rank order
// (PSKV_SUM_ORDER=rank, reproducible) against arrival order. One scheduler, one
// DistServer and W workers as threads of this process over TCP on 127.0.0.1; every
// worker push-pulls one key per round (no optimizer: the server sums). The same
// sizes run on two jobs, one per summing order; the arrival-order job is the ceiling
// (ratio = arrival time / rank time, 1.0 = no cost).
#include "bench/syncround_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "kvstore/dist_protocol.h"
#include "pskv/error.h"
#include "tests/support/inprocess_job.h"

namespace pskv::bench {

namespace {

using namespace std::chrono_literals;

// The job of one summing order.
Options SumOrder(Options o, bool arrival) {
  o.sum_in_arrival_order = arrival;
  o.stall_warning = std::chrono::milliseconds(0);
  return o;
}

struct Job : InProcessDistJob {
  Job(Options o, int num_workers, bool arrival)
      : InProcessDistJob(SumOrder(std::move(o), arrival), num_workers) {}
  // Every worker push-pulls `key` once (issued in reverse rank order); returns when all
  // have their answer.
  void Round(uint64_t key, int64_t bytes, const std::vector<Frame>& in,
             std::vector<std::vector<char>>& out) {
    std::mutex mu;
    std::condition_variable cv;
    int left = static_cast<int>(workers.size());
    std::exception_ptr err;
    const int cmd = dist::MakeCmd(dist::Kind::kDense, DType::kFloat32);
    const std::vector<uint64_t> lens = {static_cast<uint64_t>(bytes)};
    for (int w = static_cast<int>(workers.size()) - 1; w >= 0; --w) {
      // Which KVWorker has which rank is decided at registration: use the node's rank.
      auto& kv = *workers[static_cast<size_t>(w)];
      kv.PushPull({key}, in[static_cast<size_t>(w)], lens, out[static_cast<size_t>(w)].data(), lens,
                  cmd, [&](std::exception_ptr e) {
                    std::lock_guard<std::mutex> lk(mu);
                    if (e && !err) err = e;
                    if (--left == 0) cv.notify_all();
                  });
    }
    std::unique_lock<std::mutex> lk(mu);
    if (!cv.wait_for(lk, 60s, [&] { return left == 0; }))
      throw TimeoutError("syncround: a round did not complete within 60 s");
    if (err) std::rethrow_exception(err);
  }
};

}  // namespace

int BenchSyncRound(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const int W = static_cast<int>(ArgInt(argc, argv, "--workers", 4));
  const int64_t lo = ArgInt(argc, argv, "--min-bytes", 64 << 10);
  const int64_t hi = ArgInt(argc, argv, "--max-bytes", 64 << 20);
  std::vector<int64_t> sizes;
  for (int64_t b = lo; b <= hi; b *= 4) sizes.push_back(b);
  std::map<int64_t, double> t_rank, t_arrival;
  // Both jobs run side by side and their rounds alternate, so load from other
  // processes on the machine affects both alike.
  Job arrival_job(Options::FromEnv(), W, true), rank_job(Options::FromEnv(), W, false);
  for (int64_t bytes : sizes) {
    const uint64_t key = KVWorker::ServerRange(0, 1).first + static_cast<uint64_t>(bytes);
    std::vector<Frame> in;
    std::vector<std::vector<char>> out(static_cast<size_t>(W), std::vector<char>(bytes));
    for (int w = 0; w < W; ++w) {
      auto a = std::make_shared<NDArray>(Shape{bytes / 4});
      a->Fill(w + 1);
      Frame f;
      f.data = static_cast<const char*>(a->raw());
      f.size = a->nbytes();
      f.owner = a;
      in.push_back(f);
    }
    for (Job* job : {&arrival_job, &rank_job}) {  // init the key from worker 0
      auto c = std::make_shared<Completion>();
      auto ts = job->workers[0]->Push({key}, in[0], {static_cast<uint64_t>(bytes)},
                                      dist::MakeCmd(dist::Kind::kInit, DType::kFloat32),
                                      Completion::Callback(c));
      job->workers[0]->Await(ts, c, 60s, 0ms, "init");
    }
    const int reps = std::clamp(static_cast<int>((512ll << 20) / (bytes * W)), 9, 201);
    std::vector<double> ta, tr;
    for (int i = 0; i < reps; ++i)
      for (Job* job : {&arrival_job, &rank_job}) {
        const auto t0 = std::chrono::steady_clock::now();
        job->Round(key, bytes, in, out);
        const double t =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (i) (job == &rank_job ? tr : ta).push_back(t);  // first round: warm-up
      }
    std::sort(ta.begin(), ta.end());
    std::sort(tr.begin(), tr.end());
    t_arrival[bytes] = ta[ta.size() / 2];
    t_rank[bytes] = tr[tr.size() / 2];
  }
  if (!json)
    std::printf(
        "syncround: %d workers, 1 server (threads, 127.0.0.1); every worker push-pulls one key\n"
        "per round; time per round, summing in rank order vs in arrival order (ceiling)\n"
        "%12s %14s %14s %10s\n",
        W, "bytes", "rank us", "arrival us", "ratio");
  for (int64_t b : sizes) {
    const double r = t_rank[b], a = t_arrival[b];
    if (json)
      std::printf(
          "{\"bench\":\"syncround\",\"workers\":%d,\"bytes\":%lld,\"rank_us\":%.1f,"
          "\"arrival_us\":%.1f,\"ratio\":%.3f}\n",
          W, static_cast<long long>(b), r * 1e6, a * 1e6, a / r);
    else
      std::printf("%12lld %14.1f %14.1f %10.3f\n", static_cast<long long>(b), r * 1e6, a * 1e6,
                  a / r);
  }
  return 0;
}

}  // namespace pskv::bench
