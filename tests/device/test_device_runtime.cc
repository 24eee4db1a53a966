// The device runtime over whichever backend the process has: the simulated one in every
// build (ctest entries sim.* with PSKV_SIM_DEVICES=3, sim_jitter.* with random stream
// delays, sim_nop2p.* with MXNET_ENABLE_GPU_P2P=0) and a real GPU (gpu.*; SKIPPED
// without one). Tests named Sim* check what only the simulator models (memory the host
// cannot touch, pointer checks) and skip on a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device/runtime.h"
#include "pskv/device.h"
#include "pskv/error.h"
#include "pskv/ndarray.h"

using namespace pskv;

namespace {

class Devices : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() < 2) GTEST_SKIP() << "needs 2 devices: " << cuda::Status();
  }
};

class SimDevices : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0 || !cuda::Simulated())
      GTEST_SKIP() << "simulator only (PSKV_SIM_DEVICES): " << cuda::Status();
  }
};

NDArray Filled(int64_t n, double v, Device d) {
  NDArray h({n});
  h.Fill(v);
  return d.is_cuda() ? h.To(d) : h;
}

}  // namespace

TEST_F(SimDevices, SayTheyAreSimulatedEverywhere) {
  EXPECT_TRUE(cuda::Simulated());
  EXPECT_NE(cuda::Status().find("simulated"), std::string::npos) << cuda::Status();
  EXPECT_EQ(cuda::DeviceName(1), "simulated device 1");
  EXPECT_THROW(cuda::DeviceName(cuda::DeviceCount()), DeviceUnavailable);
  // Once the runtime runs, asking for another configuration is a usage error.
  EXPECT_THROW(cuda::UseSimulatedDevices(cuda::DeviceCount() + 1), UsageError);
  EXPECT_NO_THROW(cuda::UseSimulatedDevices(cuda::DeviceCount()));
}

// The pointer handed out for device memory is mapped PROT_NONE: host code that reads
// it dies at once (on a real GPU it would read garbage or fault later).
TEST_F(SimDevices, HostReadOfDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the runtime's threads
  EXPECT_DEATH(
      {
        NDArray a({16}, DType::kFloat32, Device::CUDA(0));
        volatile float x = *static_cast<volatile float*>(a.raw());
        (void)x;
      },
      "");
  EXPECT_DEATH(
      {
        NDArray a({16}, DType::kFloat32, Device::CUDA(1));
        *static_cast<volatile float*>(a.raw()) = 1;
      },
      "");
}

TEST_F(SimDevices, EveryPointerIsCheckedAtEachCopyAndLaunch) {
  auto s0 = cuda::GetStream(0, cuda::StreamKind::kCompute);
  NDArray d0({64}, DType::kFloat32, Device::CUDA(0));
  NDArray d1({64}, DType::kFloat32, Device::CUDA(1));
  NDArray host({64});
  // A host pointer passed as device memory.
  NDArray fake = NDArray::Wrap(host.raw(), {64}, DType::kFloat32, nullptr, Device::CUDA(0));
  EXPECT_THROW(cuda::Sum({fake}, &d0, s0), DeviceError);
  // Device 1's memory used as device 0's.
  NDArray wrong = NDArray::Wrap(d1.raw(), {64}, DType::kFloat32, nullptr, Device::CUDA(0));
  try {
    cuda::Sum({wrong}, &d0, s0);
    FAIL() << "no error for memory of the wrong device";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("memory of device 1"), std::string::npos) << e.what();
  }
  // Past the end of an allocation.
  NDArray longer = NDArray::Wrap(d0.raw(), {65}, DType::kFloat32, nullptr, Device::CUDA(0));
  NDArray dst65({65}, DType::kFloat32, Device::CUDA(0));
  EXPECT_THROW(cuda::Sum({longer}, &dst65, s0), DeviceError);
  EXPECT_THROW(cuda::CopyAsync(d0.raw(), Device::CUDA(0), host.raw(), Device::CPU(), 65 * 4, s0),
               DeviceError);
  // A device pointer passed as the host side of a copy.
  EXPECT_THROW(cuda::CopyAsync(d0.raw(), Device::CUDA(0), d1.raw(), Device::CPU(), 4, s0),
               DeviceError);
  // Freed memory (`out` is allocated first: a later allocation may reuse the address).
  NDArray out({64}, DType::kFloat32, Device::CUDA(0));
  void* freed = nullptr;
  {
    NDArray gone({64}, DType::kFloat32, Device::CUDA(0));
    freed = gone.raw();
  }
  NDArray dangling = NDArray::Wrap(freed, {64}, DType::kFloat32, nullptr, Device::CUDA(0));
  EXPECT_THROW(cuda::Sum({dangling}, &out, s0), DeviceError);
  cuda::StreamSync(s0);  // nothing bad was enqueued
}

