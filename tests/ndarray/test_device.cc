// The device model on machines without a GPU: device names, CUDA arrays refused by
// every host operation (never dereferenced), pinned arrays usable by CPU code, the
// "no usable GPU" / "built without CUDA" errors, and lazy initialisation (a CPU-only
// process, and its forked children, never initialise CUDA). Runs in every build.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "device/runtime.h"
#include "kvstore/reduce.h"
#include "pskv/device.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/ndarray.h"

using namespace pskv;

namespace {

// A device pointer nobody may dereference: the tests prove pskv never does.
void* FakeDevicePointer() {
  return reinterpret_cast<void*>(uintptr_t{0xdead0000});
}

template <typename F>
void ExpectUsageError(F&& f, const std::string& op) {
  try {
    f();
    ADD_FAILURE() << op << " on a cuda:0 array did not throw";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << op << ": " << what;
    EXPECT_NE(what.find("To"), std::string::npos) << op << " does not say what to do: " << what;
  }
}

}  // namespace

TEST(Device, NamesAndParsing) {
  EXPECT_EQ(Device::CPU().str(), "cpu");
  EXPECT_EQ(Device::CUDA(1).str(), "cuda:1");
  EXPECT_EQ(Device::Pinned().str(), "cpu_pinned");
  EXPECT_TRUE(Device::CPU().host_accessible());
  EXPECT_TRUE(Device::Pinned().host_accessible());
  EXPECT_FALSE(Device::CUDA(0).host_accessible());
  EXPECT_TRUE(Device::CUDA(0).is_cuda());
  EXPECT_EQ(ParseDevice("cpu"), Device::CPU());
  EXPECT_EQ(ParseDevice("cuda"), Device::CUDA(0));
  EXPECT_EQ(ParseDevice("cuda:3"), Device::CUDA(3));
  EXPECT_EQ(ParseDevice("gpu:2"), Device::CUDA(2));
  EXPECT_EQ(ParseDevice("cpu_pinned"), Device::Pinned());
  EXPECT_NE(Device::CUDA(0), Device::CUDA(1));
  for (const char* bad : {"", "tpu", "cuda:", "cuda:x", "cuda:-1", "cuda:12345"})
    EXPECT_THROW(ParseDevice(bad), InvalidArgument) << bad;
}

TEST(Device, FakeDevicesParse) {
  EXPECT_EQ(cuda::ParseFakeDevices(nullptr), 0);
  EXPECT_EQ(cuda::ParseFakeDevices(""), 0);
  EXPECT_EQ(cuda::ParseFakeDevices("4"), 4);
  EXPECT_EQ(cuda::ParseFakeDevices("64"), 64);
  for (const char* bad : {"0", "65", "x", "2x", "-1"}) {
    try {
      cuda::ParseFakeDevices(bad);
      ADD_FAILURE() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("PSKV_CUDA_FAKE_DEVICES"), std::string::npos);
    }
  }
}

TEST(Device, ArraysKnowTheirDevice) {
  NDArray a({2, 3});
  EXPECT_EQ(a.device(), Device::CPU());
  EXPECT_EQ(a.ready_stream(), nullptr);
  float host[6] = {};
  NDArray w = NDArray::Wrap(host, {6}, DType::kFloat32);
  EXPECT_EQ(w.device(), Device::CPU());
  int token = 0;
  NDArray c =
      NDArray::Wrap(FakeDevicePointer(), {2, 3}, DType::kFloat16, nullptr, Device::CUDA(1), &token);
  EXPECT_EQ(c.device(), Device::CUDA(1));
  EXPECT_EQ(c.ready_stream(), &token);
  EXPECT_EQ(c.raw(), FakeDevicePointer());
  EXPECT_EQ(c.Slice1D(2, 3).device(), Device::CUDA(1));
  EXPECT_EQ(c.Reshape({6}).device(), Device::CUDA(1));
  EXPECT_EQ(c.Slice1D(2, 3).raw(), static_cast<char*>(FakeDevicePointer()) + 4);
  EXPECT_THROW(NDArray::Wrap(host, {6}, DType::kFloat32, nullptr, Device::CUDA(-1)),
               InvalidArgument);
}

TEST(Device, HostOperationsRefuseCudaArrays) {
  const bool was_initialized = cuda::Initialized();
  NDArray c = NDArray::Wrap(FakeDevicePointer(), {4}, DType::kFloat32, nullptr, Device::CUDA(0));
  NDArray h({4});
  ExpectUsageError([&] { c.Clone(); }, "Clone");
  ExpectUsageError([&] { c.AsType(DType::kFloat64); }, "AsType");
  ExpectUsageError([&] { c.Fill(1); }, "Fill");
  ExpectUsageError([&] { c.At(0); }, "At");
  ExpectUsageError([&] { c.ToDoubles(); }, "ToDoubles");
  ExpectUsageError([&] { c.CopyFrom(h); }, "CopyFrom into");
  ExpectUsageError([&] { h.CopyFrom(c); }, "CopyFrom from");
  Reducer r(1 << 20, 1);
  ExpectUsageError([&] { r.Sum({h, c}, &h); }, "Reducer::Sum");
  ExpectUsageError([&] { r.Copy(c, &h); }, "Reducer::Copy");
  // Wrapping and refusing never touch the driver.
  if (!was_initialized) {
    EXPECT_FALSE(cuda::Initialized());
  }
}

