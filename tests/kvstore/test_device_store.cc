// The `local` and `device` stores with values on several devices (docs/gpu.md): the
// same results as the CPU bit for bit, MXNet's copy contract read off the copy
// counters, placement, and the stream rules. Runs on simulated devices in every build
// (ctest sim.*, sim_jitter.*, sim_nop2p.*) and on a real GPU (gpu.*).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype_dispatch.h"
#include "device/runtime.h"
#include "kvstore/device_values.h"
#include "pskv/device.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "support/device_results.h"

using namespace pskv;

namespace {

constexpr int kDevices = 3;

class DeviceStore : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() < kDevices)
      GTEST_SKIP() << "needs " << kDevices << " devices: " << cuda::Status();
  }
};

std::unique_ptr<KVStore> Make(const std::string& type) {
  Options o;  // explicit options: tests do not depend on the environment
  return KVStore::Create(type, o);
}

NDArray Random(Shape shape, DType t, std::mt19937_64& rng) {
  NDArray a(shape, t);
  std::uniform_real_distribution<double> u(-1, 1);
  DispatchDType(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < a.size(); ++i) {
      if constexpr (std::is_integral_v<T>) {
        a.data<T>()[i] = static_cast<T>(rng() % 1000);
      } else {
        a.data<T>()[i] = FromDouble<T>(u(rng));
      }
    }
  });
  return a;
}

std::vector<NDArray> OnDevices(const std::vector<NDArray>& host) {
  std::vector<NDArray> out;
  for (size_t i = 0; i < host.size(); ++i)
    out.push_back(host[i].To(Device::CUDA(static_cast<int>(i % kDevices))));
  return out;
}

std::vector<NDArray> Outputs(Shape shape, DType t, bool on_devices) {
  std::vector<NDArray> out;
  for (int i = 0; i < kDevices; ++i)
    out.push_back(on_devices ? NDArray(shape, t, Device::CUDA(i)) : NDArray(shape, t));
  return out;
}

::testing::AssertionResult SameBits(const NDArray& got_any, const NDArray& want) {
  const NDArray got = got_any.device().is_cuda() ? got_any.To(Device::CPU()) : got_any;
  test::RecordDeviceResult(got.raw(), got.nbytes());
  if (got.nbytes() != want.nbytes() || std::memcmp(got.raw(), want.raw(), want.nbytes()) != 0) {
    for (int64_t i = 0; i < want.size(); ++i)
      if (got.At(i) != want.At(i))
        return ::testing::AssertionFailure()
               << "element " << i << ": got " << got.At(i) << ", want " << want.At(i);
    return ::testing::AssertionFailure() << "bits differ";
  }
  return ::testing::AssertionSuccess();
}

// Runs `steps` push-pulls of k gradients per step on a store of `type`, the gradients on
// devices or on the host; returns the final pulled value of every output (as host arrays).
std::vector<NDArray> Train(const std::string& type, bool on_devices, const OptimizerConfig* opt,
                           DType t, int steps, int sources, uint64_t seed) {
  auto kv = Make(type);
  std::mt19937_64 rng(seed);
  const Shape shape = {37, 11};
  kv->Init(4, Random(shape, t, rng));
  if (opt) kv->SetOptimizer(*opt);
  std::vector<NDArray> outs = Outputs(shape, t, on_devices);
  for (int s = 0; s < steps; ++s) {
    std::vector<NDArray> grads;
    for (int j = 0; j < sources; ++j) grads.push_back(Random(shape, t, rng));
    kv->PushPull(4, on_devices ? OnDevices(grads) : grads, outs);
    kv->WaitAll();
  }
  std::vector<NDArray> host;
  for (auto& o : outs) host.push_back(o.device().is_cuda() ? o.To(Device::CPU()) : o.Clone());
  return host;
}

}  // namespace

