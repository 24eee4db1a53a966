// The C++ Trainer with one replica per device (TrainerOptions::devices) on simulated
// devices: the same weights as the replicas exchanged on the CPU, bit for bit, and the
// staging copies counted. Each test runs in its own process (ctest), so it may choose
// the device runtime's backend.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "pskv/device.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/torch.h"

using namespace pskv;

namespace {

constexpr int kReplicas = 3;

bool SimulatedDevices() {
  try {
    cuda::UseSimulatedDevices(kReplicas);
  } catch (const UsageError&) {
    return false;  // the runtime already runs (another backend): not this process's test
  }
  return cuda::Simulated() && cuda::DeviceCount() == kReplicas;
}

// Trains kReplicas replicas of a small MLP on slices of one batch for `steps` steps and
// returns replica 0's parameters.
std::vector<torch::Tensor> Train(const std::string& type, bool on_devices, bool uok, int steps) {
  torch::manual_seed(0);
  std::vector<torch::nn::Sequential> models;
  std::vector<std::vector<torch::Tensor>> replicas;
  for (int r = 0; r < kReplicas; ++r) {
    torch::manual_seed(0);
    models.emplace_back(torch::nn::Linear(6, 5), torch::nn::Tanh(), torch::nn::Linear(5, 2));
    replicas.push_back(models.back()->parameters());
  }
  auto kv = KVStore::Create(type, Options());
  TrainerOptions opt;
  opt.optimizer =
      OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.1"}, {"momentum", "0.9"}});
  opt.loss_reduction = LossReduction::kMean;
  opt.update_on_kvstore = uok;
  if (on_devices)
    for (int r = 0; r < kReplicas; ++r) opt.devices.push_back(Device::CUDA(r));
  Trainer trainer(replicas, kv.get(), opt);
  torch::manual_seed(1);
  for (int s = 0; s < steps; ++s) {
    torch::Tensor x = torch::randn({12, 6}), y = torch::randn({12, 2});
    for (int r = 0; r < kReplicas; ++r) {
      auto sl = torch::indexing::Slice(r * 4, (r + 1) * 4);
      torch::mse_loss(models[r]->forward(x.index({sl})), y.index({sl})).backward();
    }
    trainer.Step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : replicas[0]) out.push_back(p.detach().clone());
  for (int r = 1; r < kReplicas; ++r)
    for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(torch::equal(replicas[r][i], out[i]));
  return out;
}

}  // namespace

TEST(TorchDevices, ReplicasOnDevicesTrainAsOnTheCpuBitForBit) {
  if (!SimulatedDevices()) GTEST_SKIP() << "needs its own process: " << cuda::Status();
  for (bool uok : {true, false}) {
    const auto want = Train("local", false, uok, 5);
    for (const char* type : {"device", "local"}) {
      const auto got = Train(type, true, uok, 5);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_TRUE(torch::equal(got[i], want[i]))
            << type << " update_on_kvstore=" << uok << " parameter " << i;
    }
  }
}

// On the `device` store the replicas' exchange stays on the devices: per step each
// replica's gradients go to its device and its weights come back (the dry run's
// staging, 2·k·M across the "PCIe" for k replicas of M bytes), the sum and the update
// run on the home devices with peer copies in between.
TEST(TorchDevices, TheDeviceStoreSumsAndUpdatesOnTheDevices) {
  if (!SimulatedDevices()) GTEST_SKIP() << "needs its own process: " << cuda::Status();
  Train("device", true, true, 1);  // places every key
  cuda::ResetStats();
  Train("device", true, true, 1);
  const cuda::Counters c = cuda::Stats();
  const uint64_t M = (6 * 5 + 5 + 5 * 2 + 2) * 4;  // the MLP's parameter bytes
  EXPECT_GE(c.h2d_bytes, kReplicas * M);           // gradients in (and the new store's init)
  EXPECT_GE(c.d2h_bytes, kReplicas * M);           // weights back
  EXPECT_GT(c.peer_bytes, 0u);                     // to and from the home devices
  EXPECT_GT(c.kernel_launches, 0u);                // sums and updates on the devices
}

TEST(TorchDevices, MisuseIsATypedError) {
  if (!SimulatedDevices()) GTEST_SKIP() << "needs its own process: " << cuda::Status();
  torch::nn::Linear lin(2, 2);
  auto kv = KVStore::Create("device", Options());
  TrainerOptions opt;
  opt.optimizer = OptimizerConfig::For("sgd");
  opt.loss_reduction = LossReduction::kMean;
  opt.devices = {Device::CUDA(0), Device::CUDA(1)};  // one replica, two devices
  EXPECT_THROW(Trainer(lin->parameters(), kv.get(), opt), InvalidArgument);
  opt.devices = {Device::CUDA(kReplicas)};  // no such device
  EXPECT_THROW(Trainer(lin->parameters(), kv.get(), opt), DeviceUnavailable);
  opt.devices = {Device::CUDA(0)};
  opt.push_in_backward = true;
  EXPECT_THROW(Trainer(lin->parameters(), kv.get(), opt), UsageError);
}
