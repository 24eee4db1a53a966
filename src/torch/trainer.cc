#include "pskv/store_type.h"
#include "pskv/torch.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

#include "pskv/device.h"
#include "pskv/error.h"
#include "pskv/row_sparse.h"
#include "pskv/trainer_policy.h"
#include "trainer_impl.h"

namespace pskv {

using trainer_detail::PullRows;
using trainer_detail::PushRows;
using trainer_detail::RowIds;

Trainer::Trainer(std::vector<torch::Tensor> params, KVStore* kv, TrainerOptions options)
    : Trainer(std::vector<std::vector<torch::Tensor>>{std::move(params)}, kv, std::move(options)) {}

namespace {
TrainerOptions WithBuffers(torch::nn::Module& module, TrainerOptions o) {
  if (o.buffers.empty()) o.buffers = module.buffers();
  // The weights of Embedding(sparse=true) submodules are sparse parameters.
  const auto params = module.parameters();
  for (const auto& sub : module.modules()) {
    auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(sub.get());
    if (!emb || !emb->options.sparse()) continue;
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].is_same(emb->weight)) o.sparse_params.insert(i);
  }
  return o;
}
}  // namespace

Trainer::Trainer(torch::nn::Module& module, KVStore* kv, TrainerOptions options)
    : Trainer(module.parameters(), kv, WithBuffers(module, std::move(options))) {}

namespace {

// The replicas' shapes and the sparse parameters' indices are usable.
void CheckParameters(const Trainer::Impl& m) {
  if (m.replicas.empty() || m.replicas[0].empty())
    throw InvalidArgument("Trainer needs parameters");
  const size_t P = m.replicas[0].size();
  for (auto& r : m.replicas)
    if (r.size() != P) throw InvalidArgument("every replica must have the same parameters");
  for (size_t i : m.opt.sparse_params)
    if (i >= P)
      throw InvalidArgument("sparse parameter index " + std::to_string(i) + ", but there are " +
                            std::to_string(P) + " parameters");
}

// Where updates run (update_on_kvstore), the loss scale, and the optimizer in the store
// or here.
void SetUpOptimizer(Trainer::Impl& m) {
  KVStore* kv = m.kv;
  const size_t P = m.replicas[0].size(), R = m.replicas.size();
  const int n = kv->NumWorkers();
  UpdatePlacement where;
  where.requested = m.opt.update_on_kvstore;
  where.store_type = kv->Type();
  where.env_default = kv->options().update_on_kvstore.value_or(true);
  where.devices = static_cast<int>(R);
  for (auto& p : m.replicas[0]) where.largest_param = std::max(where.largest_param, p.numel());
  where.sparse_params = !m.opt.sparse_params.empty();
  m.uok = ResolveUpdateOnKVStore(where);
  // Loss scale (see the header).
  m.loss.emplace(m.opt.loss_reduction, m.opt.global_batch_size, n, static_cast<int>(R));
  if (m.opt.broadcast_buffers && n > 1) m.buffers = m.opt.buffers;
  m.cfg = TrainerOptimizerConfig(m.opt.optimizer, m.loss->shipped(), m.opt.key_offset, P,
                                 m.opt.lr_mult, m.opt.wd_mult, m.buffers.size());
  if (m.uok) {
    kv->SetOptimizer(m.cfg);
  } else {
    m.local_opt = std::make_unique<Optimizer>(m.cfg);
  }
}

// TrainerOptions::devices: one usable device per replica, dense parameters only.
void SetUpDevices(Trainer::Impl& m) {
  const size_t P = m.replicas[0].size(), R = m.replicas.size();
  if (m.opt.devices.size() != R)
    throw InvalidArgument("TrainerOptions::devices names " + std::to_string(m.opt.devices.size()) +
                          " devices for " + std::to_string(R) +
                          " replicas: give one device per replica");
  if (m.opt.push_in_backward || !m.opt.sparse_params.empty())
    throw UsageError(
        "TrainerOptions::devices works with dense parameters exchanged in Step(): turn "
        "push_in_backward off and keep sparse parameters on the CPU (no devices)");
  for (const Device& d : m.opt.devices)
    if (d.is_cuda() && d.id >= cuda::DeviceCount())
      throw DeviceUnavailable("TrainerOptions::devices names " + d.str() + ", but " +
                              cuda::Status() + " (simulated devices: PSKV_SIM_DEVICES=k)");
  m.twins.assign(R, std::vector<NDArray>(P));
}

// Initializes every parameter's and buffer's key in the store, so that rank 0's values
// become everyone's, and waits for it (under the caller's NoGradGuard).
void InitKeys(Trainer::Impl& m) {
  KVStore* kv = m.kv;
  const size_t P = m.replicas[0].size();
  for (size_t i = 0; i < P; ++i) {
    if (m.Sparse(i)) {  // every row: rank 0's table becomes everyone's
      NDArray w = TensorView(m.replicas[0][i].detach());
      const int64_t rows = w.shape()[0];
      NDArray ids(Shape{rows}, DType::kInt64);
      for (int64_t r = 0; r < rows; ++r) ids.data<int64_t>()[r] = r;
      kv->Init(m.Key(i), RowSparseNDArray::FromRows(w.shape(), ids, w));
      m.weights0.push_back(w);
      m.out.emplace_back();  // not used: rows are pulled into the weight
      PullRows(m, i, ids);
      continue;
    }
    std::vector<NDArray> outs;
    for (auto& r : m.replicas) {
      if (r[i].sizes() != m.replicas[0][i].sizes())
        throw InvalidArgument("replica parameter shapes differ");
      outs.push_back(TensorView(r[i].detach()));
    }
    m.weights0.push_back(outs[0]);
    // Rank 0's weights become everyone's (as Gluon's Trainer does).
    kv->Broadcast(m.Key(i), outs[0], outs, -static_cast<int>(i));
    // Only gradients pushed in backward are answered into a buffer (Step pulls
    // straight into the parameters).
    m.out.push_back(m.opt.push_in_backward ? NDArray(outs[0].shape(), outs[0].dtype()) : NDArray());
  }
  for (size_t j = 0; j < m.buffers.size(); ++j) {
    NDArray b = TensorView(m.buffers[j].detach());
    kv->Broadcast(m.BufferKey(j), b, {b});
    m.buffer_out.emplace_back(b.shape(), b.dtype());
  }
  kv->WaitAll();
}

}  // namespace

