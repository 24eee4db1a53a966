// libtorch integration: a Trainer that keeps the parameters of a torch::nn::Module
// (or of several replicas of it, one per local device) in sync through any KVStore.
//
//   auto kv = pskv::KVStore::Create("dist_sync");
//   pskv::TrainerOptions opt;
//   opt.optimizer = pskv::OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.1"}});
//   opt.global_batch_size = batch * kv->NumWorkers();
//   pskv::Trainer trainer(model->parameters(), kv.get(), opt);  // broadcasts rank 0's weights
//   for (...) {
//     auto loss = torch::nll_loss(model->forward(x), y, {}, at::Reduction::Sum);
//     loss.backward();      // each gradient is pushed as soon as backward produces it
//     trainer.Step();       // waits for the answers, updates the parameters
//   }
//
// Keys are parameter indices. Gradients are summed over devices and workers and
// rescaled by 1/global_batch_size, so n workers with batch b train like one
// process with batch n*b (use a loss summed over the batch, as above).
// update_on_kvstore=true: the store (its servers, in dist mode) runs the optimizer
// and the trainer pulls the new weights; false: the store sums gradients and the
// trainer runs the optimizer locally (identically on every worker).
// Communication overlaps backward: a hook on every parameter pushes its gradient
// with priority = parameter index (the last layer's gradient is produced, and
// sent, first). Only CPU float32 parameters are supported on this build.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "pskv/kvstore.h"

namespace pskv {

struct TrainerOptions {
  /// The optimizer; its rescale_grad is replaced by 1 / global_batch_size.
  OptimizerConfig optimizer;
  bool update_on_kvstore = true;
  /// Samples per step over all workers and devices (required, > 0).
  int64_t global_batch_size = 0;
  /// Push each gradient from a backward hook (single device only); false: push
  /// all gradients in Step().
  bool push_in_backward = true;
};

class Trainer {
 public:
  /// One replica (device) per inner vector; all replicas have the same parameter
  /// shapes. Initial weights are broadcast from rank 0 to every worker and replica.
  Trainer(std::vector<std::vector<torch::Tensor>> replicas, KVStore* kv, TrainerOptions options);
  Trainer(std::vector<torch::Tensor> params, KVStore* kv, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// After backward of every replica: exchanges gradients and updates every
  /// replica's parameters. Clears the gradients for the next step.
  void Step();
  /// Number of Step() calls so far.
  int64_t steps() const { return steps_; }

 private:
  void OnGrad(size_t key, const torch::Tensor& grad);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t steps_ = 0;
};

/// An NDArray view of a contiguous CPU tensor (shares memory, keeps it alive).
NDArray TensorView(const torch::Tensor& t);

}  // namespace pskv
