// The dist stores with values on devices (docs/gpu.md, "The dist stores on devices"):
// real jobs (a scheduler, 2 servers, 2 workers started by pskv-launch), each worker
// driving 3 simulated devices (PSKV_SIM_DEVICES=3) through
// tests/distributed/dist_device_worker.cc: weights bitwise equal to a CPU run of the same job,
// and the d2l steps' bytes read off the copy counters. Each case also runs with random
// delays on every simulated stream (PSKV_SIM_JITTER) and without peer copies
// (MXNET_ENABLE_GPU_P2P=0).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

namespace {

int Launch(const std::string& scenario, const std::string& env, int steps = 4) {
  std::string cmd = PSKV_LAUNCH;
  cmd +=
      " -n 2 -s 2 --timeout 150 --env MXNET_KVSTORE_BIGARRAY_BOUND=1000"
      " --env PSKV_WIRE_CHUNK_BYTES=65536 --env PSKV_SIM_DEVICES=3 ";
  cmd += env + " -- " + DIST_DEVICE_WORKER + " " + scenario + " " + std::to_string(steps);
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

class DistDeviceStore : public ::testing::TestWithParam<const char*> {};

// dist_sync_device: the sum on a home device, pieces pushed as they land; M bytes d2h
// and M h2d per worker and step.
TEST_P(DistDeviceStore, SyncDeviceEqualsTheCpuRun) {
  EXPECT_EQ(Launch("sync_device", GetParam()), 0);
}
// dist_sync with device values: staged through pinned memory, summed on the CPU;
// k·M each way.
TEST_P(DistDeviceStore, SyncStagesThroughTheHost) {
  EXPECT_EQ(Launch("sync", GetParam()), 0);
}
TEST_P(DistDeviceStore, AsyncDeviceEqualsTheCpuRun) {
  EXPECT_EQ(Launch("async_device", GetParam()), 0);
}
TEST_P(DistDeviceStore, AsyncStagesThroughTheHost) {
  EXPECT_EQ(Launch("async", GetParam()), 0);
}
// 2-bit compression: the device sum is quantised on the host, as the CPU run's.
TEST_P(DistDeviceStore, CompressionWithDeviceValues) {
  EXPECT_EQ(Launch("compression_device", GetParam()), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Sim, DistDeviceStore,
    ::testing::Values("", "--env PSKV_SIM_JITTER=7", "--env MXNET_ENABLE_GPU_P2P=0"),
    [](const ::testing::TestParamInfo<const char*>& p) {
      return std::string(p.index == 0 ? "Plain" : p.index == 1 ? "Jitter" : "NoP2P");
    });

TEST(DistDeviceStoreErrors, RowSparseOnDevicesIsATypedError) {
  EXPECT_EQ(Launch("row_sparse_device", "", 1), 0);
}

}  // namespace