Trainer::Trainer(std::vector<std::vector<torch::Tensor>> replicas, KVStore* kv,
                 TrainerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.kv = kv;
  m.opt = std::move(options);
  m.replicas = std::move(replicas);
  if (!kv) throw InvalidArgument("Trainer needs a KVStore");
  CheckParameters(m);
  m.dist = StoreType::Parse(kv->Type()).dist;
  SetUpOptimizer(m);
  if (m.OnDevices()) SetUpDevices(m);
  const size_t P = m.replicas[0].size(), R = m.replicas.size();
  for (size_t i : m.opt.sparse_params) {
    if (R != 1) throw InvalidArgument("sparse parameters work with a single replica");
    if (m.replicas[0][i].dim() < 1)
      throw InvalidArgument("a sparse parameter needs rows (at least one dimension)");
  }
  torch::NoGradGuard no_grad;
  InitKeys(m);
  m.pushed.assign(P, false);
  m.hold.resize(P);
  m.RecordVersions();
  if (m.opt.push_in_backward) {
    if (R != 1) throw InvalidArgument("push_in_backward works with a single replica");
    if (m.loss->scale() == 0)
      throw UsageError(
          "push_in_backward needs the loss scale at construction: set loss_reduction=kMean or "
          "global_batch_size");
    for (size_t i = 0; i < P; ++i)
      // frozen parameters get no gradient (and torch refuses hooks); sparse ones are
      // pushed in Step()
      if (m.Active(i) && !m.Sparse(i))
        m.replicas[0][i].register_hook([this, i](torch::Tensor grad) { OnGrad(i, grad); });
  }
}

