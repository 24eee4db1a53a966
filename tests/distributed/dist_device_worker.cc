// A worker program for the dist stores with values on devices (docs/gpu.md, "The dist
// stores on devices"), started by pskv-launch with PSKV_SIM_DEVICES=k (each worker
// drives k simulated devices) or on a real GPU. Exit status 0 = all checks passed.
//
//   dist_device_worker SCENARIO STEPS
//
// Each scenario runs two stores of one job side by side: the store under test with
// gradients and outputs on the worker's k devices, and a CPU reference (dist_sync or
// dist_async) fed the same gradients as host arrays. Every output must equal the
// reference's bit for bit, and the copy counters must show the d2l chapter's bytes per
// worker and step (M: the bytes of the keys; P2P on unless MXNET_ENABLE_GPU_P2P=0):
//   dist_*_device: M d2h and M h2d per push-pull, whatever k is (peer: 2(k-1)·M);
//   dist_* (plain) with device values: k·M d2h and k·M h2d.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "pskv/device.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/process.h"
#include "pskv/row_sparse.h"
#include "support/worker_checks.h"

using namespace pskv;

namespace {

using ::pskv::test::g_failures;
using ::pskv::test::g_tag;
using ::pskv::test::Throws;

struct KeySpec {
  int key;
  Shape shape;
  DType dtype;
};
// A small key (one server, one piece), a big one (sliced over the servers, several
// wire chunks: several pieces) and a float16 one (summed in float32, rounded once).
const std::vector<KeySpec> kKeys = {
    {0, {7, 5}, DType::kFloat32}, {1, {512, 300}, DType::kFloat32}, {2, {64, 40}, DType::kFloat16}};

uint64_t Bytes(const KeySpec& k) {
  uint64_t n = DTypeSize(k.dtype);
  for (int64_t d : k.shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Gradients: uniform in (-1, 1), or (exact) multiples of 1/4 in [-2, 2].
NDArray Random(const KeySpec& k, uint64_t seed, bool exact) {
  std::mt19937_64 rng(seed);
  NDArray a(k.shape, DType::kFloat32);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < a.size(); ++i)
    a.data<float>()[i] = exact ? static_cast<float>(static_cast<int>(rng() % 17) - 8) / 4 : u(rng);
  if (k.dtype == DType::kFloat32) return a;
  NDArray c(k.shape, k.dtype);
  c.CopyFrom(a);
  return c;
}

bool SameBits(const NDArray& got_any, const NDArray& want, const std::string& what) {
  const NDArray got = got_any.device().is_cuda() ? got_any.To(Device::CPU()) : got_any;
  if (got.nbytes() == want.nbytes() && std::memcmp(got.raw(), want.raw(), want.nbytes()) == 0)
    return true;
  for (int64_t i = 0; i < want.size(); ++i)
    if (got.At(i) != want.At(i)) {
      std::fprintf(stderr, "%s: %s: element %lld is %.9g, the CPU run has %.9g\n", g_tag.c_str(),
                   what.c_str(), static_cast<long long>(i), got.At(i), want.At(i));
      return false;
    }
  std::fprintf(stderr, "%s: %s: bits differ\n", g_tag.c_str(), what.c_str());
  return false;
}

bool PeerOn() {
  const char* p = std::getenv("MXNET_ENABLE_GPU_P2P");
  return p == nullptr || std::strcmp(p, "0") != 0;
}

// The d2l steps' bytes for one push (d2h) or pull (h2d) of M bytes from/to k devices.
struct Expect {
  uint64_t d2h, h2d, peer;
};
Expect PushBytes(bool device_store, uint64_t M, uint64_t k) {
  if (!device_store) return {k * M, 0, 0};
  // The sum on the home device: (k-1)·M in (peer, or through the host), then M d2h.
  return PeerOn() ? Expect{M, 0, (k - 1) * M} : Expect{M + (k - 1) * M, (k - 1) * M, 0};
}
Expect PullBytes(bool device_store, uint64_t M, uint64_t k) {
  if (!device_store) return {0, k * M, 0};
  // One h2d, then (k-1)·M out of the landing device.
  return PeerOn() ? Expect{0, M, (k - 1) * M} : Expect{(k - 1) * M, M + (k - 1) * M, 0};
}

bool CountersAre(const Expect& want, const std::string& what) {
  const cuda::Counters c = cuda::Stats();
  if (c.d2h_bytes == want.d2h && c.h2d_bytes == want.h2d && c.peer_bytes == want.peer) return true;
  std::fprintf(stderr,
               "%s: %s: copied d2h %llu, h2d %llu, peer %llu bytes; want d2h %llu, h2d %llu, "
               "peer %llu\n",
               g_tag.c_str(), what.c_str(), static_cast<unsigned long long>(c.d2h_bytes),
               static_cast<unsigned long long>(c.h2d_bytes),
               static_cast<unsigned long long>(c.peer_bytes),
               static_cast<unsigned long long>(want.d2h), static_cast<unsigned long long>(want.h2d),
               static_cast<unsigned long long>(want.peer));
  return false;
}

// One job, two stores: `type` with device values and the CPU reference `ref_type`.
// sync: push-pulls on even steps, push then pull on odd ones; async (`exact`
// gradients): pushes, a barrier, pulls.
void Run(const std::string& type, const std::string& ref_type, int steps, bool async,
         bool compression) {
  const int k = cuda::DeviceCount();
  auto kv = KVStore::Create(type);
  auto ref = KVStore::Create(ref_type);
  const bool device_store = type.find("device") != std::string::npos;
  const int r = kv->Rank();
  g_tag = "worker " + std::to_string(r) + " (" + type + ", " + std::to_string(k) + " devices)";
  if (k < 2) {
    CHECK_TRUE(false, "needs at least 2 devices: " + cuda::Status());
    return;
  }
  if (compression)
    for (KVStore* s : {kv.get(), ref.get()})
      s->SetGradientCompression(
          CompressionConfig::FromParams({{"type", "2bit"}, {"threshold", "0.5"}}));
  OptimizerConfig opt = OptimizerConfig::For("sgd");
  opt.learning_rate = async ? 0.5 : 0.05;
  if (!async) {
    opt.momentum = 0.9;
    opt.wd = 1e-4;
  }
  kv->SetOptimizer(opt);
  ref->SetOptimizer(opt);
  std::vector<KeySpec> keys = kKeys;
  if (compression) keys.pop_back();  // compression takes float32 keys only
  uint64_t M = 0;
  std::vector<int> ids, rep_ids;  // rep_ids: each key k times
  for (const KeySpec& s : keys) {
    const NDArray init = Random(s, 1000 + static_cast<uint64_t>(s.key), true);
    kv->Init(s.key, init.To(Device::CUDA(s.key % k)));  // an init value on a device, too
    ref->Init(s.key, init);
    M += Bytes(s);
    ids.push_back(s.key);
    for (int d = 0; d < k; ++d) rep_ids.push_back(s.key);
  }
  std::vector<NDArray> outs, ref_outs;  // per key, per device
  for (const KeySpec& s : keys)
    for (int d = 0; d < k; ++d) {
      outs.emplace_back(s.shape, s.dtype, Device::CUDA(d));
      ref_outs.emplace_back(s.shape, s.dtype);
    }
  auto compare = [&](const std::string& when) {
    for (size_t i = 0; i < outs.size(); ++i)
      CHECK_TRUE(SameBits(outs[i], ref_outs[i],
                          when + ", key " + std::to_string(rep_ids[i]) +
                              " on cuda:" + std::to_string(i % static_cast<size_t>(k))),
                 when);
  };
  // A pull before any push: the initial values (the keys are not placed yet).
  cuda::ResetStats();
  kv->Pull(rep_ids, outs);
  kv->WaitAll();
  CHECK_TRUE(CountersAre(PullBytes(device_store, M, static_cast<uint64_t>(k)), "first pull"),
             "first pull's copies");
  ref->Pull(rep_ids, ref_outs);
  ref->WaitAll();
  compare("first pull");
  for (int step = 0; step < steps; ++step) {
    std::vector<NDArray> grads, dev_grads;
    for (const KeySpec& s : keys)
      for (int d = 0; d < k; ++d) {
        const uint64_t seed =
            ((static_cast<uint64_t>(r) * 1000 + static_cast<uint64_t>(step)) * 16 +
             static_cast<uint64_t>(s.key)) *
                64 +
            static_cast<uint64_t>(d);
        grads.push_back(Random(s, seed, async));
        dev_grads.push_back(grads.back().To(Device::CUDA(d)));
      }
    const std::string when = "step " + std::to_string(step);
    const Expect push = PushBytes(device_store, M, static_cast<uint64_t>(k));
    const Expect pull = PullBytes(device_store, M, static_cast<uint64_t>(k));
    if (!async && step % 2 == 0) {
      cuda::ResetStats();
      kv->PushPull(rep_ids, dev_grads, rep_ids, outs);
      kv->WaitAll();
      CHECK_TRUE(CountersAre({push.d2h + pull.d2h, push.h2d + pull.h2d, push.peer + pull.peer},
                             when + " push-pull"),
                 when + " copies");
      ref->PushPull(rep_ids, grads, rep_ids, ref_outs);
      ref->WaitAll();
    } else {
      cuda::ResetStats();
      kv->Push(rep_ids, dev_grads);
      kv->WaitAll();
      CHECK_TRUE(CountersAre(push, when + " push"), when + " push copies");
      // The many-chunk key's sum went to the host in pieces (one d2h copy per chunk).
      if (device_store && !compression && PeerOn())
        CHECK_TRUE(cuda::Stats().d2h_count > keys.size(), when + ": d2h copies in pieces");
      ref->Push(rep_ids, grads);
      ref->WaitAll();
      if (async) kv->Barrier();  // every worker's pushes are applied
      cuda::ResetStats();
      kv->Pull(rep_ids, outs);
      kv->WaitAll();
      CHECK_TRUE(CountersAre(pull, when + " pull"), when + " pull copies");
      ref->Pull(rep_ids, ref_outs);
      ref->WaitAll();
      if (async) kv->Barrier();  // nobody pushes before everyone pulled
    }
    compare(when);
  }
  kv->Barrier();
}

// row_sparse keys do not take row ids or rows on devices: a typed error saying what to do.
void RowSparseRefused(const std::string& type) {
  auto kv = KVStore::Create(type);
  g_tag = "worker " + std::to_string(kv->Rank()) + " (" + type + ")";
  NDArray ids = NDArray::FromVector({0, 2});
  ids = ids.AsType(DType::kInt64);
  NDArray rows({2, 4});
  rows.Fill(1);
  kv->Init(9, RowSparseNDArray::FromRows({6, 4}, ids, rows));
  RowSparseNDArray out({6, 4});
  CHECK_TRUE(Throws<UsageError>([&] { kv->RowSparsePull(9, {out}, {ids.To(Device::CUDA(0))}); },
                                "move them to the host"),
             "row ids on a device");
  kv->Barrier();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: dist_device_worker SCENARIO [STEPS]\n");
    return 2;
  }
  const std::string scenario = argv[1];
  const int steps = argc > 2 ? std::atoi(argv[2]) : 4;
  try {
    pskv::ConfigureProcess();
    if (scenario == "sync_device")
      Run("dist_sync_device", "dist_sync", steps, false, false);
    else if (scenario == "sync")
      Run("dist_sync", "dist_sync", steps, false, false);
    else if (scenario == "async_device")
      Run("dist_async_device", "dist_async", steps, true, false);
    else if (scenario == "async")
      Run("dist_async", "dist_async", steps, true, false);
    else if (scenario == "compression_device")
      Run("dist_sync_device", "dist_sync", steps, false, true);
    else if (scenario == "row_sparse_device")
      RowSparseRefused("dist_sync_device");
    else {
      std::fprintf(stderr, "unknown scenario '%s'\n", scenario.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected error: %s\n", g_tag.c_str(), e.what());
    return 1;
  }
  if (g_failures) {
    std::fprintf(stderr, "%s: %d check(s) failed\n", g_tag.c_str(), g_failures);
    return 1;
  }
  std::printf("%s: all checks passed\n", g_tag.c_str());
  return 0;
}
