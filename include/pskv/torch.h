// libtorch integration: a Trainer that keeps the parameters of a torch::nn::Module
// (or of several replicas of it, one per local device) in sync through any KVStore,
// with Gluon's Trainer API.
//
//   auto kv = pskv::KVStore::Create("dist_sync");
//   pskv::TrainerOptions opt;
//   opt.optimizer = pskv::OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.1"}});
//   opt.loss_reduction = pskv::LossReduction::kMean;      // say how the loss is reduced
//   pskv::Trainer trainer(*model, kv.get(), opt);         // broadcasts rank 0's weights
//   for (...) {
//     auto loss = torch::nll_loss(model->forward(x), y);  // torch's default: mean
//     loss.backward();
//     torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);   // optional
//     trainer.Step();       // exchanges .grad, updates the parameters, clears .grad
//   }
//
// Loss-scaling convention (the Trainer never guesses; the optimizer's own
// rescale_grad is multiplied by this scale, never replaced):
//   kMean: every replica's loss is a mean over its batch slice; the gradients are
//          summed over replicas and workers and divided by replicas * workers.
//   kSum + global_batch_size B: losses summed over the batch; the summed gradients
//          are divided by B (samples per step over all workers and replicas).
//   Step(batch_size) (Gluon): the summed gradients are divided by batch_size for
//          this step.
// Keys are `key_offset` + parameter index, then the buffers. update_on_kvstore=true:
// the store (its servers, in dist mode) runs the optimizer and the trainer pulls the
// new weights; false: the store sums gradients and the trainer runs the optimizer
// locally (identically on every worker).
// Communication: by default Step() sends the gradients as left in .grad (gradient
// accumulation over several backward passes and clipping work). push_in_backward
// overlaps it with backward (a hook pushes each gradient as backward produces it,
// priority = parameter index); then run every micro-batch but the last under
// NoSync(), and do not modify .grad before Step(); a second backward without Step()
// throws UsageError. Parameters with requires_grad=false are skipped. Only CPU
// tensors are supported on this build; TrainerOptions::devices places the replicas'
// exchange on devices (simulated ones included).
// Sparse parameters (docs/sparse.md): the weight of an Embedding(sparse=true) (found by the
// Module constructor, or listed in TrainerOptions::sparse_params) is a row_sparse
// key: Step() pushes the rows of its sparse gradient, the store's optimizer updates
// only those rows (lazy update), and the rows of the next batch (Step's `row_ids`,
// default the rows just pushed) are pulled into the local weight. They need
// update_on_kvstore and a single replica.
// Thread safety: one thread drives a Trainer (backward hooks run on autograd's
// thread while that thread waits in backward()).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "pskv/kvstore.h"
#include "pskv/trainer_policy.h"