Trainer::~Trainer() {
  try {
    impl_->kv->WaitAll();
  } catch (...) {
    // the store reports failures to its user on their own calls
  }
}

Trainer::NoSyncGuard::NoSyncGuard(Trainer* t) : t_(t) {
  std::lock_guard<std::mutex> lk(t_->impl_->mu);
  old_ = t_->impl_->no_sync;
  t_->impl_->no_sync = true;
}

Trainer::NoSyncGuard::~NoSyncGuard() {
  std::lock_guard<std::mutex> lk(t_->impl_->mu);
  t_->impl_->no_sync = old_;
}

void Trainer::OnGrad(size_t i, const torch::Tensor& grad) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    if (m.no_sync) return;
    if (m.pushed[i])
      throw UsageError(
          "a second backward before Step() with push_in_backward: the gradient was already sent. "
          "Run the micro-batches but the last under trainer.NoSync(), or set "
          "push_in_backward=false to accumulate in .grad");
    m.pushed[i] = true;
  }
  // The hook sees this backward's gradient; earlier (NoSync) micro-batches are in .grad.
  const torch::Tensor& prev = m.replicas[0][i].grad();
  torch::Tensor total =
      prev.defined() ? (prev.detach() + grad.detach()) : grad.detach().contiguous();
  NDArray g = TensorView(total.contiguous());
  m.hold[i] = g;
  m.kv->PushPull(m.Key(i), {g}, {m.out[i]}, static_cast<int>(i));
}

// Weights changed outside the Trainer after a step (e.g. loaded from a checkpoint)
// while the store holds them: MXNet re-creates a local store, and refuses for dist.
static void CheckWeights(Trainer::Impl& m) {
  bool changed = false;
  for (size_t i = 0; i < m.P(); ++i) changed |= m.replicas[0][i]._version() != m.versions[i];
  if (changed && m.uok && m.stepped) {
    if (m.dist)
      throw UsageError(
          "Cannot reset distributed KVStore: parameters were changed outside the Trainer after a "
          "step while the store holds the weights (update_on_kvstore). Load weights before "
          "creating the Trainer, then LoadStates (docs/coming-from-gluon.md)");
    if (!m.opt.sparse_params.empty())
      throw UsageError(
          "Cannot reset a KVStore holding sparse parameters: parameters were changed outside the "
          "Trainer after a step. Load weights before creating the Trainer");
    // The store's values become the current weights; its optimizer starts afresh.
    OptimizerConfig assign = m.cfg;
    for (size_t i = 0; i < m.P(); ++i) assign.sum_keys.insert(m.Key(i));
    m.kv->SetOptimizer(assign);
    for (size_t i = 0; i < m.P(); ++i) m.kv->Push(m.Key(i), {m.weights0[i].Clone()});
    m.kv->WaitAll();
    m.kv->SetOptimizer(m.cfg);
    torch::NoGradGuard no_grad;
    for (size_t d = 1; d < m.replicas.size(); ++d)
      for (size_t i = 0; i < m.P(); ++i) m.replicas[d][i].copy_(m.replicas[0][i]);
  }
  m.RecordVersions();
}

// update_on_kvstore=false: the gradients summed over replicas and workers end up in
// every replica's .grad.
static void Allreduce(Trainer::Impl& m) {
  const size_t P = m.P();
  for (size_t i = P; i-- > 0;) {
    if (!m.Active(i) || m.pushed[i]) continue;
    std::vector<NDArray> grads, sums;
    for (size_t d = 0; d < m.replicas.size(); ++d) {
      torch::Tensor& g = m.replicas[d][i].mutable_grad();
      if (!g.defined()) g = torch::zeros_like(m.replicas[d][i]);
      if (!g.is_contiguous()) g = g.contiguous();
      grads.push_back(m.In(d, TensorView(g)));
      sums.push_back(m.Out(d, i, TensorView(g)));
    }
    // in place (without devices): every input is read before any output is written
    m.kv->PushPull(std::vector<int>(grads.size(), m.Key(i)), grads,
                   std::vector<int>(grads.size(), m.Key(i)), sums, static_cast<int>(i));
  }
  m.kv->WaitAll();
  m.CopyBack();
  for (size_t i = 0; i < P; ++i) {
    if (!m.Active(i) || !m.pushed[i]) continue;  // pushed by the hook: the sum is in out[i]
    torch::Tensor g = torch::empty_like(m.replicas[0][i]);
    TensorView(g).CopyFrom(m.out[i]);
    m.replicas[0][i].mutable_grad() = g;
  }
}