TEST_F(DeviceStore, SumsOnDevicesAsLocalDoesOnTheCpu) {
  for (DType t :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt32}) {
    for (int sources : {1, 3, 6}) {
      const auto want = Train("local", false, nullptr, t, 3, sources, 11);
      for (const char* type : {"device", "local"}) {
        const auto got = Train(type, true, nullptr, t, 3, sources, 11);
        for (int i = 0; i < kDevices; ++i)
          ASSERT_TRUE(SameBits(got[i], want[0]))
              << type << " " << DTypeName(t) << " sources=" << sources << " output " << i;
      }
    }
  }
}

TEST_F(DeviceStore, OptimizersOnDevicesMatchTheCpuBitForBit) {
  std::vector<std::pair<std::string, OptimizerConfig>> configs;
  auto add = [&](const std::string& name, OptimizerConfig c) { configs.emplace_back(name, c); };
  OptimizerConfig c = OptimizerConfig::For("sgd");
  c.learning_rate = 0.1;
  add("sgd", c);
  c.momentum = 0.9;
  c.wd = 1e-3;
  c.clip_gradient = 0.75;
  c.rescale_grad = 0.5;
  add("sgd momentum wd clip rescale", c);
  c = OptimizerConfig::For("nag");
  c.momentum = 0.8;
  add("nag", c);
  c = OptimizerConfig::For("adam");
  c.wd = 1e-2;
  add("adam", c);
  c = OptimizerConfig::For("adamw");
  c.wd = 1e-2;
  add("adamw", c);
  c = OptimizerConfig::For("rmsprop");
  add("rmsprop", c);
  c.centered = true;
  c.momentum = 0.5;
  add("rmsprop centered", c);
  c = OptimizerConfig::For("adagrad");
  add("adagrad", c);
  for (auto& [name, cfg] : configs) {
    for (DType t : {DType::kFloat32, DType::kFloat16}) {
      for (bool mp : {false, true}) {
        if (mp && t == DType::kFloat32) continue;
        OptimizerConfig oc = cfg;
        oc.multi_precision = mp;
        const auto want = Train("local", false, &oc, t, 4, kDevices, 5);
        for (const char* type : {"device", "local"}) {
          const auto got = Train(type, true, &oc, t, 4, kDevices, 5);
          for (int i = 0; i < kDevices; ++i)
            ASSERT_TRUE(SameBits(got[i], want[0]))
                << name << " on " << type << ", " << DTypeName(t) << (mp ? " multi-precision" : "")
                << ", output " << i;
        }
      }
    }
  }
}

// MXNet's contract, read off the copy counters for one step of k sources of M bytes
// pushed and pulled into k outputs, one per device (after the key's first push):
//  * local:  k·M d2h (every source to pinned host memory), k·M h2d (to every output);
//  * device: nothing between host and device; (k-1)·M into the home device and (k-1)·M
//            out of it, peer to peer (or through the host with MXNET_ENABLE_GPU_P2P=0).
TEST_F(DeviceStore, CopyCountersFollowMXNetsContract) {
  const Shape shape = {256, 64};
  const uint64_t M = 256 * 64 * 4;
  const uint64_t k = kDevices;
  for (const char* type : {"local", "device"}) {
    auto kv = Make(type);
    kv->Init(0, NDArray(shape));
    kv->SetOptimizer(OptimizerConfig::For("sgd"));
    std::mt19937_64 rng(1);
    std::vector<NDArray> grads, outs = Outputs(shape, DType::kFloat32, true);
    for (int i = 0; i < kDevices; ++i) grads.push_back(Random(shape, DType::kFloat32, rng));
    grads = OnDevices(grads);
    kv->PushPull(0, grads, outs);  // the first step places the key
    kv->WaitAll();
    cuda::ResetStats();
    kv->PushPull(0, grads, outs);
    kv->WaitAll();
    const cuda::Counters c = cuda::Stats();
    if (std::string(type) == "local") {
      EXPECT_EQ(c.d2h_bytes, k * M) << type;
      EXPECT_EQ(c.h2d_bytes, k * M) << type;
      EXPECT_EQ(c.peer_bytes, 0u) << type;
    } else if (cuda::PeerCopies(0, 1)) {
      EXPECT_EQ(c.d2h_bytes, 0u) << type;
      EXPECT_EQ(c.h2d_bytes, 0u) << type;
      EXPECT_EQ(c.peer_bytes, 2 * (k - 1) * M) << type;
      EXPECT_GE(c.kernel_launches, 2u) << type;  // the sum and the update, on the home device
    } else {
      EXPECT_EQ(c.peer_bytes, 0u) << type;
      EXPECT_EQ(c.d2h_bytes, 2 * (k - 1) * M) << type;
      EXPECT_EQ(c.h2d_bytes, 2 * (k - 1) * M) << type;
    }
  }
}

