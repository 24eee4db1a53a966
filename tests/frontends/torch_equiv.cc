// Trains an MLP for a few steps on the first Fashion-MNIST samples and writes the
// final parameters to a file. Used by test_torch.cc to check MXNet's promise:
// n workers with batch b (dist_sync) end with the same weights as one process
// with batch n*b, when worker w's batch s is slice w of the single process's batch s.
//
//   torch_equiv OUT_FILE KVSTORE UPDATE_ON_KVSTORE(0|1) BATCH_PER_WORKER STEPS DEVICES
#include <cstdio>
#include <fstream>

#include "pskv/data.h"
#include "pskv/error.h"
#include "pskv/process.h"
#include "pskv/torch.h"

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: torch_equiv OUT KVSTORE UPDATE_ON_KVSTORE BATCH STEPS DEVICES\n");
    return 2;
  }
  try {
    const std::string out = argv[1];
    pskv::ConfigureProcess();
    auto kv = pskv::KVStore::Create(argv[2]);
    const bool uok = std::atoi(argv[3]) != 0;
    const int64_t b = std::atoll(argv[4]);
    const int steps = std::atoi(argv[5]), devices = std::atoi(argv[6]);
    const int n = kv->NumWorkers(), rank = kv->Rank();
    torch::set_num_threads(1);
    auto data = pskv::data::ReadMnistDir("/usr/share/datasets/fashion-mnist", true);
    std::vector<std::vector<torch::Tensor>> params;
    std::vector<torch::nn::Sequential> models;
    for (int d = 0; d < devices; ++d) {
      torch::manual_seed(rank * 100 + d + 1);  // different on purpose: the broadcast must fix it
      models.push_back(torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 64),
                                             torch::nn::ReLU(), torch::nn::Linear(64, 10),
                                             torch::nn::LogSoftmax(1)));
      params.push_back(models.back()->parameters());
    }
    pskv::TrainerOptions opt;
    opt.optimizer = pskv::OptimizerConfig::FromParams(
        "sgd", {{"learning_rate", "0.1"}, {"momentum", "0.9"}, {"wd", "0.0001"}});
    opt.update_on_kvstore = uok;
    opt.global_batch_size = b * n;
    pskv::Trainer trainer(params, kv.get(), opt);
    const int64_t px = 784;
    for (int s = 0; s < steps; ++s) {
      const int64_t first = (static_cast<int64_t>(s) * n + rank) * b;
      auto slices = pskv::data::SplitBatch(b, devices, false);
      for (int d = 0; d < devices; ++d) {
        auto [lo, hi] = slices[static_cast<size_t>(d)];
        const int64_t m = hi - lo;
        auto x = torch::empty({m, 1, 28, 28});
        auto y = torch::empty({m}, torch::kLong);
        for (int64_t i = 0; i < m; ++i) {
          const int64_t idx = first + lo + i;
          for (int64_t j = 0; j < px; ++j)
            x.data_ptr<float>()[i * px + j] =
                data.pixels[static_cast<size_t>(idx * px + j)] / 255.0f;
          y.data_ptr<int64_t>()[i] = data.labels[static_cast<size_t>(idx)];
        }
        torch::nll_loss(models[static_cast<size_t>(d)]->forward(x), y, {}, at::Reduction::Sum)
            .backward();
      }
      trainer.Step();
    }
    if (rank == 0) {
      std::ofstream f(out, std::ios::binary);
      for (auto& p : params[0]) {
        auto c = p.detach().contiguous();
        f.write(reinterpret_cast<const char*>(c.data_ptr<float>()),
                static_cast<std::streamsize>(c.numel() * 4));
      }
    }
    kv->Barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_equiv: %s\n", e.what());
    return 1;
  }
}
