// pskv::Trainer (libtorch) in one process on a local store, with update_on_kvstore
// true and false: gradient accumulation, clipping, overlap with backward, frozen
// parameters, loss scaling, Gluon's Trainer surface. The 2-worker counterparts run
// trainer_worker under pskv-launch (TrainerDist below).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "pskv/error.h"
#include "pskv/torch.h"

namespace {

using pskv::LossReduction;
using pskv::Trainer;
using pskv::TrainerOptions;

torch::Tensor Scalar(float v = 0) {
  return torch::full({1}, v).requires_grad_(true);
}

TrainerOptions Opts(bool uok, double lr = 1.0, const std::string& extra_name = "",
                    const std::string& extra_value = "") {
  TrainerOptions o;
  std::map<std::string, std::string> p{{"learning_rate", std::to_string(lr)}};
  if (!extra_name.empty()) p[extra_name] = extra_value;
  o.optimizer = pskv::OptimizerConfig::FromParams("sgd", p);
  o.update_on_kvstore = uok;
  o.global_batch_size = 1;
  return o;
}

float Val(const torch::Tensor& t) {
  return t.detach().item<float>();
}

class TrainerTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<pskv::KVStore> kv = pskv::KVStore::Create("local");
};

TEST_P(TrainerTest, AccumulationUsesEveryMicroBatch) {
  auto w = Scalar();
  Trainer t({w}, kv.get(), Opts(GetParam()));
  w.sum().backward();
  w.sum().backward();
  t.Step();
  EXPECT_EQ(Val(w), -2.0f);  // the old hook pushed the first micro-batch only
  EXPECT_FALSE(w.grad().defined());
}

TEST_P(TrainerTest, ClippingAfterBackwardApplies) {
  auto w = Scalar();
  Trainer t({w}, kv.get(), Opts(GetParam()));
  (10 * w).sum().backward();
  torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{w}, 1.0);
  t.Step();
  EXPECT_NEAR(Val(w), -1.0f, 1e-6);
}

TEST_P(TrainerTest, PushInBackwardWithNoSyncAndSecondBackwardError) {
  auto w = Scalar();
  auto o = Opts(GetParam());
  o.push_in_backward = true;
  Trainer t({w}, kv.get(), o);
  {
    auto guard = t.NoSync();
    w.sum().backward();
    (2 * w).sum().backward();
  }
  (3 * w).sum().backward();  // the hook pushes 1 + 2 + 3
  t.Step();
  EXPECT_EQ(Val(w), -6.0f);
  w.sum().backward();
  try {
    w.sum().backward();
    ADD_FAILURE() << "a second backward without Step() must throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("second backward"), std::string::npos) << e.what();
  }
  t.Step();
  EXPECT_EQ(Val(w), -7.0f);
}

TEST_P(TrainerTest, FrozenParametersAreSkipped) {
  auto w = Scalar();
  auto frozen = torch::full({1}, 5.0f);  // requires_grad = false
  for (bool hooks : {false, true}) {
    auto o = Opts(GetParam());
    o.push_in_backward = hooks;  // torch refuses hooks on frozen tensors
    o.key_offset = hooks ? 10 : 0;
    if (GetParam() && hooks) kv = pskv::KVStore::Create("local");  // one optimizer per store
    Trainer t({w, frozen}, kv.get(), o);
    (w * frozen).sum().backward();
    t.Step();
  }
  EXPECT_EQ(Val(frozen), 5.0f);
  EXPECT_EQ(Val(w), -10.0f);
}

TEST_P(TrainerTest, LossScalingConventions) {
  {  // mean, one worker: the gradient as is
    auto w = Scalar();
    auto o = Opts(GetParam());
    o.global_batch_size = 0;
    o.loss_reduction = LossReduction::kMean;
    Trainer t({w}, kv.get(), o);
    (4 * w).sum().backward();
    t.Step();
    EXPECT_EQ(Val(w), -4.0f);
    EXPECT_THROW(t.Step(4), pskv::UsageError);  // mean + batch size is ambiguous
  }
  {  // sum + global batch 4; Step(8) overrides; the optimizer's rescale_grad 0.5 multiplies
    auto w = Scalar();
    auto o = Opts(GetParam(), 1.0, "rescale_grad", "0.5");
    o.global_batch_size = 4;
    o.key_offset = 5;
    auto kv2 = pskv::KVStore::Create("local");
    Trainer t({w}, kv2.get(), o);
    (8 * w).sum().backward();
    t.Step();
    EXPECT_EQ(Val(w), -1.0f);  // 8 * 0.5 / 4 (the old Trainer replaced 0.5: -2)
    (8 * w).sum().backward();
    t.Step(8);
    EXPECT_EQ(Val(w), -1.5f);
  }
  {  // Gluon: no scale at construction, Step(batch_size)
    auto w = Scalar();
    auto o = Opts(GetParam());
    o.global_batch_size = 0;
    o.key_offset = 7;
    auto kv3 = pskv::KVStore::Create("local");
    Trainer t({w}, kv3.get(), o);
    (4 * w).sum().backward();
    EXPECT_THROW(t.Step(), pskv::UsageError);
    t.Step(2);
    EXPECT_EQ(Val(w), -2.0f);
  }
}

