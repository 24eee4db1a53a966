// Device kernels and copies: pskv's kernels against the CPU reducer and NDArray's host
// conversions, bit for bit, for every dtype and odd sizes; copies and their counters;
// the pinned pool; ready streams; logical devices (PSKV_CUDA_FAKE_DEVICES, the ctest
// entry gpu_fake_devices). The same binary runs on the simulated backend in every build
// (ctest entries sim.*, PSKV_SIM_DEVICES=3) and on a real GPU (label gpu); without a
// usable device every test reports SKIPPED with the reason. Inputs are finite: NaN payloads and
// signs are not part of the bit-exactness contract (x86 and CUDA propagate NaNs differently).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype_dispatch.h"
#include "device/runtime.h"
#include "kvstore/reduce.h"
#include "pskv/device.h"
#include "pskv/error.h"
#include "pskv/ndarray.h"
#include "support/device_results.h"

using namespace pskv;

namespace {

const DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                            DType::kInt32,   DType::kInt64,   DType::kInt8,    DType::kUInt8};

// Finite values over a wide exponent range (subnormals included for float32/64);
// random bits for the integer types (sums wrap the same way on both sides).
NDArray Random(int64_t n, DType t, std::mt19937_64& rng) {
  NDArray a({n}, t);
  DispatchDType(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = a.data<T>();
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_integral_v<T>) {
        p[i] = static_cast<T>(rng());
      } else {
        int lo = -20, hi = 12;  // float16
        if (t == DType::kFloat32) lo = -140, hi = 60;
        if (t == DType::kFloat64) lo = -1060, hi = 200;
        if (t == DType::kBFloat16) lo = -130, hi = 60;
        const int e = lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo));
        p[i] = FromDouble<T>(std::ldexp(u(rng), e));
      }
    }
  });
  return a;
}

::testing::AssertionResult SameBits(const NDArray& got, const NDArray& want) {
  test::RecordDeviceResult(got.raw(), got.nbytes());
  if (got.nbytes() != want.nbytes()) return ::testing::AssertionFailure() << "sizes differ";
  const auto* g = static_cast<const unsigned char*>(got.raw());
  const auto* w = static_cast<const unsigned char*>(want.raw());
  const size_t es = DTypeSize(want.dtype());
  for (size_t i = 0; i < want.nbytes(); ++i)
    if (g[i] != w[i])
      return ::testing::AssertionFailure()
             << DTypeName(want.dtype()) << " element " << i / es << " of " << want.size()
             << ": got " << got.At(static_cast<int64_t>(i / es)) << ", want "
             << want.At(static_cast<int64_t>(i / es));
  return ::testing::AssertionSuccess();
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::Status();
  }
  cuda::Stream compute() { return cuda::GetStream(0, cuda::StreamKind::kCompute); }
};

}  // namespace

TEST_F(Gpu, SumIsBitExactWithTheCpuReducer) {
  std::mt19937_64 rng(7);
  Reducer cpu(int64_t{1} << 40, 1);
  for (DType t : kAllDTypes) {
    for (int k : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 64}) {
      for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{1000}, int64_t{4099},
                        int64_t{(1 << 20) + 5}}) {
        // Keeps the test short (the order is per element); the simulator runs kernels as
        // plain loops on one thread, so it takes the big sizes for k <= 2 only.
        if (n > 5000 && k > (cuda::Simulated() ? 2 : 9)) continue;
        std::vector<NDArray> host, dev;
        for (int j = 0; j < k; ++j) {
          host.push_back(Random(n, t, rng));
          dev.push_back(host.back().To(Device::CUDA(0)));
        }
        NDArray want({n}, t);
        cpu.Sum(host, &want);
        NDArray got({n}, t, Device::CUDA(0));
        cuda::Sum(dev, &got, compute());
        cuda::StreamSync(compute());
        ASSERT_TRUE(SameBits(got.To(Device::CPU()), want))
            << DTypeName(t) << " k=" << k << " n=" << n;
      }
    }
  }
}

TEST_F(Gpu, SumIntoASourceFollowsTheCpuAliasingRule) {
  std::mt19937_64 rng(11);
  Reducer cpu(int64_t{1} << 40, 1);
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kFloat64}) {
    for (int alias : {0, 2, 5}) {
      std::vector<NDArray> host, dev;
      for (int j = 0; j < 6; ++j) {
        host.push_back(Random(1001, t, rng));
        dev.push_back(host.back().To(Device::CUDA(0)));
      }
      NDArray want_dst = host[alias];
      cpu.Sum(host, &want_dst);
      NDArray got_dst = dev[alias];
      cuda::Sum(dev, &got_dst, compute());
      cuda::StreamSync(compute());
      ASSERT_TRUE(SameBits(got_dst.To(Device::CPU()), want_dst))
          << DTypeName(t) << " alias " << alias;
    }
  }
}

