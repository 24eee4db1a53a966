// pskv-bench fusion: many small keys pushed+pulled in one call, against one big key
// of the same total size in the same job, with fusion on (the defaults) and off
// (PSKV_FUSION_KEY_BYTES=0); and ResNet-50's 161 parameter tensors (25.6 M float32,
// 102 MB) in one call, fused against unfused. Real processes: W workers and one
// server started by pskv-launch, dist_sync, no optimizer (the server sums).
//
// Ceiling: the big key (one 4 MiB value) in the same job — the goal for 1,000 keys
// of 4 KiB is a ratio >= 0.5. For ResNet-50 the unfused job is the reference (ratio
// = unfused time / fused time; >= 1 means no regression).
//
//   pskv-bench fusion [--json] [--workers N] [--keys N] [--key-bytes N]
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

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw IOError("pskv-bench: cannot find its own executable");
  return std::string(buf, static_cast<size_t>(n));
}

// Seconds per call (median of `reps`) of one PushPull of keys [first, first+sizes).
double TimeCall(KVStore& kv, int first, const std::vector<int64_t>& sizes, int reps) {
  std::vector<int> keys;
  std::vector<NDArray> vals, outs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    keys.push_back(first + static_cast<int>(i));
    NDArray v({sizes[i]});
    v.Fill(1);
    vals.push_back(v);
    outs.emplace_back(Shape{sizes[i]});
  }
  kv.Init(keys, vals);
  kv.Barrier();
  const double t = Median(reps, [&] {
    kv.PushPull(keys, vals, keys, outs);
    kv.WaitAll();
  });
  for (auto& o : outs)
    if (o.At(o.size() - 1) != static_cast<float>(kv.NumWorkers()))
      throw Error("pskv-bench fusion: wrong sum");
  kv.Barrier();
  return t;
}

struct Result {
  std::map<std::string, double> seconds, bytes;
};

Result RunJob(int workers, bool fusion, int64_t keys, int64_t key_bytes) {
  const std::string exe = SelfExe();
  const std::string launch = exe.substr(0, exe.rfind('/') + 1) + "pskv-launch";
  std::ostringstream cmd;
  cmd << launch << " -n " << workers << " -s 1 --timeout 600"
      << (fusion ? "" : " --env PSKV_FUSION_KEY_BYTES=0") << " -- " << exe << " fusion-worker"
      << " --keys " << keys << " --key-bytes " << key_bytes << " 2>&1";
  FILE* p = ::popen(cmd.str().c_str(), "r");
  if (!p) throw IOError("pskv-bench: cannot run " + launch);
  Result out;
  std::string log;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    log += line;
    const char* at = std::strstr(line, "FUSION ");
    char name[64];
    double sec = 0, bytes = 0;
    if (at && std::sscanf(at, "FUSION case=%63s bytes=%lf seconds=%lf", name, &bytes, &sec) == 3) {
      out.seconds[name] = std::max(out.seconds[name], sec);  // the slowest worker
      out.bytes[name] = bytes;
    }
  }
  if (::pclose(p) != 0) throw Error("pskv-bench fusion: the job failed; its output:\n" + log);
  return out;
}

}  // namespace

int BenchFusionWorker(int argc, char** argv) {
  const int64_t keys = ArgInt(argc, argv, "--keys", 1000);
  const int64_t key_bytes = ArgInt(argc, argv, "--key-bytes", 4096);
  auto kv = KVStore::Create("dist_sync");
  auto report = [&](const char* name, const std::vector<int64_t>& sizes, double sec) {
    int64_t elems = 0;
    for (auto s : sizes) elems += s;
    std::printf("FUSION case=%s bytes=%lld seconds=%.6f\n", name, static_cast<long long>(elems * 4),
                sec);
    std::fflush(stdout);
  };
  const std::vector<int64_t> small(static_cast<size_t>(keys), key_bytes / 4);
  const std::vector<int64_t> big = {keys * key_bytes / 4};
  const std::vector<int64_t> resnet = ResNet50Sizes();
  // Alternating small and big, twice each, so drift on a busy machine hits both.
  double t_small = 1e9, t_big = 1e9;
  for (int rep = 0; rep < 2; ++rep) {
    t_small = std::min(t_small, TimeCall(*kv, 100000 * (2 * rep + 1), small, 15));
    t_big = std::min(t_big, TimeCall(*kv, 100000 * (2 * rep + 2), big, 15));
  }
  report("small", small, t_small);
  report("big", big, t_big);
  report("resnet50", resnet, TimeCall(*kv, 500000, resnet, 7));
  return 0;
}

int BenchFusion(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const int workers = static_cast<int>(ArgInt(argc, argv, "--workers", 1));
  const int64_t keys = ArgInt(argc, argv, "--keys", 1000);
  const int64_t key_bytes = ArgInt(argc, argv, "--key-bytes", 4096);
  const Result on = RunJob(workers, true, keys, key_bytes);
  const Result off = RunJob(workers, false, keys, key_bytes);
  auto gbps = [](const Result& r, const std::string& c) {
    return 2 * r.bytes.at(c) / r.seconds.at(c) / 1e9;  // pushed + pulled
  };
  if (!json)
    std::printf(
        "fusion: %d worker(s) + 1 server (processes), dist_sync push+pull in one call;\n"
        "%lld keys of %lld bytes vs one key of the same total (ceiling, same job), and "
        "ResNet-50's 161 tensors;\nfusion on (defaults) vs off (PSKV_FUSION_KEY_BYTES=0)\n"
        "%-8s %12s %12s %12s %12s %8s\n",
        workers, static_cast<long long>(keys), static_cast<long long>(key_bytes), "fusion",
        "small GB/s", "big GB/s", "small/big", "resnet ms", "");
  for (auto* r : {&on, &off}) {
    const char* name = r == &on ? "on" : "off";
    const double s = gbps(*r, "small"), b = gbps(*r, "big");
    if (json)
      std::printf(
          "{\"bench\":\"fusion\",\"fusion\":\"%s\",\"workers\":%d,\"keys\":%lld,\"key_bytes\":%lld,"
          "\"small_gbps\":%.3f,\"ceiling_gbps\":%.3f,\"ratio\":%.3f,\"resnet50_ms\":%.2f}\n",
          name, workers, static_cast<long long>(keys), static_cast<long long>(key_bytes), s, b,
          s / b, r->seconds.at("resnet50") * 1e3);
    else
      std::printf("%-8s %12.3f %12.3f %12.3f %12.2f\n", name, s, b, s / b,
                  r->seconds.at("resnet50") * 1e3);
  }
  const double resnet_ratio = off.seconds.at("resnet50") / on.seconds.at("resnet50");
  if (json)
    std::printf(
        "{\"bench\":\"fusion_resnet50\",\"workers\":%d,\"ratio_unfused_over_fused\":%.3f}\n",
        workers, resnet_ratio);
  else
    std::printf("ResNet-50: unfused time / fused time = %.3f (>= 1: no regression)\n",
                resnet_ratio);
  return 0;
}

}  // namespace pskv::bench