TEST(Device, PinnedArraysAreUsableByCpuCode) {
  // Wrapped host memory marked as pinned: every host operation and the CPU reducer
  // accept it (no CUDA call is needed for that).
  std::vector<float> a = {1, 2, 3, 4}, b = {10, 20, 30, 40};
  NDArray pa = NDArray::Wrap(a.data(), {4}, DType::kFloat32, nullptr, Device::Pinned());
  NDArray pb = NDArray::Wrap(b.data(), {4}, DType::kFloat32, nullptr, Device::Pinned());
  Reducer r(1 << 20, 1);
  r.Sum({pa, pb}, &pa);
  EXPECT_EQ(pa.ToDoubles(), (std::vector<double>{11, 22, 33, 44}));
  EXPECT_EQ(pa.Clone().At(3), 44);
  pb.Fill(2);
  EXPECT_EQ(pb.At(0), 2);
  NDArray h({4});
  h.CopyFrom(pa);
  EXPECT_EQ(h.At(1), 22);
  EXPECT_EQ(pa.To(Device::CPU()).At(2), 33);  // host to host: no CUDA needed
}

// Without a usable GPU (this machine: no driver; or a build without CUDA) every
// operation that needs one raises DeviceUnavailable with the reason, and nothing crashes.
TEST(Device, NoUsableGpuIsATypedError) {
  if (cuda::Built() && cuda::DeviceCount() > 0)
    GTEST_SKIP() << "a GPU is present (" << cuda::Status()
                 << "): the no-GPU error path is checked on machines without one";
  const std::string reason = cuda::Status();
  EXPECT_FALSE(reason.empty());
  if (!cuda::Built()) {
    EXPECT_NE(reason.find("built without CUDA"), std::string::npos) << reason;
    EXPECT_NE(reason.find("PSKV_WITH_CUDA=ON"), std::string::npos) << reason;
  }
  EXPECT_EQ(cuda::DeviceCount(), 0);
  auto expect_unavailable = [&](auto&& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << " did not throw";
    } catch (const DeviceUnavailable& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos)
          << what << ": " << e.what() << " does not carry the reason " << reason;
    }
  };
  expect_unavailable([] { NDArray({4}, DType::kFloat32, Device::CUDA(0)); }, "CUDA array");
  expect_unavailable([] { NDArray({4}, DType::kFloat32, Device::Pinned()); }, "pinned array");
  NDArray h({4});
  expect_unavailable([&] { h.To(Device::CUDA(0)); }, "To(cuda:0)");
  NDArray c = NDArray::Wrap(FakeDevicePointer(), {4}, DType::kFloat32, nullptr, Device::CUDA(0));
  expect_unavailable([&] { c.To(Device::CPU()); }, "To(cpu)");
  expect_unavailable([] { cuda::GetStream(0, cuda::StreamKind::kCompute); }, "GetStream");
  expect_unavailable([&] { cuda::Sum({c, c}, &c, nullptr); }, "cuda::Sum");
  const cuda::Counters z = cuda::Stats();
  EXPECT_EQ(z.h2d_bytes + z.d2h_bytes + z.d2d_bytes + z.peer_bytes, 0u);
  // DeviceUnavailable is a UsageError, so callers catching pskv's usage errors see it.
  EXPECT_THROW(NDArray({4}, DType::kFloat32, Device::CUDA(0)), UsageError);
}

// A process that creates and uses a CPU store, and its forked children, never
// initialise CUDA. Runs in a fresh process (threadsafe death tests re-execute the
// binary), so no other test of this binary can have initialised it first.
TEST(DeviceLazyInit, CpuProcessesAndForkedChildrenNeverInitialiseCuda) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (cuda::Initialized()) std::_Exit(10);
        auto kv = KVStore::Create("local", Options());
        NDArray v({8});
        v.Fill(1);
        kv->Init(1, v);
        kv->Push(1, {v, v});
        NDArray out({8});
        kv->Pull(1, {out});
        kv->WaitAll();
        if (out.At(0) != 2) std::_Exit(11);
        // A CUDA array can be described (wrapped) without initialising CUDA.
        NDArray::Wrap(FakeDevicePointer(), {4}, DType::kFloat32, nullptr, Device::CUDA(0));
        if (cuda::Initialized()) std::_Exit(12);
        const pid_t pid = fork();
        if (pid == 0) std::_Exit(cuda::Initialized() ? 13 : 0);
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) std::_Exit(14);
        std::_Exit(cuda::Initialized() ? 15 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

// The first question about devices initialises the device runtime (in every build: it
// picks its backend then), once.
TEST(DeviceLazyInit, FirstDeviceQueryInitialises) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (cuda::Initialized()) std::_Exit(10);
        const int n = cuda::DeviceCount();
        if (n < 0) std::_Exit(11);
        std::_Exit(cuda::Initialized() ? 0 : 12);
      },
      ::testing::ExitedWithCode(0), "");
}