static void UpdateLocal(Trainer::Impl& m, double ratio) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < m.P(); ++i) {
    if (!m.Active(i)) continue;
    torch::Tensor g = m.replicas[0][i].grad();
    if (ratio != 1.0) g = g * ratio;
    m.local_opt->Update(m.Key(i), TensorView(g.contiguous()), &m.weights0[i]);
    for (size_t d = 1; d < m.replicas.size(); ++d) m.replicas[d][i].copy_(m.replicas[0][i]);
  }
}

// broadcast_buffers: every worker gets rank 0's buffers (DDP's rule).
static void SyncBuffers(Trainer::Impl& m) {
  if (m.buffers.empty()) return;
  const bool rank0 = m.kv->Rank() == 0;
  std::vector<int> keys;
  std::vector<NDArray> vals;
  for (size_t j = 0; j < m.buffers.size(); ++j) {
    keys.push_back(m.BufferKey(j));
    vals.push_back(rank0 ? TensorView(m.buffers[j].detach().clone())
                         : TensorView(torch::zeros_like(m.buffers[j])));
  }
  m.kv->PushPull(keys, vals, keys, m.buffer_out);
  m.kv->WaitAll();
  for (size_t j = 0; j < m.buffers.size(); ++j)
    TensorView(m.buffers[j].detach()).CopyFrom(m.buffer_out[j]);
}

static void Finish(Trainer::Impl& m) {
  for (auto& r : m.replicas)
    for (auto& p : r) p.mutable_grad() = torch::Tensor();
  std::lock_guard<std::mutex> lk(m.mu);
  std::fill(m.pushed.begin(), m.pushed.end(), false);
  for (auto& h : m.hold) h = NDArray();
  m.reduced = false;
  m.stepped = true;
  m.RecordVersions();
}

namespace {
// The small parameters of one Step, pushed+pulled by one call.
struct SmallBatch {
  std::vector<int> keys, out_keys;
  std::vector<NDArray> grads, weights;
  int priority = 0;
  bool any = false;
  void Add(int key, const std::vector<NDArray>& g, const std::vector<NDArray>& w, int prio) {
    for (auto& x : g) {
      keys.push_back(key);
      grads.push_back(x);
    }
    for (auto& x : w) {
      out_keys.push_back(key);
      weights.push_back(x);
    }
    priority = any ? std::max(priority, prio) : prio;
    any = true;
  }
  void Issue(KVStore& kv) {
    if (any) kv.PushPull(keys, grads, out_keys, weights, priority);
  }
};
}  // namespace

void Trainer::Step(int64_t batch_size) {
  Step(batch_size, {});
}