TEST(DevicePlacement, LargestKeysFirstOnTheLeastLoadedSourceDevice) {
  Placement p;
  auto home = p.Place({{1, 10, {0, 1, 2}},
                       {2, 100, {0, 1, 2}},
                       {3, 60, {0, 1, 2}},
                       {4, 50, {0, 1, 2}},
                       {5, 70, {1}}});
  EXPECT_EQ(home[2], 0);  // 100 -> device 0
  EXPECT_EQ(home[5], 1);  // 70, only device 1 holds its sources
  EXPECT_EQ(home[3], 2);  // 60 -> the empty device 2
  EXPECT_EQ(home[4], 2);  // 50 -> device 2 (60) before 1 (70)
  EXPECT_EQ(home[1], 1);  // 10 -> the least loaded: 0 (100), 1 (70), 2 (110)
  EXPECT_EQ(p.load().at(0) + p.load().at(1) + p.load().at(2), 290u);
}

// The store reads an input only after the work its producer queued before the call.
TEST_F(DeviceStore, WaitsForTheProducersOfItsInputs) {
  const Shape shape = {1 << 18};
  for (const char* type : {"device", "local"}) {
    auto kv = Make(type);
    kv->Init(0, NDArray(shape));
    for (int round = 1; round <= 3; ++round) {
      std::vector<NDArray> grads, outs = Outputs(shape, DType::kFloat32, true);
      for (int d = 0; d < kDevices; ++d) {
        NDArray g(shape, DType::kFloat32, Device::CUDA(d));
        cuda::Stream producer = cuda::NewStream(d);
        for (int i = 1; i <= 8; ++i) cuda::Fill(&g, round * 10 + i, producer);
        grads.push_back(NDArray::Wrap(g.raw(), shape, DType::kFloat32, std::make_shared<NDArray>(g),
                                      g.device(), producer));
      }
      kv->PushPull(0, grads, outs);
      kv->WaitAll();
      for (auto& o : outs) {
        NDArray h = o.To(Device::CPU());
        ASSERT_EQ(h.At(0), kDevices * (round * 10 + 8)) << type;
        ASSERT_EQ(h.At(h.size() - 1), kDevices * (round * 10 + 8)) << type;
      }
    }
  }
}

// The store writes an output only after the work queued on its ready stream before the
// call (an earlier reader of the old value).
TEST_F(DeviceStore, WritesOutputsOnlyAfterTheirEarlierReaders) {
  const Shape shape = {1 << 18};
  for (const char* type : {"device", "local"}) {
    auto kv = Make(type);
    NDArray init(shape);
    init.Fill(5);
    kv->Init(0, init);
    NDArray old_value = init.To(Device::CUDA(1));
    NDArray snapshot(shape, DType::kFloat32, Device::CUDA(1));
    NDArray scratch(shape, DType::kFloat32, Device::CUDA(1));
    cuda::Stream reader = cuda::NewStream(1);
    for (int i = 0; i < 8; ++i) cuda::Fill(&scratch, i, reader);  // keeps the reader busy
    cuda::CopyAsync(snapshot.raw(), snapshot.device(), old_value.raw(), old_value.device(),
                    old_value.nbytes(), reader);
    NDArray out =
        NDArray::Wrap(old_value.raw(), shape, DType::kFloat32, nullptr, old_value.device(), reader);
    NDArray g(shape);
    g.Fill(1);
    kv->Push(0, {g.To(Device::CUDA(0)), g.To(Device::CUDA(2))});
    kv->Pull(0, {out});
    kv->WaitAll();
    cuda::StreamSync(reader);
    EXPECT_EQ(snapshot.To(Device::CPU()).At(shape[0] - 1), 5) << type << ": written too early";
    EXPECT_EQ(old_value.To(Device::CPU()).At(0), 2) << type;  // ASSIGN of the sum
  }
}

