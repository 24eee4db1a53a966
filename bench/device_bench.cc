// pskv-bench device [--json] [--bytes N] [--ks 2,4,8] [--chunk N] [--reps N] [--quick]
//
// The GPU side of the device stores (docs/gpu.md, docs/performance.md "GPU"), each figure
// against a ceiling measured in the same run on the same device:
//  * sum: pskv's k-way sum kernel (cuda::Sum, k sources of N bytes of float32 into a
//    (k+1)-th array on device 0), counted as the bytes it moves, (k+1)·N, against a
//    device-to-device copy of N bytes counted as 2·N (the device's memory bandwidth).
//    Goal: ratio >= 0.8.
//  * staging: dist_sync_device's host staging of one key of N bytes, as
//    kvstore/distributed/worker/device_exchange.cc does it: d2h into a pinned buffer in pieces of
//    --chunk bytes (the wire chunk), each followed by a host callback (where the store
//    pushes the piece), then one h2d of N bytes from a pinned buffer; against one pinned
//    d2h and one pinned h2d of N bytes. Goal: ratio >= 0.8.
// On simulated devices (PSKV_SIM_DEVICES) it runs the same code and says "simulated":
// the figures measure the simulator's loops, not a GPU (a smoke run proves it works).
#include "bench/device_bench.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "device/runtime.h"
#include "pskv/device.h"
#include "pskv/ndarray.h"

namespace pskv::bench {
namespace {

struct Figure {
  std::string what;
  int k = 0;
  int64_t bytes = 0;
  double gbps = 0, ceiling_gbps = 0;
  double ratio() const { return ceiling_gbps > 0 ? gbps / ceiling_gbps : 0; }
};

std::vector<int> ParseKs(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ','))
    if (!part.empty()) out.push_back(std::stoi(part));
  return out;
}

}  // namespace

