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
  bool reduced = false;        // AllreduceGrads() ran, Update() may follow
  double reduced_scale = 1.0;  // the loss scale AllreduceGrads() applied to .grad
  bool stepped = false;
  std::vector<int64_t> versions;  // replica 0's parameter versions after our writes
  // TrainerOptions::devices: per [replica][parameter], the device arrays the store
  // writes (weights, or summed gradients), and this step's copies back to the tensors.
  std::vector<std::vector<NDArray>> twins;
  std::vector<std::pair<NDArray, NDArray>> copy_back;  // (device array, tensor view)

  size_t P() const { return weights0.size(); }
  int Key(size_t i) const { return opt.key_offset + static_cast<int>(i); }
  int BufferKey(size_t j) const { return opt.key_offset + static_cast<int>(P() + j); }
  bool Active(size_t i) const { return replicas[0][i].requires_grad(); }
  bool Sparse(size_t i) const { return opt.sparse_params.count(i) > 0; }
  bool OnDevices() const { return !opt.devices.empty(); }
  /// What the store reads for replica r: the tensor view itself, or a copy on its device.
  NDArray In(size_t r, const NDArray& host) const {
    return OnDevices() && opt.devices[r].is_cuda() ? host.To(opt.devices[r]) : host;
  }
  /// What the store writes for replica r's parameter i: the tensor view itself, or its
  /// device twin, copied back into the view by CopyBack().
  NDArray Out(size_t r, size_t i, const NDArray& host) {
    if (!OnDevices() || !opt.devices[r].is_cuda()) return host;
    NDArray& t = twins[r][i];
    if (t.empty()) t = NDArray(host.shape(), host.dtype(), opt.devices[r]);
    copy_back.emplace_back(t, host);
    return t;
  }
  /// After the store's operations finished: device results into the tensors.
  void CopyBack() {
    for (auto& [dev, host] : copy_back) {
      NDArray h = host;
      h.CopyFrom(dev.To(Device::CPU()));
    }
    copy_back.clear();
  }
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