TEST_P(TrainerTest, SetLearningRateKeepsMomentum) {
  auto w = Scalar();
  Trainer t({w}, kv.get(), Opts(GetParam(), 1.0, "momentum", "0.5"));
  w.sum().backward();
  t.Step();  // m = -1
  EXPECT_EQ(t.learning_rate(), 1.0);
  t.SetLearningRate(0.1);
  EXPECT_EQ(t.learning_rate(), 0.1);
  w.sum().backward();
  t.Step();  // m = 0.5 * -1 - 0.1 = -0.6 (fresh states: -0.1)
  EXPECT_NEAR(Val(w), -1.6f, 1e-6);
}

TEST_P(TrainerTest, SaveAndLoadStatesRestoreTheOptimizer) {
  const std::string path = "/tmp/pskv_trainer_states_" + std::to_string(::getpid());
  {
    auto w = Scalar();
    Trainer t({w}, kv.get(), Opts(GetParam(), 1.0, "momentum", "0.5"));
    w.sum().backward();
    t.Step();
    t.SetLearningRate(0.1);
    t.SaveStates(path);
  }
  auto kv2 = pskv::KVStore::Create("local");
  auto w2 = Scalar(-1);
  Trainer t2({w2}, kv2.get(), Opts(GetParam(), 7.0, "momentum", "0.5"));
  t2.LoadStates(path);
  EXPECT_NEAR(t2.learning_rate(), 0.1, 1e-12);
  w2.sum().backward();
  t2.Step();
  EXPECT_NEAR(Val(w2), -1.6f, 1e-6);
  std::filesystem::remove(path);
}

TEST_P(TrainerTest, LrMultAndWdMult) {
  auto a = Scalar(1), b = Scalar(1), c = Scalar(1);
  auto o = Opts(GetParam(), 1.0, "wd", "0.5");
  o.lr_mult[1] = 0.5;
  o.wd_mult[2] = 0.0;
  Trainer t({a, b, c}, kv.get(), o);
  (a + b + c).sum().backward();
  t.Step();
  EXPECT_NEAR(Val(a), 1 - 1.5f, 1e-6);
  EXPECT_NEAR(Val(b), 1 - 0.5f * 1.5f, 1e-6);
  EXPECT_NEAR(Val(c), 0.0f, 1e-6);
  o.lr_mult[3] = 2;
  EXPECT_THROW(Trainer({a}, pskv::KVStore::Create("local").get(), o), pskv::InvalidArgument);
}