TEST_F(Devices, EventsFollowCudaSemantics) {
  cuda::Stream s = cuda::NewStream(0);
  NDArray a({1 << 20}, DType::kFloat32, Device::CUDA(0));
  for (int i = 0; i < 8; ++i) cuda::Fill(&a, i, s);
  cuda::Event e = cuda::RecordEvent(0, s);
  cuda::EventSync(e);
  EXPECT_TRUE(cuda::EventDone(e));
  EXPECT_EQ(a.To(Device::CPU()).At(12345), 7);
  cuda::ReleaseEvent(0, e);
}

// A consumer on another device's stream waits for the producer's queued work: the
// copy sees the producer's last value (with jitter, dropping the WaitStream reads an
// earlier one, and TSan reports the race).
TEST_F(Devices, WaitStreamOrdersAProducerBeforeAConsumer) {
  const int64_t n = 1 << 18;
  for (int round = 0; round < 5; ++round) {
    NDArray a({n}, DType::kFloat32, Device::CUDA(0));
    NDArray b({n}, DType::kFloat32, Device::CUDA(1));
    cuda::Stream producer = cuda::NewStream(0);
    cuda::Stream consumer = cuda::GetStream(1, cuda::StreamKind::kCompute);
    for (int i = 1; i <= 10; ++i) cuda::Fill(&a, round * 100 + i, producer);
    cuda::WaitStream(1, consumer, producer);
    cuda::CopyAsync(b.raw(), b.device(), a.raw(), a.device(), a.nbytes(), consumer);
    cuda::StreamSync(consumer);
    NDArray h = b.To(Device::CPU());
    ASSERT_EQ(h.At(0), round * 100 + 10);
    ASSERT_EQ(h.At(n - 1), round * 100 + 10);
  }
}

TEST_F(Devices, CopiesBetweenDevicesArePeerOrStagedThroughTheHost) {
  const int64_t n = 1000;
  NDArray a = Filled(n, 2.5, Device::CUDA(0));
  cuda::ResetStats();
  NDArray b = a.To(Device::CUDA(1));
  const cuda::Counters c = cuda::Stats();
  const uint64_t bytes = n * 4;
  if (cuda::PeerCopies(1, 0)) {
    EXPECT_EQ(c.peer_bytes, bytes);
    EXPECT_EQ(c.d2h_bytes + c.h2d_bytes, 0u);
  } else {  // MXNET_ENABLE_GPU_P2P=0 or no peer access
    EXPECT_EQ(c.peer_bytes, 0u);
    EXPECT_EQ(c.d2h_bytes, bytes);
    EXPECT_EQ(c.h2d_bytes, bytes);
  }
  EXPECT_EQ(b.To(Device::CPU()).At(n - 1), 2.5);
}

TEST_F(Devices, OptimizerKernelMatchesTheCpuRule) {
  // Covered per rule, with the store, in test_device_store.cc; here the raw call's checks.
  NDArray w = Filled(8, 1, Device::CUDA(0)), g = Filled(8, 1, Device::CUDA(0));
  NDArray g1 = Filled(8, 1, Device::CUDA(1));
  auto s = cuda::GetStream(0, cuda::StreamKind::kCompute);
  kops::UpdateScalars sc;
  sc.lr = 0.5f;
  sc.rescale = 1;
  EXPECT_THROW(cuda::Update(kops::UpdateKind::kNone, sc, g, &w, {}, s), InvalidArgument);
  EXPECT_THROW(cuda::Update(kops::UpdateKind::kSgd, sc, g1, &w, {}, s), UsageError);
  cuda::Update(kops::UpdateKind::kSgd, sc, g, &w, {}, s);
  cuda::StreamSync(s);
  EXPECT_EQ(w.To(Device::CPU()).At(7), 0.5);
}