TEST_F(Gpu, ConvertFillAndScaleMatchTheHost) {
  std::mt19937_64 rng(3);
  for (DType st : kAllDTypes) {
    NDArray src = Random(777, st, rng);
    if (!IsLowPrecision(st) && st != DType::kFloat32 && st != DType::kFloat64) {
      // keep integers in the range of every integer type (out-of-range casts differ)
      DispatchDType(st, [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < src.size(); ++i) src.data<T>()[i] = static_cast<T>(i % 100);
      });
    } else {
      DispatchDType(st, [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < src.size(); ++i)
          src.data<T>()[i] = FromDouble<T>(std::fmod(ToDouble(src.data<T>()[i]) * 1e3, 100.0));
      });
    }
    // Converting a negative value to an unsigned type is undefined in C++ (and differs
    // between the host and a GPU: x86 wraps, PTX saturates): uint8 gets |x|.
    NDArray src_abs = src.Clone();
    DispatchDType(st, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (int64_t i = 0; i < src_abs.size(); ++i)
        src_abs.data<T>()[i] = FromDouble<T>(std::fabs(ToDouble(src_abs.data<T>()[i])));
    });
    NDArray dsrc = src.To(Device::CUDA(0));
    NDArray dsrc_abs = src_abs.To(Device::CUDA(0));
    for (DType dt : kAllDTypes) {
      const bool unsigned_dst = dt == DType::kUInt8;
      NDArray want = (unsigned_dst ? src_abs : src).AsType(dt);
      NDArray got({777}, dt, Device::CUDA(0));
      cuda::Convert(unsigned_dst ? dsrc_abs : dsrc, &got, compute());
      cuda::StreamSync(compute());
      ASSERT_TRUE(SameBits(got.To(Device::CPU()), want))
          << DTypeName(st) << " -> " << DTypeName(dt);
    }
  }
  for (DType t : kAllDTypes) {
    for (double v : {0.0, 1.0, -3.25, 1e-3, 300.7}) {
      // Out-of-range float-to-integer conversions are undefined (float-cast-overflow).
      if ((t == DType::kUInt8 && (v < 0 || v >= 256)) || (t == DType::kInt8 && v >= 128)) continue;
      NDArray want({513}, t);
      want.Fill(v);
      NDArray got({513}, t, Device::CUDA(0));
      cuda::Fill(&got, v, compute());
      cuda::StreamSync(compute());
      ASSERT_TRUE(SameBits(got.To(Device::CPU()), want)) << DTypeName(t) << " fill " << v;
    }
  }
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    NDArray host = Random(999, t, rng);
    NDArray want = host.Clone();
    DispatchDType(t, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = typename AccType<T>::type;
      for (int64_t i = 0; i < want.size(); ++i)
        want.data<T>()[i] = Store<T>(Load(want.data<T>()[i]) * static_cast<A>(0.125));
    });
    NDArray got = host.To(Device::CUDA(0));
    cuda::Scale(&got, 0.125, compute());
    cuda::StreamSync(compute());
    ASSERT_TRUE(SameBits(got.To(Device::CPU()), want)) << DTypeName(t);
  }
  NDArray ints({4}, DType::kInt32, Device::CUDA(0));
  EXPECT_THROW(cuda::Scale(&ints, 2.0, compute()), InvalidArgument);
}

TEST_F(Gpu, CopiesAreCounted) {
  NDArray h = NDArray::FromVector({1, 2, 3, 4, 5, 6, 7, 8});
  cuda::ResetStats();
  NDArray d = h.To(Device::CUDA(0));
  cuda::Counters c = cuda::Stats();
  EXPECT_EQ(c.h2d_bytes, 32u);
  EXPECT_EQ(c.h2d_count, 1u);
  NDArray d2 = d.To(Device::CUDA(0));
  NDArray back = d2.To(Device::CPU());
  c = cuda::Stats();
  EXPECT_EQ(c.d2d_bytes, 32u);
  EXPECT_EQ(c.d2h_bytes, 32u);
  EXPECT_EQ(c.d2h_count, 1u);
  EXPECT_EQ(c.peer_bytes, 0u);
  EXPECT_EQ(back.ToDoubles(), h.ToDoubles());
  cuda::ResetStats();
  EXPECT_EQ(cuda::Stats().d2h_bytes, 0u);
}