void Trainer::Step(int64_t batch_size, const std::map<size_t, torch::Tensor>& row_ids) {
  Impl& m = *impl_;
  for (auto& [i, ids] : row_ids)
    if (!m.Sparse(i))
      throw InvalidArgument("Step: row_ids for parameter " + std::to_string(i) +
                            ", which is not a sparse parameter of this Trainer");
  const double ratio = m.loss->Ratio(batch_size);
  CheckWeights(m);
  const size_t P = m.P();
  if (!m.uok) {
    Allreduce(m);
    UpdateLocal(m, ratio);
  } else {
    bool any_pushed = false;
    for (size_t i = 0; i < P; ++i) any_pushed |= m.pushed[i];
    if (ratio != 1.0 && any_pushed)
      throw UsageError(
          "Step(batch_size) differs from the scale the gradients were pushed with in backward; "
          "with push_in_backward keep the batch size constant");
    // The sum of every replica's gradient per key, highest index (last layer) first.
    // Small parameters (biases, norms: within the store's fusion limit) go in one
    // call, so that a dist store fuses them into few messages; the others one call
    // each, with their own priority.
    const auto small_limit =
        static_cast<uint64_t>(std::max<int64_t>(0, m.kv->options().fusion_key_bytes));
    SmallBatch small;
    std::map<size_t, NDArray> pushed_rows;
    for (size_t i = P; i-- > 0;) {
      if (!m.Active(i) || m.pushed[i]) continue;
      if (m.Sparse(i)) {
        pushed_rows[i] = PushRows(m, i, ratio);
        continue;
      }
      std::vector<NDArray> grads;
      for (size_t d = 0; d < m.replicas.size(); ++d) {
        const torch::Tensor& g = m.replicas[d][i].grad();
        torch::Tensor t = g.defined() ? g.detach() : torch::zeros_like(m.replicas[d][i]);
        if (ratio != 1.0) t = t * ratio;
        grads.push_back(m.In(d, TensorView(t.contiguous())));
      }
      // The new weights are pulled straight into every replica's parameter (no
      // staging buffer, no copy afterwards; with devices, into each replica's device
      // array, copied back after the step); the gradients are other tensors.
      std::vector<NDArray> weights;
      for (size_t d = 0; d < m.replicas.size(); ++d)
        weights.push_back(m.Out(d, i, TensorView(m.replicas[d][i].detach())));
      if (grads[0].nbytes() <= small_limit) {
        small.Add(m.Key(i), grads, weights, static_cast<int>(i));
      } else {
        m.kv->PushPull(std::vector<int>(grads.size(), m.Key(i)), grads,
                       std::vector<int>(weights.size(), m.Key(i)), weights, static_cast<int>(i));
      }
    }
    small.Issue(*m.kv);
    m.kv->WaitAll();
    m.CopyBack();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < P; ++i) {
      // Pushed in backward: the new weights are in out[i] (the parameters could not
      // be written while autograd might still read them).
      if (!m.Active(i) || m.Sparse(i) || !m.pushed[i]) continue;
      m.weights0[i].CopyFrom(m.out[i]);
      for (size_t d = 1; d < m.replicas.size(); ++d) m.replicas[d][i].copy_(m.replicas[0][i]);
    }
    for (auto& [i, rows] : pushed_rows) {
      auto it = row_ids.find(i);
      PullRows(m, i, it != row_ids.end() ? RowIds(it->second) : rows);
    }
  }
  SyncBuffers(m);
  Finish(m);
  ++steps_;
}

void Trainer::AllreduceGrads() {
  Impl& m = *impl_;
  if (m.uok)
    throw UsageError(
        "AllreduceGrads() is for update_on_kvstore=false (the store runs the optimizer "
        "otherwise): set update_on_kvstore=false, or call Step()");
  CheckWeights(m);
  Allreduce(m);
  // .grad as the optimizer uses it: scaled as the loss reduction says (the mean over
  // workers and replicas with kMean), so that a torch.optim step after this sees what
  // DDP gives; Update() then divides that scale out of its rescale_grad once.
  const double scale = m.loss->scale();
  m.reduced_scale = scale != 0 ? scale : 1.0;
  if (scale != 0 && scale != 1.0) {
    torch::NoGradGuard no_grad;
    for (auto& replica : m.replicas)
      for (size_t i = 0; i < m.P(); ++i)
        if (m.Active(i) && replica[i].grad().defined()) replica[i].mutable_grad().mul_(scale);
  }
  m.reduced = true;
}

void Trainer::Update(int64_t batch_size) {
  Impl& m = *impl_;
  if (m.uok) throw UsageError("Update() is for update_on_kvstore=false: call Step() instead");
  if (!m.reduced) throw UsageError("Update() needs AllreduceGrads() first (or call Step())");
  UpdateLocal(m, m.loss->Ratio(batch_size) / m.reduced_scale);
  SyncBuffers(m);
  Finish(m);
  ++steps_;
}

}  // namespace pskv
