// pskv-bench fusion: many small keys pushed+pulled in one call, against one big key
// of the same total size, and ResNet-50's 161 parameter tensors (25.6 M float32,
// 102 MB) in one call — each through two dist stores of the same job, one with fusion
// (the defaults) and one without (fusion_key_bytes = 0), their calls interleaved so
// that load from other processes hits both alike. Real processes: W workers and one
// server started by pskv-launch, dist_sync, no optimizer (the server sums).
//
// Ceiling: the big key (one 4 MiB value), same job — the goal for 1,000 keys of 4 KiB
// is a ratio >= 0.5. For ResNet-50 the unfused store is the reference (ratio =
// unfused time / fused time; >= 1 means no regression).
//
//   pskv-bench fusion [--json] [--workers N] [--keys N] [--key-bytes N] [--reps N]
// The worker side (run by pskv-launch): pskv-bench fusion-worker [same options].
#include "bench/fusion_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/options.h"

namespace pskv::bench {

namespace {

// ResNet-50's trainable tensors, in elements (torchvision layout: conv weights, batch
// norm gamma and beta, the classifier's weight and bias).
std::vector<int64_t> ResNet50Sizes() {
  std::vector<int64_t> out;
  auto conv = [&](int64_t o, int64_t i, int64_t k) { out.push_back(o * i * k * k); };
  auto bn = [&](int64_t c) {
    out.push_back(c);
    out.push_back(c);
  };
  conv(64, 3, 7);
  bn(64);
  int64_t in = 64;
  const int64_t blocks[] = {3, 4, 6, 3}, widths[] = {64, 128, 256, 512};
  for (int l = 0; l < 4; ++l) {
    const int64_t w = widths[l], o = 4 * w;
    for (int64_t b = 0; b < blocks[l]; ++b) {
      conv(w, in, 1);
      bn(w);
      conv(w, w, 3);
      bn(w);
      conv(o, w, 1);
      bn(o);
      if (b == 0) {  // the projection of the first block
        conv(o, in, 1);
        bn(o);
      }
      in = o;
    }
  }
  out.push_back(1000 * 2048);
  out.push_back(1000);
  return out;
}

// One PushPull call of keys [first, first + sizes) on `kv`, initialised.
struct Call {
  KVStore* kv;
  std::vector<int> keys;
  std::vector<NDArray> vals, outs;
  Call(KVStore& store, int first, const std::vector<int64_t>& sizes) : kv(&store) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      keys.push_back(first + static_cast<int>(i));
      NDArray v({sizes[i]});
      v.Fill(1);
      vals.push_back(v);
      outs.emplace_back(Shape{sizes[i]});
    }
    kv->Init(keys, vals);
  }
  double Once() {
    const auto t0 = std::chrono::steady_clock::now();
    kv->PushPull(keys, vals, keys, outs);
    kv->WaitAll();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (auto& o : outs)
      if (o.At(o.size() - 1) != static_cast<float>(kv->NumWorkers()))
        throw Error("pskv-bench fusion: wrong sum");
    return t;
  }
};

struct Result {
  std::map<std::string, double> seconds, bytes;
};

Result RunJob(int workers, int64_t keys, int64_t key_bytes, int reps) {
  Result out;
  RunLaunchedJob("fusion", "-n " + std::to_string(workers) + " -s 1 --timeout 600",
                 "fusion-worker --keys " + std::to_string(keys) + " --key-bytes " +
                     std::to_string(key_bytes) + " --reps " + std::to_string(reps),
                 [&](const char* line) {
                   const char* at = std::strstr(line, "FUSION ");
                   char name[64];
                   double sec = 0, bytes = 0;
                   if (at && std::sscanf(at, "FUSION case=%63s bytes=%lf seconds=%lf", name, &bytes,
                                         &sec) == 3) {
                     out.seconds[name] = std::max(out.seconds[name], sec);  // the slowest worker
                     out.bytes[name] = bytes;
                   }
                 });
  return out;
}

}  // namespace