TEST_P(TrainerTest, ReplicasWithMeanLosses) {
  auto w0 = Scalar(), w1 = Scalar(5);  // replica 1 starts different: the broadcast fixes it
  auto o = Opts(GetParam());
  o.global_batch_size = 0;
  o.loss_reduction = LossReduction::kMean;
  Trainer t(std::vector<std::vector<torch::Tensor>>{{w0}, {w1}}, kv.get(), o);
  EXPECT_EQ(Val(w1), 0.0f);
  w0.sum().backward();
  (3 * w1).sum().backward();
  t.Step();  // (1 + 3) / 2 replicas
  EXPECT_EQ(Val(w0), -2.0f);
  EXPECT_EQ(Val(w1), -2.0f);
  if (!GetParam()) {
    w0.sum().backward();
    (3 * w1).sum().backward();
    t.AllreduceGrads();  // the mean over the 2 replicas in every replica's .grad (kMean)
    EXPECT_EQ(Val(w0.grad()), 2.0f);
    EXPECT_EQ(Val(w1.grad()), 2.0f);
    t.Update();
    EXPECT_EQ(Val(w0), -4.0f);
    EXPECT_EQ(Val(w1), -4.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(UpdateOnKVStore, TrainerTest, ::testing::Bool());

TEST(Trainer, AllreduceGradsThenUpdate) {
  auto kv = pskv::KVStore::Create("local");
  auto w = Scalar();
  Trainer t({w}, kv.get(), Opts(false));
  (10 * w).sum().backward();
  t.AllreduceGrads();
  torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{w}, 2.0);
  t.Update();
  EXPECT_NEAR(Val(w), -2.0f, 1e-6);
  EXPECT_THROW(t.Update(), pskv::UsageError);
  auto kv2 = pskv::KVStore::Create("local");
  Trainer u({Scalar()}, kv2.get(), Opts(true));
  EXPECT_THROW(u.AllreduceGrads(), pskv::UsageError);
  EXPECT_THROW(u.Update(), pskv::UsageError);
}

// update_on_kvstore left unset: MXNet's policy (pskv/trainer_policy.h), the same as
// Python's Trainer (tests/trainer_scenarios.json runs both).
TEST(Trainer, UnsetUpdateOnKVStoreFollowsTheStoreOptions) {
  auto o = Opts(true);
  o.update_on_kvstore.reset();
  auto kv = pskv::KVStore::Create("local");
  EXPECT_TRUE(Trainer({Scalar()}, kv.get(), o).update_on_kvstore());
  pskv::Options off;
  off.update_on_kvstore = false;  // MXNET_UPDATE_ON_KVSTORE=0
  auto kv2 = pskv::KVStore::Create("local", off);
  Trainer t({Scalar()}, kv2.get(), o);
  EXPECT_FALSE(t.update_on_kvstore());
  EXPECT_EQ(t.optimizer_config().rescale_grad, 1.0);  // global_batch_size 1
}

TEST(Trainer, WeightsLoadedAfterAStepResetALocalStore) {
  auto kv = pskv::KVStore::Create("local");
  auto w = Scalar(1);
  Trainer t({w}, kv.get(), Opts(true, 0.1));
  w.sum().backward();
  t.Step();
  {
    torch::NoGradGuard g;
    w.fill_(5.0f);  // e.g. torch::load into the module
  }
  w.sum().backward();
  t.Step();
  EXPECT_NEAR(Val(w), 4.9f, 1e-6);  // the old Trainer continued from the store's 0.9
}

TEST(Trainer, TwoTrainersShareAStoreWithKeyOffsets) {
  auto kv = pskv::KVStore::Create("local");
  auto g = Scalar(), d = Scalar();
  Trainer tg({g}, kv.get(), Opts(false, 1.0));
  auto od = Opts(false, 0.1);
  od.key_offset = 1;
  Trainer td({d}, kv.get(), od);
  (g + d).sum().backward();
  td.Step();
  tg.Step();
  EXPECT_EQ(Val(g), -1.0f);
  EXPECT_NEAR(Val(d), -0.1f, 1e-6);
}

TEST(Trainer, ArgumentErrors) {
  auto kv = pskv::KVStore::Create("local");
  auto o = Opts(true);
  o.loss_reduction = LossReduction::kMean;
  EXPECT_THROW(Trainer({Scalar()}, kv.get(), o), pskv::InvalidArgument);
  o = Opts(true);
  o.global_batch_size = 0;
  o.push_in_backward = true;
  EXPECT_THROW(Trainer({Scalar()}, kv.get(), o), pskv::UsageError);
}

// ---------------------------------------------------------------- 2 workers

int Sh(const std::string& cmd) {
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

std::string Slurp(const std::string& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

class TrainerDist : public ::testing::TestWithParam<int> {};

TEST_P(TrainerDist, FeaturesTwoWorkers) {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/pskv_trainer_" +
                          std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  // the worker checks the values itself and exits non-zero on a mismatch
  ASSERT_EQ(Sh(std::string(LAUNCH) + " -n 2 -s 1 --timeout 90 -- " + WORKER + " features " +
               std::to_string(GetParam()) + " " + dir),
            0);
  std::string b0 = Slurp(dir + "/buffers0"), b1 = Slurp(dir + "/buffers1");
  EXPECT_FALSE(b0.empty());
  EXPECT_EQ(b0, b1);  // BatchNorm running statistics: rank 0's on both workers
  std::filesystem::remove_all(dir);
}

TEST_P(TrainerDist, TwoStoresTwoTrainersPerProcess) {
  ASSERT_EQ(Sh(std::string(LAUNCH) + " -n 2 -s 2 --timeout 90 -- " + WORKER + " stores " +
               std::to_string(GetParam()) + " /tmp"),
            0);
}

std::vector<float> ReadFloats(const std::string& p) {
  std::string b = Slurp(p);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// Stop a 2-worker job after epoch 1 (checkpoint), resume it: the same final
// weights as an uninterrupted run.
TEST_P(TrainerDist, CheckpointResumeMatchesUninterruptedRun) {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/pskv_ckpt_" +
                          std::to_string(::getpid()) + "_" + std::to_string(GetParam());
  std::filesystem::create_directories(dir);
  for (const char* mode : {"full", "first", "resume"})
    ASSERT_EQ(Sh(std::string(LAUNCH) + " -n 2 -s 1 --timeout 90 -- " + WORKER + " ckpt " +
                 std::to_string(GetParam()) + " " + mode + " " + dir),
              0)
        << mode;
  auto full = ReadFloats(dir + "/full.bin"), resumed = ReadFloats(dir + "/resume.bin");
  ASSERT_EQ(full.size(), 8u * 16 + 16 + 16 + 16 + 16 * 4 + 4 + 16 + 16);
  ASSERT_EQ(full.size(), resumed.size());
  float max_diff = 0;
  for (size_t i = 0; i < full.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(full[i] - resumed[i]));
  EXPECT_LT(max_diff, 1e-6);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(UpdateOnKVStore, TrainerDist, ::testing::Values(1, 0));

}  // namespace

// Sparse parameters (issue 15): an Embedding(sparse=true) found by the Module
// constructor is a row_sparse key; Step() pushes the rows of its sparse gradient,
// lazy SGD updates only those rows, and the rows asked for are pulled back.
namespace {
struct EmbNet : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr};
  EmbNet() {
    emb = register_module("emb",
                          torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 2).sparse(true)));
    fc = register_module("fc", torch::nn::Linear(2, 1));
  }
  torch::Tensor forward(const torch::Tensor& ids) { return fc(emb(ids)).sum(); }
};
}  // namespace

TEST(TrainerSparse, EmbeddingRowsArePushedAndPulledAsRowSparse) {
  auto kv = pskv::KVStore::Create("local");
  auto net = std::make_shared<EmbNet>();
  const torch::Tensor w0 = net->emb->weight.detach().clone();
  const torch::Tensor fcw = net->fc->weight.detach().clone();
  TrainerOptions o = Opts(true, 0.5);
  Trainer t(*net, kv.get(), o);
  auto ids = torch::tensor({3, 1, 3}, torch::kLong);
  net->forward(ids).backward();
  ASSERT_TRUE(net->emb->weight.grad().is_sparse());
  // Pull rows 3 and 7 for the "next batch": row 7 unchanged, row 3 updated twice.
  t.Step(0, {{0, torch::tensor({7, 3}, torch::kLong)}});
  auto w = net->emb->weight.detach();
  for (int64_t j = 0; j < 2; ++j) {
    EXPECT_FLOAT_EQ(w[7][j].item<float>(), w0[7][j].item<float>());
    EXPECT_FLOAT_EQ(w[3][j].item<float>(),
                    w0[3][j].item<float>() - 0.5f * 2 * fcw[0][j].item<float>());
    // Row 1 was updated on the store but not pulled: the local copy is stale.
    EXPECT_FLOAT_EQ(w[1][j].item<float>(), w0[1][j].item<float>());
  }
  t.RowSparsePull(0, torch::tensor({1}, torch::kLong));
  EXPECT_FLOAT_EQ(net->emb->weight[1][0].item<float>(),
                  w0[1][0].item<float>() - 0.5f * fcw[0][0].item<float>());
  // The row_sparse key refuses a dense pull, naming the rule.
  pskv::NDArray dense({10, 2});
  EXPECT_THROW(kv->Pull(0, {dense}), pskv::UsageError);
}

TEST(TrainerSparse, SparseParametersNeedUpdateOnKVStore) {
  auto kv = pskv::KVStore::Create("local");
  auto net = std::make_shared<EmbNet>();
  EXPECT_THROW(Trainer(*net, kv.get(), Opts(false)), pskv::UsageError);
}