TEST_F(Gpu, PinnedArraysAndPool) {
  NDArray p({1000}, DType::kFloat32, Device::Pinned());
  EXPECT_EQ(p.device(), Device::Pinned());
  for (double v : p.ToDoubles()) ASSERT_EQ(v, 0);  // zero-filled
  p.Fill(2.5);                                     // host code works on pinned memory
  NDArray d = p.To(Device::CUDA(0));
  EXPECT_EQ(d.To(Device::Pinned()).At(999), 2.5);
  const size_t before = cuda::PinnedPoolCachedBytes();
  { NDArray q({1 << 16}, DType::kFloat32, Device::Pinned()); }
  EXPECT_GE(cuda::PinnedPoolCachedBytes(), before + (size_t{1} << 18));
  NDArray again({1 << 16}, DType::kFloat32, Device::Pinned());  // reuses the cached buffer
  EXPECT_EQ(cuda::PinnedPoolCachedBytes(), before);
  for (int64_t i = 0; i < again.size(); i += 4097) ASSERT_EQ(again.At(i), 0);
}

TEST_F(Gpu, ToWaitsForTheReadyStream) {
  // The producer fills on another pskv stream; To() must order itself after it.
  NDArray a({1 << 22}, DType::kFloat32, Device::CUDA(0));
  cuda::Stream producer = cuda::GetStream(0, cuda::StreamKind::kH2D);
  for (int i = 0; i < 20; ++i) cuda::Fill(&a, i, producer);
  NDArray w = NDArray::Wrap(a.raw(), a.shape(), a.dtype(), nullptr, Device::CUDA(0), producer);
  NDArray h = w.To(Device::CPU());
  EXPECT_EQ(h.At(0), 19);
  EXPECT_EQ(h.At(h.size() - 1), 19);
}

TEST_F(Gpu, HostOperationsStillRefuseRealCudaArrays) {
  NDArray d({4}, DType::kFloat32, Device::CUDA(0));
  EXPECT_THROW(d.At(0), UsageError);
  EXPECT_THROW(d.Clone(), UsageError);
  EXPECT_THROW(NDArray({4}, DType::kFloat32, Device::CUDA(cuda::DeviceCount())), DeviceUnavailable);
  NDArray h({4});
  EXPECT_THROW(cuda::Sum({h}, &d, compute()), UsageError);  // a host source
  NDArray half({4}, DType::kFloat16, Device::CUDA(0));
  EXPECT_THROW(cuda::Sum({half}, &d, compute()), ShapeError);
}

// A fresh process: the first CUDA array initialises CUDA (and, without a GPU, raises
// DeviceUnavailable instead of crashing).
TEST(GpuLazyInit, TheFirstCudaArrayInitialisesCuda) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (cuda::Initialized()) std::_Exit(10);
        try {
          NDArray a({4}, DType::kFloat32, Device::CUDA(0));
        } catch (const DeviceUnavailable&) {
          std::_Exit(cuda::Built() && !cuda::Initialized() ? 11 : 0);
        }
        std::_Exit(cuda::Initialized() ? 0 : 12);
      },
      ::testing::ExitedWithCode(0), "");
}

// Run by the ctest entry gpu_fake_devices with PSKV_CUDA_FAKE_DEVICES=3.
TEST(GpuFakeDevices, LogicalDevicesMapOntoOneGpu) {
  const char* fake = std::getenv("PSKV_CUDA_FAKE_DEVICES");
  if (fake == nullptr || std::string(fake) != "3")
    GTEST_SKIP() << "run with PSKV_CUDA_FAKE_DEVICES=3 (the ctest entry gpu_fake_devices)";
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::Status();
  EXPECT_EQ(cuda::DeviceCount(), 3);
  EXPECT_NE(cuda::Status().find("PSKV_CUDA_FAKE_DEVICES=3"), std::string::npos) << cuda::Status();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cuda::PhysicalDevice(i), 0);
  NDArray h = NDArray::FromVector({1, 2, 3, 4});
  NDArray d0 = h.To(Device::CUDA(0));
  cuda::ResetStats();
  NDArray d2 = d0.To(Device::CUDA(2));
  EXPECT_EQ(d2.device(), Device::CUDA(2));
  cuda::Counters c = cuda::Stats();
  EXPECT_EQ(c.peer_bytes, 16u);
  EXPECT_EQ(c.peer_count, 1u);
  EXPECT_EQ(c.d2d_bytes, 0u);
  // Kernels run per logical device; mixing logical devices in one kernel is refused.
  NDArray d2b = h.To(Device::CUDA(2));
  auto s2 = cuda::GetStream(2, cuda::StreamKind::kCompute);
  EXPECT_NE(s2, cuda::GetStream(0, cuda::StreamKind::kCompute));
  cuda::Sum({d2, d2b}, &d2, s2);
  cuda::StreamSync(s2);
  EXPECT_EQ(d2.To(Device::CPU()).ToDoubles(), (std::vector<double>{2, 4, 6, 8}));
  EXPECT_THROW(cuda::Sum({d0, d2}, &d2, s2), UsageError);
  EXPECT_THROW(NDArray({4}, DType::kFloat32, Device::CUDA(3)), DeviceUnavailable);
}
