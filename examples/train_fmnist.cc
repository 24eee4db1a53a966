// train_fmnist: data-parallel training of LeNet or an MLP on Fashion-MNIST through
// a pskv KVStore. Run it alone (`--kv-store local`) or as the workers of a job:
//
//   pskv-launch -n 2 -s 1 -- train_fmnist --kv-store dist_sync --epochs 2
//   PSKV_SIM_DEVICES=2 train_fmnist --gpus 0,1 --kv-store device   # 2 (simulated) devices
//
// Each worker reads its part of the training set (num_parts = workers, part_index =
// rank), runs the same number of batches per epoch, and splits every batch over
// --devices model replicas (evenly, or by --work-load-list). Rank 0 shows progress
// and the test accuracy after every epoch; --metrics-out writes them as JSON lines.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "pskv/data.h"
#include "pskv/device.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/process.h"
#include "pskv/torch.h"
#include "pskv/tuning.h"

namespace {

struct Args {
  std::string kv_store = "local";
  std::string network = "lenet";
  int epochs = 2;
  int64_t batch_size = 64;
  double lr = 0.05;
  std::string optimizer = "sgd";
  int devices = 1;
  std::vector<int> gpus;  // --gpus: one replica per listed device (TrainerOptions::devices)
  std::vector<double> work_load;
  int update_on_kvstore = -1;  // -1: MXNet's policy (pskv/trainer_policy.h)
  std::string gc_type = "none";
  double gc_threshold = 0.5;
  uint64_t seed = 42;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string metrics_out;
  int threads = 0;
  int64_t max_batches = 0;  // 0: whole epochs (for tests and benchmarks)
  double min_accuracy = 0;  // exit 3 if the final test accuracy is lower
};

const char* kUsage = R"(usage: train_fmnist [options]
  --kv-store TYPE         local, device, dist_sync, dist_async, ... (default local)
  --network NAME          lenet or mlp (default lenet)
  --epochs N              (default 2)
  --batch-size N          samples per worker per step (default 64)
  --lr X                  learning rate (default 0.05)
  --optimizer NAME        sgd (momentum 0.9), nag, adam, adamw, rmsprop, adagrad (default sgd)
  --devices K             model replicas on this worker; the batch is split over them (default 1)
  --gpus 0,2              MXNet's --gpus: one replica per listed device, the store sums and
                          updates there (--kv-store device or dist_sync_device); the replicas'
                          tensors stay on the CPU and are staged to the devices (with
                          PSKV_SIM_DEVICES=k: simulated devices, a dry run)
  --work-load-list W,...  relative workload per device (default: even split)
  --update-on-kvstore 0|1 run the optimizer on the store/servers (1, default) or locally (0)
  --gc-type none|2bit|1bit  gradient compression (device and dist stores)
  --gc-threshold X        compression threshold (default 0.5)
  --seed N                shuffling seed (default 42)
  --data-dir DIR          Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
  --metrics-out FILE      rank 0 appends one JSON object per epoch
  --threads N             torch intra-op threads (default: cores / local workers)
  --max-batches N         stop each epoch after N batches (0: full epochs)
  --min-accuracy X        exit with status 3 if the final test accuracy is below X
)";

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw pskv::InvalidArgument(k + " needs a value");
    std::string v = argv[++i];
    if (k == "--kv-store")
      a.kv_store = v;
    else if (k == "--network")
      a.network = v;
    else if (k == "--epochs")
      a.epochs = std::stoi(v);
    else if (k == "--batch-size")
      a.batch_size = std::stoll(v);
    else if (k == "--lr")
      a.lr = std::stod(v);
    else if (k == "--optimizer")
      a.optimizer = v;
    else if (k == "--devices")
      a.devices = std::stoi(v);
    else if (k == "--gpus") {
      std::stringstream ss(v);
      std::string x;
      while (std::getline(ss, x, ',')) a.gpus.push_back(std::stoi(x));
    } else if (k == "--work-load-list") {
      std::stringstream ss(v);
      std::string x;
      while (std::getline(ss, x, ',')) a.work_load.push_back(std::stod(x));
    } else if (k == "--update-on-kvstore")
      a.update_on_kvstore = std::stoi(v);
    else if (k == "--gc-type")
      a.gc_type = v;
    else if (k == "--gc-threshold")
      a.gc_threshold = std::stod(v);
    else if (k == "--seed")
      a.seed = std::stoull(v);
    else if (k == "--data-dir")
      a.data_dir = v;
    else if (k == "--metrics-out")
      a.metrics_out = v;
    else if (k == "--threads")
      a.threads = std::stoi(v);
    else if (k == "--max-batches")
      a.max_batches = std::stoll(v);
    else if (k == "--min-accuracy")
      a.min_accuracy = std::stod(v);
    else
      throw pskv::InvalidArgument("unknown option " + k + " (see --help)");
  }
  if (a.network != "lenet" && a.network != "mlp")
    throw pskv::InvalidArgument("--network must be lenet or mlp");
  if (!a.gpus.empty()) {
    for (size_t i = 0; i < a.gpus.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (a.gpus[i] < 0 || a.gpus[i] == a.gpus[j])
          throw pskv::InvalidArgument("--gpus lists distinct device numbers such as 0,2");
    if (a.devices != 1 && a.devices != static_cast<int>(a.gpus.size()))
      throw pskv::InvalidArgument("--devices and --gpus disagree: --gpus alone sets the replicas");
    a.devices = static_cast<int>(a.gpus.size());
  }
  if (a.devices < 1 || a.batch_size < 1 || a.epochs < 1)
    throw pskv::InvalidArgument("bad --devices/--batch-size/--epochs");
  if (!a.work_load.empty() && static_cast<int>(a.work_load.size()) != a.devices)
    throw pskv::InvalidArgument("--work-load-list needs one entry per device");
  return a;
}

