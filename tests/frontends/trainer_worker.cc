// A worker of a 2-worker dist_sync job for test_trainer.cc: checks the Trainer's
// behaviour across workers and exits non-zero on a mismatch.
//
//   trainer_worker features|stores UPDATE_ON_KVSTORE(0|1) OUT_DIR
//   trainer_worker ckpt UPDATE_ON_KVSTORE(0|1) full|first|resume OUT_DIR
#include <cmath>
#include <cstdio>
#include <fstream>

#include "pskv/data.h"
#include "pskv/error.h"
#include "pskv/process.h"
#include "pskv/torch.h"

namespace {

int failures = 0;

void Check(bool ok, const std::string& what, double got) {
  if (!ok) {
    std::fprintf(stderr, "CHECK FAILED: %s (got %g)\n", what.c_str(), got);
    ++failures;
  }
}

float Val(const torch::Tensor& t) {
  return t.detach().item<float>();
}

int Features(pskv::KVStore* kv, bool uok, const std::string& dir) {
  const int r = kv->Rank();
  torch::manual_seed(1 + r);  // differs per worker: the broadcast must make it equal
  auto a = torch::zeros({1}).requires_grad_(true);
  auto frozen = torch::full({1}, 3.0f + static_cast<float>(r));
  torch::nn::BatchNorm1d bn(2);
  std::vector<torch::Tensor> params{a, frozen};
  for (auto& p : bn->parameters()) params.push_back(p);
  pskv::TrainerOptions o;
  o.optimizer = pskv::OptimizerConfig::FromParams("sgd", {{"learning_rate", "1"}});
  o.update_on_kvstore = uok;
  o.global_batch_size = 1;
  o.buffers = bn->buffers();
  pskv::Trainer t(params, kv, o);
  Check(Val(frozen) == 3.0f, "frozen parameter broadcast from rank 0", Val(frozen));
  // accumulation: sum over workers of 2(r+1)
  (a * (r + 1)).sum().backward();
  (a * (r + 1)).sum().backward();
  bn->forward(torch::randn({8, 2}) + 5.0 * r).sum().backward();
  t.Step();
  Check(Val(a) == -6.0f, "accumulation", Val(a));
  // clipping: each worker's 10 clipped to 1
  (10 * a).sum().backward();
  torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{a}, 1.0);
  t.Step();
  Check(Val(a) == -8.0f, "clipping", Val(a));
  // the learning rate reaches the servers
  t.SetLearningRate(0.5);
  a.sum().backward();
  t.Step();
  Check(Val(a) == -9.0f, "set learning rate", Val(a));
  Check(Val(frozen) == 3.0f, "frozen parameter unchanged", Val(frozen));
  // weights changed after a step: dist + update_on_kvstore refuses (as MXNet)
  {
    torch::NoGradGuard g;
    a.fill_(0.0f);
  }
  a.sum().backward();
  bool refused = false;
  try {
    t.Step();
  } catch (const pskv::UsageError& e) {
    refused = std::string(e.what()).find("Cannot reset distributed KVStore") != std::string::npos;
  }
  Check(refused == uok, "reload refused exactly with update_on_kvstore", refused);
  if (!uok) Check(Val(a) == -1.0f, "reloaded weights used", Val(a));
  {
    std::ofstream f(dir + "/buffers" + std::to_string(r));
    auto m = bn->running_mean.contiguous();
    for (int64_t i = 0; i < m.numel(); ++i) f << m.data_ptr<float>()[i] << "\n";
    f << bn->num_batches_tracked.item<int64_t>() << "\n";
  }
  if (!uok) {  // mean losses, a second Trainer sharing the store at other keys
    auto b = torch::zeros({1}).requires_grad_(true);
    pskv::TrainerOptions ob;
    ob.optimizer = pskv::OptimizerConfig::FromParams("sgd", {{"learning_rate", "1"}});
    ob.update_on_kvstore = false;
    ob.loss_reduction = pskv::LossReduction::kMean;
    ob.key_offset = 100;
    pskv::Trainer tb({b}, kv, ob);
    (b * (r + 1)).sum().backward();
    tb.Step();
    Check(Val(b) == -1.5f, "mean losses averaged over workers", Val(b));
  }
  return failures ? 1 : 0;
}

