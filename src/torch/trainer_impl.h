// The state of one pskv::Trainer (include/pskv/torch.h) and the helpers its files
// share: trainer.cc (construction, backward hooks, steps), trainer_sparse.cc (sparse
// parameters), trainer_states.cc (learning rate and optimizer states).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "pskv/torch.h"
#include "pskv/trainer_policy.h"

namespace pskv {

struct Trainer::Impl {
  KVStore* kv;
  TrainerOptions opt;
  std::vector<std::vector<torch::Tensor>> replicas;
  std::vector<torch::Tensor> buffers;  // kept equal to rank 0's (broadcast_buffers)
  std::vector<NDArray> out;  // push_in_backward only: pulled weights (update_on_kvstore) or sums
  std::vector<NDArray> buffer_out;       // the buffers' exchange
  std::vector<NDArray> weights0;         // views of replica 0's parameters
  OptimizerConfig cfg;                   // what the store or local_opt runs
  std::unique_ptr<Optimizer> local_opt;  // update_on_kvstore = false
  std::optional<LossScale> loss;         // set by the constructor
  bool uok = true;                       // update_on_kvstore, resolved
  bool dist = false;
  std::mutex mu;              // pushed, hold (hooks run on autograd's thread)
  std::vector<bool> pushed;   // this step, by parameter
  std::vector<NDArray> hold;  // pushed gradients, alive until the step ends
  bool no_sync = false;
  bool reduced = false;  // AllreduceGrads() ran, Update() may follow
  bool stepped = false;
  std::vector<int64_t> versions;  // replica 0's parameter versions after our writes

  size_t P() const { return weights0.size(); }
  int Key(size_t i) const { return opt.key_offset + static_cast<int>(i); }
  int BufferKey(size_t j) const { return opt.key_offset + static_cast<int>(P() + j); }
  bool Active(size_t i) const { return replicas[0][i].requires_grad(); }
  bool Sparse(size_t i) const { return opt.sparse_params.count(i) > 0; }
  void RecordVersions() {
    versions.clear();
    for (auto& p : replicas[0]) versions.push_back(p._version());
  }
};

namespace trainer_detail {

// A torch tensor of row ids as an int64 NDArray (copied).
NDArray RowIds(const torch::Tensor& ids);

// Rows `ids` of sparse parameter i, pulled from the store into the tensor.
void PullRows(Trainer::Impl& m, size_t i, const NDArray& ids);

// Pushes the rows of sparse parameter i's gradient (also none: its part of a sync
// round); returns their ids.
NDArray PushRows(Trainer::Impl& m, size_t i, double ratio);

}  // namespace trainer_detail
}  // namespace pskv