TEST_F(DeviceStore, ACustomUpdaterGetsHostArrays) {
  auto kv = Make("device");
  NDArray init = NDArray::FromVector({1, 2, 3, 4});
  kv->Init(0, init);
  kv->SetUpdater([](int, const NDArray& recv, NDArray* stored) {
    for (int64_t i = 0; i < stored->size(); ++i)  // host code: At() refuses device arrays
      stored->data<float>()[i] += 2 * static_cast<float>(recv.At(i));
  });
  NDArray g = NDArray::FromVector({1, 1, 1, 1});
  std::vector<NDArray> outs = Outputs({4}, DType::kFloat32, true);
  kv->PushPull(0, {g.To(Device::CUDA(0)), g.To(Device::CUDA(1))}, outs);
  kv->WaitAll();
  for (auto& o : outs)
    EXPECT_EQ(o.To(Device::CPU()).ToDoubles(), (std::vector<double>{5, 6, 7, 8}));
}

TEST_F(DeviceStore, RefusesWhatItCannotDoOnDevices) {
  auto kv = Make("device");
  kv->SetGradientCompression(CompressionConfig::FromParams({{"type", "2bit"}}));
  kv->Init(0, NDArray({8}));
  NDArray g({8}, DType::kFloat32, Device::CUDA(0));
  try {
    kv->Push(0, {g});
    FAIL() << "compression with device values was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("push CPU values"), std::string::npos) << e.what();
  }
}

// The seed's claim: k devices with batch b give the weights of one device with batch b.
// A linear least-squares model, SGD: one device computes the gradient of the whole batch,
// k devices each the gradient of b/k samples, summed by the store. float32 sums in a
// different order, so the weights agree to a stated tolerance (relative 1e-5 here after
// 20 steps), not bit for bit.
TEST_F(DeviceStore, KDevicesWithBatchBGiveTheWeightsOfOneDeviceWithBatchB) {
  const int dim = 16, b = 24;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> X(b * dim), y(b);
  for (auto& v : X) v = nd(rng);
  for (auto& v : y) v = nd(rng);
  auto grad_of = [&](const std::vector<float>& w, int lo, int hi) {
    NDArray g({dim});
    for (int i = lo; i < hi; ++i) {
      float pred = 0;
      for (int j = 0; j < dim; ++j) pred += X[i * dim + j] * w[j];
      const float err = pred - y[i];
      for (int j = 0; j < dim; ++j) g.data<float>()[j] += err * X[i * dim + j] / b;
    }
    return g;
  };
  auto run = [&](int k) {
    auto kv = Make("device");
    kv->Init(0, NDArray({dim}));
    OptimizerConfig c = OptimizerConfig::For("sgd");
    c.learning_rate = 0.1;
    c.momentum = 0.9;
    kv->SetOptimizer(c);
    std::vector<float> w(dim, 0);
    std::vector<NDArray> outs;
    for (int d = 0; d < k; ++d) outs.emplace_back(Shape{dim}, DType::kFloat32, Device::CUDA(d));
    for (int step = 0; step < 20; ++step) {
      std::vector<NDArray> grads;
      for (int d = 0; d < k; ++d)
        grads.push_back(grad_of(w, d * b / k, (d + 1) * b / k).To(Device::CUDA(d)));
      kv->PushPull(0, grads, outs);
      kv->WaitAll();
      NDArray h = outs[0].To(Device::CPU());
      for (int j = 0; j < dim; ++j) w[j] = h.data<float>()[j];
      for (int d = 1; d < k; ++d) EXPECT_TRUE(SameBits(outs[d], h));  // replicas agree exactly
    }
    return w;
  };
  const auto one = run(1);
  const auto three = run(3);
  for (int j = 0; j < dim; ++j)
    EXPECT_NEAR(three[j], one[j], 1e-5 * std::max(1.0f, std::abs(one[j]))) << "weight " << j;
}