// LeNet-5 as in MXNet's image-classification example (tanh, max pooling).
struct LeNetImpl : torch::nn::Module {
  LeNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 20, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(20, 50, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(800, 500))),
        fc2(register_module("fc2", torch::nn::Linear(500, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::tanh(conv1(x)), 2);
    x = torch::max_pool2d(torch::tanh(conv2(x)), 2);
    x = torch::tanh(fc1(x.flatten(1)));
    return torch::log_softmax(fc2(x), 1);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(LeNet);

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 64))),
        fc3(register_module("fc3", torch::nn::Linear(64, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x.flatten(1)));
    x = torch::relu(fc2(x));
    return torch::log_softmax(fc3(x), 1);
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
};

Model MakeModel(const std::string& name) {
  if (name == "lenet") {
    LeNet m;
    return {m.ptr(), [m](torch::Tensor x) mutable { return m->forward(x); }};
  }
  Mlp m;
  return {m.ptr(), [m](torch::Tensor x) mutable { return m->forward(x); }};
}

// Normalised float images and int64 labels of the given samples.
std::pair<torch::Tensor, torch::Tensor> Batch(const pskv::data::ImageDataset& d, const int64_t* idx,
                                              int64_t n) {
  const int64_t px = static_cast<int64_t>(d.rows) * d.cols;
  auto x = torch::empty({n, 1, d.rows, d.cols});
  auto y = torch::empty({n}, torch::kLong);
  float* xp = x.data_ptr<float>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = d.pixels.data() + idx[i] * px;
    for (int64_t j = 0; j < px; ++j) xp[i * px + j] = (src[j] / 255.0f - 0.2860f) / 0.3530f;
    yp[i] = d.labels[static_cast<size_t>(idx[i])];
  }
  return {x, y};
}

double Accuracy(Model& m, const pskv::data::ImageDataset& test) {
  torch::NoGradGuard ng;
  m.module->eval();
  int64_t correct = 0;
  std::vector<int64_t> idx(static_cast<size_t>(test.count));
  for (int64_t i = 0; i < test.count; ++i) idx[static_cast<size_t>(i)] = i;
  for (int64_t b = 0; b < test.count; b += 1000) {
    const int64_t n = std::min<int64_t>(1000, test.count - b);
    auto [x, y] = Batch(test, idx.data() + b, n);
    correct += m.forward(x).argmax(1).eq(y).sum().item<int64_t>();
  }
  m.module->train();
  return static_cast<double>(correct) / static_cast<double>(test.count);
}