namespace pskv {

struct TrainerOptions {
  /// The optimizer; its rescale_grad is multiplied by the loss scale (see above).
  OptimizerConfig optimizer;
  /// Whether the store runs the optimizer; unset: MXNet's policy
  /// (ResolveUpdateOnKVStore in pskv/trainer_policy.h: MXNET_UPDATE_ON_KVSTORE,
  /// default true; true with sparse parameters or an async store).
  std::optional<bool> update_on_kvstore;
  LossReduction loss_reduction = LossReduction::kUnset;
  /// Samples per step over all workers and devices (LossReduction::kSum).
  int64_t global_batch_size = 0;
  /// Push each gradient from a backward hook (single device only); false: push
  /// the gradients in Step(), as left in .grad.
  bool push_in_backward = false;
  /// Buffers (e.g. BatchNorm running statistics) set to rank 0's after every step
  /// on every worker (DDP's broadcast_buffers). The Module constructor fills it.
  std::vector<torch::Tensor> buffers;
  bool broadcast_buffers = true;
  /// Per-parameter multipliers of the learning rate and wd, by parameter index
  /// (Gluon's Parameter.lr_mult / wd_mult); applied on dist servers too.
  std::map<size_t, double> lr_mult, wd_mult;
  /// First store key of this Trainer. Trainers sharing one store (with
  /// update_on_kvstore=false: a store runs one optimizer) need disjoint ranges.
  int key_offset = 0;
  /// Indices of the parameters whose gradients are sparse (row_sparse keys). The
  /// Module constructor adds the weights of its Embedding(sparse=true) submodules.
  std::set<size_t> sparse_params;
  /// One device per replica (MXNet's ctx list), or empty: the store sees each
  /// replica's gradients and writes its new weights on that replica's device, so a
  /// `device` store sums and updates there (docs/gpu.md). With CPU tensors (this build)
  /// each replica's gradients are copied to its device and the new weights back:
  /// training runs unchanged on simulated devices (PSKV_SIM_DEVICES) with the copies
  /// counted, a dry run of multi-device training. Not with push_in_backward or sparse
  /// parameters (UsageError).
  std::vector<Device> devices;
};

class Trainer {
 public:
  /// One replica (device) per inner vector; all replicas have the same parameter
  /// shapes. Initial weights are broadcast from rank 0 to every worker and replica.
  Trainer(std::vector<std::vector<torch::Tensor>> replicas, KVStore* kv, TrainerOptions options);
  Trainer(std::vector<torch::Tensor> params, KVStore* kv, TrainerOptions options);
  /// The module's parameters, and its buffers (options.broadcast_buffers).
  Trainer(torch::nn::Module& module, KVStore* kv, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// After backward of every replica: exchanges gradients and updates every
  /// replica's parameters; clears the gradients. `batch_size` > 0: Gluon's
  /// step(batch_size) (UsageError with kMean).
  void Step(int64_t batch_size = 0);
  /// Step() for sparse parameters: afterwards the rows `row_ids` (by parameter index:
  /// the next batch's ids, any integer dtype, repeats allowed) are pulled into each
  /// sparse parameter; parameters not listed pull the rows they pushed.
  void Step(int64_t batch_size, const std::map<size_t, torch::Tensor>& row_ids);
  /// Pulls rows `row_ids` of sparse parameter `index` from the store into it.
  void RowSparsePull(size_t index, const torch::Tensor& row_ids);
  /// update_on_kvstore=false only: sums .grad over replicas and workers into every
  /// replica's .grad, scaled as the loss reduction says (kMean: the mean over workers
  /// and replicas, DDP's; global_batch_size B: the sum / B; neither: the sum); then e.g.
  /// clip, and Update() applies the optimizer (scaling no further), or step a
  /// torch::optim optimizer of your own.
  void AllreduceGrads();
  void Update(int64_t batch_size = 0);

  /// Backward passes while the guard lives accumulate in .grad without
  /// communication (DDP's no_sync); matters with push_in_backward only.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Trainer* t);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Trainer* t_;
    bool old_;
  };
  [[nodiscard]] std::unique_ptr<NoSyncGuard> NoSync() {
    return std::make_unique<NoSyncGuard>(this);
  }

  /// The base learning rate; SetLearningRate keeps the optimizer states (also on
  /// dist servers: call it on every worker).
  double learning_rate() const;
  void SetLearningRate(double lr);
  /// Optimizer states plus the optimizer; LoadStates restores both (call both on
  /// every worker; in dist mode with update_on_kvstore rank 0 writes/reads the file).
  void SaveStates(const std::string& fname);
  void LoadStates(const std::string& fname);
  bool update_on_kvstore() const;
  /// The optimizer configuration the store or the local updater runs (the loss
  /// scale inside rescale_grad, multipliers and buffers by key).
  const OptimizerConfig& optimizer_config() const;
  /// Number of Step()/Update() calls so far.
  int64_t steps() const { return steps_; }

  struct Impl;  // opaque

 private:
  void OnGrad(size_t key, const torch::Tensor& grad);
  std::unique_ptr<Impl> impl_;
  int64_t steps_ = 0;
};

/// An NDArray view of a contiguous CPU tensor (shares memory, keeps it alive).
NDArray TensorView(const torch::Tensor& t);

}  // namespace pskv