int BenchFusionWorker(int argc, char** argv) {
  const int64_t keys = ArgInt(argc, argv, "--keys", 1000);
  const int64_t key_bytes = ArgInt(argc, argv, "--key-bytes", 4096);
  const int reps = static_cast<int>(ArgInt(argc, argv, "--reps", 15));
  Options with = Options::FromEnv(), without = with;
  without.fusion_key_bytes = 0;
  auto fused = KVStore::Create("dist_sync", with);
  auto unfused = KVStore::Create("dist_sync", without);
  const std::vector<int64_t> small(static_cast<size_t>(keys), key_bytes / 4);
  const std::vector<int64_t> big = {keys * key_bytes / 4};
  const std::vector<int64_t> resnet = ResNet50Sizes();
  // --only NAME: that case alone (for profiling the worker under pskv-launch).
  const std::string only = ArgStr(argc, argv, "--only", "");
  std::vector<std::pair<std::string, Call>> calls;
  auto add = [&](const char* name, KVStore& kv, int first, const std::vector<int64_t>& sizes) {
    if (only.empty() || only == name) calls.emplace_back(name, Call(kv, first, sizes));
  };
  add("small_fused", *fused, 0, small);
  add("small_unfused", *unfused, 0, small);
  add("big", *fused, 100000, big);
  add("resnet50_fused", *fused, 200000, resnet);
  add("resnet50_unfused", *unfused, 200000, resnet);
  fused->Barrier();
  std::map<std::string, std::vector<double>> t;
  for (int r = 0; r <= reps; ++r)  // round 0: warm-up
    for (auto& [name, call] : calls) {
      const double s = call.Once();
      if (r) t[name].push_back(s);
    }
  for (auto& [name, call] : calls) {
    auto& v = t[name];
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    int64_t elems = 0;
    for (auto& a : call.vals) elems += a.size();
    std::printf("FUSION case=%s bytes=%lld seconds=%.6f\n", name.c_str(),
                static_cast<long long>(elems * 4), v[v.size() / 2]);
  }
  std::fflush(stdout);
  fused->Barrier();
  return 0;
}

int BenchFusion(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const int workers = static_cast<int>(ArgInt(argc, argv, "--workers", 1));
  const int64_t keys = ArgInt(argc, argv, "--keys", 1000);
  const int64_t key_bytes = ArgInt(argc, argv, "--key-bytes", 4096);
  const int reps = static_cast<int>(ArgInt(argc, argv, "--reps", 15));
  const Result r = RunJob(workers, keys, key_bytes, reps);
  auto gbps = [&](const std::string& c) {
    return 2 * r.bytes.at(c) / r.seconds.at(c) / 1e9;  // pushed + pulled
  };
  const double on = gbps("small_fused"), off = gbps("small_unfused"), big = gbps("big");
  const double rn = r.seconds.at("resnet50_fused"), rf = r.seconds.at("resnet50_unfused");
  if (json) {
    std::printf(
        "{\"bench\":\"fusion\",\"workers\":%d,\"keys\":%lld,\"key_bytes\":%lld,"
        "\"fused_gbps\":%.3f,\"unfused_gbps\":%.3f,\"ceiling_gbps\":%.3f,\"ratio\":%.3f,"
        "\"ratio_unfused\":%.3f,\"resnet50_fused_ms\":%.2f,\"resnet50_unfused_ms\":%.2f,"
        "\"resnet50_ratio\":%.3f}\n",
        workers, static_cast<long long>(keys), static_cast<long long>(key_bytes), on, off, big,
        on / big, off / big, rn * 1e3, rf * 1e3, rf / rn);
    return 0;
  }
  std::printf(
      "fusion: %d worker(s) + 1 server (processes), dist_sync, push+pull in one call; a fused "
      "and an\nunfused store of the same job, calls interleaved, median of %d\n"
      "%lld keys of %lld bytes: fused %.3f GB/s, unfused %.3f GB/s; one key of the same total "
      "(ceiling): %.3f GB/s\nratio to the ceiling: fused %.3f, unfused %.3f (goal >= 0.5)\n"
      "ResNet-50 (161 tensors, 102 MB): fused %.2f ms, unfused %.2f ms, unfused/fused %.3f "
      "(>= 1: no regression)\n",
      workers, reps, static_cast<long long>(keys), static_cast<long long>(key_bytes), on, off, big,
      on / big, off / big, rn * 1e3, rf * 1e3, rf / rn);
  return 0;
}

}  // namespace pskv::bench