int Run(const Args& a) {
  auto kv = pskv::KVStore::Create(a.kv_store);  // a server/scheduler process never returns
  const int rank = kv->Rank(), nw = kv->NumWorkers();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  torch::set_num_threads(a.threads > 0
                             ? a.threads
                             : static_cast<int>(std::max(1u, cores / static_cast<unsigned>(nw))));
  torch::manual_seed(a.seed);

  auto train = pskv::data::ReadMnistDir(a.data_dir, true);
  auto test = pskv::data::ReadMnistDir(a.data_dir, false);

  if (a.gc_type != "none")
    kv->SetGradientCompression(pskv::CompressionConfig::FromParams(
        {{"type", a.gc_type}, {"threshold", std::to_string(a.gc_threshold)}}));

  std::vector<Model> replicas;
  std::vector<std::vector<torch::Tensor>> params;
  for (int d = 0; d < a.devices; ++d) {
    replicas.push_back(MakeModel(a.network));
    params.push_back(replicas.back().module->parameters());
  }
  pskv::TrainerOptions topt;
  std::map<std::string, std::string> op = {{"learning_rate", std::to_string(a.lr)}};
  if (a.optimizer == "sgd" || a.optimizer == "nag") op["momentum"] = "0.9";
  topt.optimizer = pskv::OptimizerConfig::FromParams(a.optimizer, op);
  if (a.update_on_kvstore >= 0) topt.update_on_kvstore = a.update_on_kvstore != 0;
  topt.global_batch_size = a.batch_size * nw;  // the loss below is summed over the batch
  // Overlap communication with backward (no accumulation or clipping here; not with
  // replicas on devices, exchanged in Step()).
  topt.push_in_backward = a.devices == 1 && a.gpus.empty();
  for (int g : a.gpus) topt.devices.push_back(pskv::Device::CUDA(g));
  pskv::Trainer trainer(params, kv.get(), topt);

  int64_t epoch_size = pskv::data::EpochSize(train.count, nw, a.batch_size);
  if (a.max_batches > 0) epoch_size = std::min(epoch_size, a.max_batches);
  const bool tty = ::isatty(1);
  if (rank == 0)
    std::printf(
        "train_fmnist: %s, kvstore %s, %d worker(s) x %d device(s), batch %lld per worker, "
        "%lld batches per epoch, optimizer %s lr %g, update_on_kvstore %d\n",
        a.network.c_str(), kv->Type().c_str(), nw, a.devices, static_cast<long long>(a.batch_size),
        static_cast<long long>(epoch_size), a.optimizer.c_str(), a.lr,
        trainer.update_on_kvstore() ? 1 : 0);
  if (rank == 0 && !a.gpus.empty()) {
    std::string names;
    for (int g : a.gpus) names += (names.empty() ? "" : ", ") + pskv::cuda::DeviceName(g);
    std::printf("train_fmnist: replicas on %s (%s)\n", names.c_str(), pskv::cuda::Status().c_str());
  }
  double last_acc = 0;
  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    auto order = pskv::data::EpochOrder(train.count, nw, rank, a.batch_size, epoch_size, a.seed,
                                        epoch, true);
    auto t0 = std::chrono::steady_clock::now();
    auto last_print = t0;
    double loss_sum = 0;
    int64_t seen = 0;
    for (int64_t b = 0; b < epoch_size; ++b) {
      const int64_t* idx = order.data() + b * a.batch_size;
      auto slices = a.work_load.empty() ? pskv::data::SplitBatch(a.batch_size, a.devices, false)
                                        : pskv::data::SplitByWorkload(a.batch_size, a.work_load);
      for (int d = 0; d < a.devices; ++d) {
        auto [s, e] = slices[static_cast<size_t>(d)];
        auto [x, y] = Batch(train, idx + s, e - s);
        auto loss =
            torch::nll_loss(replicas[static_cast<size_t>(d)].forward(x), y, {}, at::Reduction::Sum);
        loss.backward();
        loss_sum += loss.item<double>();
      }
      trainer.Step();
      seen += a.batch_size;
      auto now = std::chrono::steady_clock::now();
      if (rank == 0 && (now - last_print > std::chrono::seconds(2) || b + 1 == epoch_size)) {
        last_print = now;
        const double secs = std::chrono::duration<double>(now - t0).count();
        const int width = 30, done = static_cast<int>(width * (b + 1) / epoch_size);
        std::printf("%sepoch %d [%s%s] %lld/%lld batches  %.0f samples/s  loss %.4f%s",
                    tty ? "\r" : "", epoch + 1, std::string(static_cast<size_t>(done), '#').c_str(),
                    std::string(static_cast<size_t>(width - done), '.').c_str(),
                    static_cast<long long>(b + 1), static_cast<long long>(epoch_size),
                    seen * nw / secs, loss_sum / static_cast<double>(seen), tty ? "" : "\n");
        std::fflush(stdout);
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 0) {
      last_acc = Accuracy(replicas[0], test);
      std::printf("%sepoch %d: train loss %.4f, test accuracy %.4f, %.1f s, %.0f samples/s\n",
                  tty ? "\n" : "", epoch + 1, loss_sum / static_cast<double>(seen), last_acc, secs,
                  seen * nw / secs);
      std::fflush(stdout);
      if (!a.metrics_out.empty()) {
        std::ofstream f(a.metrics_out, std::ios::app);
        f << "{\"epoch\":" << epoch + 1
          << ",\"train_loss\":" << loss_sum / static_cast<double>(seen)
          << ",\"test_accuracy\":" << last_acc << ",\"seconds\":" << secs
          << ",\"samples_per_sec\":" << seen * nw / secs << ",\"workers\":" << nw
          << ",\"kvstore\":\"" << kv->Type() << "\"}\n";
      }
    }
  }
  kv->Barrier();
  if (rank == 0 && !a.gpus.empty()) {
    const pskv::cuda::Counters c = pskv::cuda::Stats();
    std::printf(
        "train_fmnist: device copies: d2h %llu bytes, h2d %llu bytes, peer %llu bytes, "
        "%llu kernel launches\n",
        static_cast<unsigned long long>(c.d2h_bytes), static_cast<unsigned long long>(c.h2d_bytes),
        static_cast<unsigned long long>(c.peer_bytes),
        static_cast<unsigned long long>(c.kernel_launches));
  }
  if (rank == 0 && last_acc < a.min_accuracy) {
    std::fprintf(stderr, "train_fmnist: test accuracy %.4f is below --min-accuracy %.4f\n",
                 last_acc, a.min_accuracy);
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pskv::TuneAllocatorForLargeMessages();
  try {
    // Started as a server or the scheduler (pskv-launch --server-command)? Run that.
    if (auto rc = pskv::RunServerRoleIfAsked()) return *rc;
    // A worker: log levels, log name, timeline and metrics as the PSKV_* variables say.
    pskv::ConfigureProcess();
    return Run(Parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fmnist: %s\n", e.what());
    return 1;
  }
}