// Two dist stores in one process (sharing its node), one Trainer each with its
// own server optimizer, keys 0.. in both (a GAN's generator and discriminator).
int Stores(pskv::KVStore* kv_g, bool uok) {
  const int r = kv_g->Rank();
  auto kv_d = pskv::KVStore::Create("dist_sync");
  Check(kv_d->Rank() == r && kv_d->NumWorkers() == kv_g->NumWorkers(), "second store's rank", r);
  torch::manual_seed(1 + r);
  torch::nn::Linear g(2, 2), d(2, 1);
  auto make = [&](double lr) {
    pskv::TrainerOptions o;
    o.optimizer = pskv::OptimizerConfig::FromParams(
        "sgd", {{"learning_rate", std::to_string(lr)}, {"momentum", "0.5"}});
    o.update_on_kvstore = uok;
    o.loss_reduction = pskv::LossReduction::kMean;
    return o;
  };
  pskv::Trainer tg(*g, kv_g, make(1.0));
  pskv::Trainer td(*d, kv_d.get(), make(0.1));
  auto g0 = g->bias.detach().clone(), d0 = d->bias.detach().clone();
  for (int step = 0; step < 2; ++step) {
    // d/dbias of (r+1) * sum(bias): each worker's gradient r+1, mean over workers 1.5
    (d->bias * (r + 1)).sum().backward();
    td.Step();
    (g->bias * (r + 1)).sum().backward();
    tg.Step();
  }
  // momentum 0.5, mean gradient 1.5: steps of lr*1.5 and lr*(0.5*1.5 + 1.5)
  for (int i = 0; i < 2; ++i)
    Check(std::fabs(g->bias[i].item<float>() - (g0[i].item<float>() - 1.0f * 1.5f * 2.5f)) < 1e-5,
          "generator's server optimizer (lr 1)", g->bias[i].item<float>());
  Check(std::fabs(d->bias[0].item<float>() - (d0[0].item<float>() - 0.1f * 1.5f * 2.5f)) < 1e-5,
        "discriminator's server optimizer (lr 0.1)", d->bias[0].item<float>());
  kv_d->Barrier();
  return failures ? 1 : 0;
}

// The dist checkpoint recipe: `full` trains 2 epochs; `first` trains 1 and saves
// (model on rank 0, optimizer states gathered); `resume` loads and trains epoch 2.
// Rank 0 writes the final weights to OUT_DIR/MODE.bin for the test to compare.
int Checkpoint(pskv::KVStore* kv, bool uok, const std::string& mode, const std::string& dir) {
  const int r = kv->Rank(), n = kv->NumWorkers();
  torch::manual_seed(0);
  auto x = torch::randn({96, 8});
  auto y = (x.slice(1, 0, 4).sum(1) > 0).to(torch::kLong) +
           2 * (x.slice(1, 4, 8).sum(1) > 0).to(torch::kLong);
  torch::manual_seed(5 + r);  // differs per worker: the broadcast must fix it
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16),
                              torch::nn::ReLU(), torch::nn::Linear(16, 4));
  const std::string model_file = dir + "/ckpt.pt", states_file = dir + "/ckpt.states";
  if (mode == "resume") torch::load(model, model_file);  // before the Trainer (it broadcasts)
  pskv::TrainerOptions o;
  o.optimizer = pskv::OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.1"},
                                                          {"momentum", "0.9"},
                                                          {"wd", "0.0001"},
                                                          {"lr_scheduler", "factor"},
                                                          {"lr_step", "4"},
                                                          {"lr_factor", "0.7"}});
  o.update_on_kvstore = uok;
  o.loss_reduction = pskv::LossReduction::kMean;
  pskv::Trainer t(*model, kv, o);
  int start = 0;
  if (mode == "resume") {
    t.LoadStates(states_file);  // the states and the optimizer (learning rate 0.05)
    start = 1;
  }
  const int64_t batch = 8, epoch_size = pskv::data::EpochSize(96, n, batch);
  const int epochs = mode == "first" ? 1 : 2;
  for (int epoch = start; epoch < epochs; ++epoch) {
    auto order = pskv::data::EpochOrder(96, n, r, batch, epoch_size, 3, epoch, true);
    for (int64_t b = 0; b < epoch_size; ++b) {
      auto idx = torch::from_blob(order.data() + b * batch, {batch}, torch::kLong).clone();
      torch::nn::functional::cross_entropy(model->forward(x.index_select(0, idx)),
                                           y.index_select(0, idx))
          .backward();
      t.Step();
    }
    if (epoch == 0) t.SetLearningRate(0.05);
    if (mode == "first") {
      t.SaveStates(states_file);  // every worker; rank 0 writes
      if (r == 0) torch::save(model, model_file);
      kv->Barrier();
    }
  }
  Check(t.learning_rate() == 0.05, "learning rate after the first epoch", t.learning_rate());
  if (mode != "first" && r == 0) {
    std::ofstream f(dir + "/" + mode + ".bin", std::ios::binary);
    for (auto& p : model->parameters()) {
      auto c = p.detach().contiguous();
      f.write(reinterpret_cast<const char*>(c.data_ptr<float>()),
              static_cast<std::streamsize>(c.numel() * 4));
    }
    for (auto& b : model->buffers())
      if (b.scalar_type() == torch::kFloat) {
        auto c = b.detach().contiguous();
        f.write(reinterpret_cast<const char*>(c.data_ptr<float>()),
                static_cast<std::streamsize>(c.numel() * 4));
      }
  }
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: trainer_worker features|stores|ckpt UOK [MODE] OUT_DIR\n");
    return 2;
  }
  try {
    torch::set_num_threads(1);
    pskv::ConfigureProcess();
    auto kv = pskv::KVStore::Create("dist_sync");
    const bool uok = std::atoi(argv[2]) != 0;
    const std::string what = argv[1];
    int rc = 2;
    if (what == "stores") {
      rc = Stores(kv.get(), uok);
    } else if (what == "ckpt" && argc >= 5) {
      rc = Checkpoint(kv.get(), uok, argv[3], argv[4]);
    } else if (what == "features") {
      rc = Features(kv.get(), uok, argv[3]);
    } else {
      std::fprintf(stderr, "trainer_worker: unknown scenario '%s'\n", what.c_str());
    }
    kv->Barrier();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer_worker: %s\n", e.what());
    return 1;
  }
}
