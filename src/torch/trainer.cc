#include "pskv/torch.h"

#include <cstring>
#include <mutex>

#include "pskv/error.h"

namespace pskv {

namespace {
DType ToDType(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return DType::kFloat32;
    case torch::kDouble:
      return DType::kFloat64;
    case torch::kHalf:
      return DType::kFloat16;
    case torch::kBFloat16:
      return DType::kBFloat16;
    case torch::kInt:
      return DType::kInt32;
    case torch::kLong:
      return DType::kInt64;
    case torch::kChar:
      return DType::kInt8;
    case torch::kByte:
      return DType::kUInt8;
    default:
      throw InvalidArgument(std::string("unsupported tensor dtype ") +
                            c10::toString(t.scalar_type()));
  }
}
}  // namespace

NDArray TensorView(const torch::Tensor& t) {
  if (!t.device().is_cpu()) throw InvalidArgument("pskv on this build handles CPU tensors only");
  if (!t.is_contiguous())
    throw InvalidArgument("TensorView needs a contiguous tensor (call .contiguous())");
  Shape shape(t.sizes().begin(), t.sizes().end());
  auto keep = std::make_shared<torch::Tensor>(t);
  return NDArray::Wrap(t.data_ptr(), shape, ToDType(t), keep);
}

struct Trainer::Impl {
  KVStore* kv;
  TrainerOptions opt;
  std::vector<std::vector<torch::Tensor>> replicas;
  std::vector<NDArray> buffers;          // pulled weights (update_on_kvstore) or summed grads
  std::vector<NDArray> weights0;         // views of replica 0's parameters
  std::unique_ptr<Optimizer> local_opt;  // update_on_kvstore = false
  std::vector<bool> pushed;              // this step, by key
  std::mutex mu;
  bool hooks = false;
};

Trainer::Trainer(std::vector<torch::Tensor> params, KVStore* kv, TrainerOptions options)
    : Trainer(std::vector<std::vector<torch::Tensor>>{std::move(params)}, kv, std::move(options)) {}

Trainer::Trainer(std::vector<std::vector<torch::Tensor>> replicas, KVStore* kv,
                 TrainerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.kv = kv;
  m.opt = std::move(options);
  m.replicas = std::move(replicas);
  if (!kv) throw InvalidArgument("Trainer needs a KVStore");
  if (m.replicas.empty() || m.replicas[0].empty())
    throw InvalidArgument("Trainer needs parameters");
  if (m.opt.global_batch_size <= 0)
    throw InvalidArgument(
        "TrainerOptions::global_batch_size must be > 0 (samples per step over all workers)");
  const size_t P = m.replicas[0].size();
  for (auto& r : m.replicas)
    if (r.size() != P) throw InvalidArgument("every replica must have the same parameters");
  if (kv->Type().find("async") != std::string::npos && !m.opt.update_on_kvstore)
    throw UsageError("Please set update_on_kvstore=true when training in async mode");
  m.opt.optimizer.rescale_grad = 1.0 / static_cast<double>(m.opt.global_batch_size);
  m.opt.optimizer.Validate();
  if (m.opt.update_on_kvstore) {
    kv->SetOptimizer(m.opt.optimizer);
  } else {
    m.local_opt = std::make_unique<Optimizer>(m.opt.optimizer);
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < P; ++i) {
    std::vector<NDArray> outs;
    for (auto& r : m.replicas) {
      if (r[i].sizes() != m.replicas[0][i].sizes())
        throw InvalidArgument("replica parameter shapes differ");
      outs.push_back(TensorView(r[i].detach()));
    }
    m.weights0.push_back(outs[0]);
    // Rank 0's weights become everyone's (spec 8.4 step 2).
    kv->Broadcast(static_cast<int>(i), outs[0], outs, -static_cast<int>(i));
    m.buffers.emplace_back(outs[0].shape(), outs[0].dtype());
  }
  kv->WaitAll();
  m.pushed.assign(P, false);
  m.hooks = m.opt.push_in_backward && m.replicas.size() == 1;
  if (m.hooks) {
    for (size_t i = 0; i < P; ++i) {
      m.replicas[0][i].register_hook([this, i](torch::Tensor grad) { OnGrad(i, grad); });
    }
  }
}

Trainer::~Trainer() {
  try {
    impl_->kv->WaitAll();
  } catch (...) {
    // the store reports failures to its user on their own calls
  }
}

void Trainer::OnGrad(size_t key, const torch::Tensor& grad) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    if (m.pushed[key]) return;  // a parameter used twice: pushed in Step() instead
    m.pushed[key] = true;
  }
  NDArray g = TensorView(grad.contiguous());
  m.kv->PushPull(static_cast<int>(key), {g}, {m.buffers[key]}, static_cast<int>(key));
}

void Trainer::Step() {
  Impl& m = *impl_;
  const size_t P = m.weights0.size();
  // Gradients not pushed by hooks (several replicas, or hooks off) go now, the
  // sum of every replica's gradient per key.
  for (size_t i = P; i-- > 0;) {
    if (m.pushed[i]) continue;
    std::vector<NDArray> grads;
    for (auto& r : m.replicas) {
      const torch::Tensor& g = r[i].grad();
      grads.push_back(g.defined() ? TensorView(g.contiguous())
                                  : TensorView(torch::zeros_like(r[i])));
    }
    m.kv->PushPull(std::vector<int>(grads.size(), static_cast<int>(i)), grads,
                   {static_cast<int>(i)}, {m.buffers[i]}, static_cast<int>(i));
  }
  m.kv->WaitAll();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < P; ++i) {
    if (m.opt.update_on_kvstore) {
      m.weights0[i].CopyFrom(m.buffers[i]);
    } else {
      m.local_opt->Update(static_cast<int64_t>(i), m.buffers[i], &m.weights0[i]);
    }
    for (size_t d = 1; d < m.replicas.size(); ++d) m.replicas[d][i].copy_(m.replicas[0][i]);
    for (auto& r : m.replicas) r[i].mutable_grad() = torch::Tensor();
  }
  std::fill(m.pushed.begin(), m.pushed.end(), false);
  ++steps_;
}

}  // namespace pskv