int BenchDevice(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const bool quick = HasFlag(argc, argv, "--quick");
  const int64_t bytes =
      ArgInt(argc, argv, "--bytes", quick ? (int64_t{1} << 16) : (int64_t{64} << 20));
  const int64_t chunk = ArgInt(argc, argv, "--chunk", quick ? 16384 : (int64_t{256} << 10));
  const int reps = static_cast<int>(ArgInt(argc, argv, "--reps", quick ? 3 : 20));
  const std::vector<int> ks = ParseKs(ArgStr(argc, argv, "--ks", quick ? "2,4" : "2,4,8"));
  if (bytes < 4 || bytes % 4 != 0 || chunk <= 0 || reps < 1 || ks.empty())
    throw UsageError(
        "pskv-bench device: --bytes must be a positive multiple of 4, --chunk and "
        "--reps positive, --ks a list such as 2,4,8");
  if (cuda::DeviceCount() == 0)
    throw DeviceUnavailable("pskv-bench device: no device (" + cuda::Status() +
                            "); on a machine without a GPU run it with PSKV_SIM_DEVICES=1");
  const bool sim = cuda::Simulated();
  const Device dev = Device::CUDA(0);
  const cuda::Stream compute = cuda::GetStream(0, cuda::StreamKind::kCompute);
  const cuda::Stream d2h = cuda::GetStream(0, cuda::StreamKind::kD2H);
  const cuda::Stream h2d = cuda::GetStream(0, cuda::StreamKind::kH2D);
  const int64_t n = bytes / 4;
  const double b = static_cast<double>(bytes);
  std::vector<Figure> figures;

  // ---- k-way sum vs a device-to-device copy
  NDArray src({n}, DType::kFloat32, dev), dst({n}, DType::kFloat32, dev);
  cuda::Fill(&src, 1.0, compute);
  const double copy_s = Median(reps, [&] {
    cuda::CopyAsync(dst.raw(), dev, src.raw(), dev, static_cast<size_t>(bytes), compute);
    cuda::StreamSync(compute);
  });
  for (int k : ks) {
    std::vector<NDArray> srcs;
    for (int j = 0; j < k; ++j) {
      srcs.emplace_back(Shape{n}, DType::kFloat32, dev);
      cuda::Fill(&srcs.back(), 0.5 * j, compute);
    }
    const double sum_s = Median(reps, [&] {
      cuda::Sum(srcs, &dst, compute);
      cuda::StreamSync(compute);
    });
    figures.push_back({"sum", k, bytes, (k + 1) * b / sum_s / 1e9, 2 * b / copy_s / 1e9});
  }

  // ---- dist_sync_device's staging vs one pinned memcpy each way
  NDArray send({n}, DType::kFloat32, Device::Pinned()),
      recv({n}, DType::kFloat32, Device::Pinned());
  const double pinned_s = Median(reps, [&] {
    cuda::CopyAsync(send.raw(), send.device(), src.raw(), dev, static_cast<size_t>(bytes), d2h);
    cuda::StreamSync(d2h);
    cuda::CopyAsync(dst.raw(), dev, recv.raw(), recv.device(), static_cast<size_t>(bytes), h2d);
    cuda::StreamSync(h2d);
  });
  std::atomic<int64_t> landed{0};
  const double staged_s = Median(reps, [&] {
    for (int64_t off = 0; off < bytes; off += chunk) {
      const size_t len = static_cast<size_t>(std::min(chunk, bytes - off));
      cuda::CopyAsync(static_cast<char*>(send.raw()) + off, send.device(),
                      static_cast<const char*>(src.raw()) + off, dev, len, d2h);
      // Where the store pushes the piece (a backend thread; no runtime calls there).
      cuda::OnStreamDone(d2h, [&landed, len] { landed += static_cast<int64_t>(len); });
    }
    cuda::StreamSync(d2h);
    cuda::CopyAsync(dst.raw(), dev, recv.raw(), recv.device(), static_cast<size_t>(bytes), h2d);
    cuda::StreamSync(h2d);
  });
  if (landed.load() != bytes * (reps + 1))
    throw Error("pskv-bench device: the staging callbacks saw " + std::to_string(landed.load()) +
                " bytes, expected " + std::to_string(bytes * (reps + 1)));
  figures.push_back({"staging", 0, bytes, 2 * b / staged_s / 1e9, 2 * b / pinned_s / 1e9});

  const std::string name = cuda::DeviceName(0);
  if (json) {
    std::printf(
        "{\"bench\": \"device\", \"simulated\": %s, \"device\": \"%s\", \"bytes\": %lld, "
        "\"chunk\": %lld, \"reps\": %d, \"goal_ratio\": 0.8, \"figures\": [",
        sim ? "true" : "false", name.c_str(), static_cast<long long>(bytes),
        static_cast<long long>(chunk), reps);
    for (size_t i = 0; i < figures.size(); ++i) {
      const Figure& f = figures[i];
      std::printf(
          "%s\n  {\"what\": \"%s\", \"k\": %d, \"gbps\": %.3f, \"ceiling\": \"%s\", "
          "\"ceiling_gbps\": %.3f, \"ratio\": %.3f}",
          i ? "," : "", f.what.c_str(), f.k, f.gbps, f.what == "sum" ? "d2d copy" : "pinned memcpy",
          f.ceiling_gbps, f.ratio());
    }
    std::printf("\n]}\n");
    return 0;
  }
  std::printf("device: %s%s, %lld bytes per array, median of %d\n", name.c_str(),
              sim ? " (SIMULATED: the figures measure the simulator, not a GPU)" : "",
              static_cast<long long>(bytes), reps);
  for (const Figure& f : figures) {
    if (f.what == "sum")
      std::printf(
          "  sum of k=%-2d  %8.2f GB/s   d2d copy %8.2f GB/s   ratio %.2f (goal >= 0.8)%s\n", f.k,
          f.gbps, f.ceiling_gbps, f.ratio(), sim ? " simulated" : "");
    else
      std::printf(
          "  staging (%lld-byte pieces) %8.2f GB/s   pinned memcpy %8.2f GB/s   ratio %.2f "
          "(goal >= 0.8)%s\n",
          static_cast<long long>(chunk), f.gbps, f.ceiling_gbps, f.ratio(),
          sim ? " simulated" : "");
  }
  return 0;
}

}  // namespace pskv::bench
