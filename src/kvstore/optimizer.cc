// Optimizer: per-key states (slots, float32 master copies, update counts), the
// dense and row-sparse update paths around the rule of the config's type
// (optimizer_rules.h), and the states blobs (their format: states_file.h).
#include "pskv/optimizer.h"

#include <cstring>

#include "device/runtime.h"
#include "kvstore/optimizer_rules.h"
#include "kvstore/states_file.h"
#include "pskv/error.h"

namespace pskv {

Optimizer::Optimizer(OptimizerConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.Validate();
  rule_ = FindUpdateRule(cfg_.type);  // non-null: Validate checked the type
}

Optimizer::State& Optimizer::GetState(int64_t key, const NDArray& weight) {
  auto& st = states_[key];
  const Device dev = weight.device();
  if (!st) {
    st = std::make_unique<State>();
    for (int i = 0, n = rule_->slots(cfg_); i < n; ++i)
      st->slots.emplace_back(Shape{weight.size()}, DType::kFloat32, dev);
    if (cfg_.multi_precision && IsLowPrecision(weight.dtype())) {
      if (dev.is_cuda()) {
        st->master = NDArray(Shape{weight.size()}, DType::kFloat32, dev);
        auto s = cuda::GetStream(dev.id, cuda::StreamKind::kCompute);
        cuda::Convert(weight, &st->master, s);
        cuda::StreamSync(s);
      } else {
        st->master = weight.AsType(DType::kFloat32).Reshape({weight.size()});
      }
    }
  }
  // States live with their weight: loaded (host) states follow a weight on a device.
  for (auto& s : st->slots)
    if (s.device() != dev) s = s.To(dev);
  if (!st->master.empty() && st->master.device() != dev) st->master = st->master.To(dev);
  for (auto& s : st->slots)
    if (s.size() != weight.size())
      throw ShapeError("optimizer state of key " + std::to_string(key) + " has " +
                       std::to_string(s.size()) + " elements but the weight has " +
                       std::to_string(weight.size()) + " (states loaded for another model?)");
  // The float32 master copy (multi-precision) is written with the weight's size.
  if (!st->master.empty() && st->master.size() != weight.size())
    throw ShapeError("optimizer master copy of key " + std::to_string(key) + " has " +
                     std::to_string(st->master.size()) + " elements but the weight has " +
                     std::to_string(weight.size()) + " (states loaded for another model?)");
  return *st;
}

namespace {
// The parameter a state key belongs to: chunk c >= 1 of a dist key (wire chunks,
// dist_protocol.h) has its own state under (c << 32) | key, and the key's
// multipliers and sum_keys entry.
int64_t ParamKey(int64_t key) {
  return (key >> 32) > 0 ? static_cast<int64_t>(static_cast<int32_t>(key & 0xffffffff)) : key;
}
}  // namespace

Optimizer::Step Optimizer::BeginStep(int64_t key, const NDArray& weight, int64_t* schedule_at) {
  Step s;
  s.wd = cfg_.wd;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.state = &GetState(key, weight);
    s.t = ++s.state->t;
    num_update_ = std::max(num_update_, s.t);
    int64_t at = num_update_;
    if (schedule_at && *schedule_at > 0) {
      at = *schedule_at;
      num_update_ = std::max(num_update_, at);
    } else if (schedule_at) {
      *schedule_at = at;
    }
    s.lr = cfg_.lr_schedule.Rate(cfg_.learning_rate, at);
  }
  if (auto it = cfg_.lr_mult.find(ParamKey(key)); it != cfg_.lr_mult.end()) s.lr *= it->second;
  if (auto it = cfg_.wd_mult.find(ParamKey(key)); it != cfg_.wd_mult.end()) s.wd *= it->second;
  return s;
}

void Optimizer::Update(int64_t key, const NDArray& grad, NDArray* weight, int64_t* schedule_at) {
  if (grad.size() != weight->size())
    throw ShapeError("optimizer update of key " + std::to_string(key) + ": gradient has " +
                     std::to_string(grad.size()) + " elements, weight has " +
                     std::to_string(weight->size()));
  if (cfg_.sum_keys.count(ParamKey(key)) && weight->device().is_cuda()) {
    auto s = cuda::GetStream(weight->device().id, cuda::StreamKind::kCompute);
    NDArray w = weight->Reshape({weight->size()});
    cuda::Convert(grad.Reshape({grad.size()}), &w, s);
    cuda::StreamSync(s);
    return;
  }
  if (cfg_.sum_keys.count(ParamKey(key))) {  // not a parameter: the pushed sum becomes the value
    weight->CopyFrom(grad.dtype() == weight->dtype() ? grad : grad.AsType(weight->dtype()),
                     /*allow_reshape=*/true);
    return;
  }
  if (weight->device().is_cuda()) return UpdateOnDevice(key, grad, weight, schedule_at);
  auto [st, lr, wd, t] = BeginStep(key, *weight, schedule_at);
  const UpdateStep step{lr, wd, t};
  const auto update = rule_->update;
  NDArray g32 = grad.dtype() == DType::kFloat32 ? grad : grad.AsType(DType::kFloat32);
  const int64_t n = weight->size();
  std::vector<float*> slots;
  for (auto& sl : st->slots) slots.push_back(sl.data<float>());
  if (!st->master.empty()) {
    update(cfg_, step, g32.data<float>(), st->master.data<float>(), slots.data(), n);
    weight->CopyFrom(st->master, /*allow_reshape=*/true);
  } else if (weight->dtype() == DType::kFloat32) {
    update(cfg_, step, g32.data<float>(), weight->data<float>(), slots.data(), n);
  } else {
    NDArray w32 = weight->AsType(DType::kFloat32);
    update(cfg_, step, g32.data<float>(), w32.data<float>(), slots.data(), n);
    weight->CopyFrom(w32);
  }
}

// The device twin of Update's dense path: the built-in rule's kernel (the CPU's element
// function, device/kernel_ops.h) on the weight's device, with the same scalars, so the
// result is the CPU's bit for bit. Returns once the device work finished.
void Optimizer::UpdateOnDevice(int64_t key, const NDArray& grad, NDArray* weight,
                               int64_t* schedule_at) {
  const kops::UpdateKind kind = BuiltinUpdateKind(cfg_);
  if (kind == kops::UpdateKind::kNone)
    throw UsageError("optimizer '" + cfg_.type +
                     "' is a registered update rule, which runs on the CPU only; with weights "
                     "on devices use a built-in optimizer (sgd, nag, adam, adamw, rmsprop, "
                     "adagrad) or the 'local' store, which updates on the CPU");
  const Device dev = weight->device();
  if (grad.device() != dev)
    throw UsageError("optimizer update of key " + std::to_string(key) + ": the gradient is on " +
                     grad.device().str() + ", the weight on " + dev.str());
  auto s = cuda::GetStream(dev.id, cuda::StreamKind::kCompute);
  auto [st, lr, wd, t] = BeginStep(key, *weight, schedule_at);
  const kops::UpdateScalars sc = UpdateScalarsFor(kind, cfg_, UpdateStep{lr, wd, t});
  const int64_t n = weight->size();
  auto flat32 = [&](const NDArray& a) {
    if (a.dtype() == DType::kFloat32) return a.Reshape({n});
    NDArray c(Shape{n}, DType::kFloat32, dev);
    cuda::Convert(a, &c, s);
    return c;
  };
  NDArray g32 = flat32(grad);
  std::vector<NDArray*> slots;
  for (auto& sl : st->slots) slots.push_back(&sl);
  if (!st->master.empty()) {
    cuda::Update(kind, sc, g32, &st->master, slots, s);
    NDArray w = weight->Reshape({n});
    cuda::Convert(st->master, &w, s);
  } else if (weight->dtype() == DType::kFloat32) {
    NDArray w = weight->Reshape({n});
    cuda::Update(kind, sc, g32, &w, slots, s);
  } else {
    NDArray w32 = flat32(*weight);
    cuda::Update(kind, sc, g32, &w32, slots, s);
    NDArray w = weight->Reshape({n});
    cuda::Convert(w32, &w, s);
  }
  cuda::StreamSync(s);  // the temporaries above live until here
}

void Optimizer::UpdateRows(int64_t key, const int64_t* ids, int64_t n, const NDArray& grad_rows,
                           int64_t row_size, NDArray* weight, int64_t* schedule_at) {
  int64_t grad_elements;
  if (row_size <= 0 || n < 0 || weight->size() % row_size != 0 ||
      __builtin_mul_overflow(n, row_size, &grad_elements) || grad_rows.size() != grad_elements)
    throw ShapeError("sparse optimizer update of key " + std::to_string(key) + ": " +
                     std::to_string(n) + " rows of " + std::to_string(row_size) +
                     " elements do not fit a gradient of " + std::to_string(grad_rows.size()) +
                     " elements and a weight of " + std::to_string(weight->size()));
  if (weight->device().is_cuda())
    throw UsageError("sparse optimizer update of key " + std::to_string(key) +
                     ": row_sparse weights live on the CPU (row_sparse values on devices are "
                     "not supported; keep the table on the CPU)");
  const int64_t R = weight->size() / row_size;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= R || (i && ids[i] <= ids[i - 1]))
      throw KeyError("sparse optimizer update of key " + std::to_string(key) +
                     ": row ids must be ascending, unique and below " + std::to_string(R));
  const bool lazy = rule_->lazy_rows && rule_->lazy_rows(cfg_);
  if (!lazy || cfg_.sum_keys.count(ParamKey(key))) {
    // The dense rule (or the sum-key assignment) with zeros in the other rows.
    NDArray dense(Shape{weight->size()}, grad_rows.dtype());
    NDArray rows = grad_rows.Reshape({grad_rows.size()});
    const size_t rb = static_cast<size_t>(row_size) * DTypeSize(grad_rows.dtype());
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(dense.raw()) + static_cast<size_t>(ids[i]) * rb,
                  static_cast<const char*>(rows.raw()) + static_cast<size_t>(i) * rb, rb);
    return Update(key, dense, weight, schedule_at);
  }
  auto [st, lr, wd, t] = BeginStep(key, *weight, schedule_at);
  const UpdateStep step{lr, wd, t};
  const auto update = rule_->update;
  NDArray g32 =
      grad_rows.dtype() == DType::kFloat32 ? grad_rows : grad_rows.AsType(DType::kFloat32);
  const float* g = g32.data<float>();
  std::vector<float*> slots(st->slots.size());
  NDArray w32;  // one row in float32, for low-precision weights without a master copy
  if (st->master.empty() && weight->dtype() != DType::kFloat32)
    w32 = NDArray(Shape{row_size}, DType::kFloat32);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t off = ids[i] * row_size;
    for (size_t s = 0; s < slots.size(); ++s) slots[s] = st->slots[s].data<float>() + off;
    const float* gi = g + i * row_size;
    NDArray wrow = weight->Reshape({weight->size()}).Slice1D(off, row_size);
    if (!st->master.empty()) {
      float* m = st->master.data<float>() + off;
      update(cfg_, step, gi, m, slots.data(), row_size);
      wrow.CopyFrom(NDArray::Wrap(m, {row_size}, DType::kFloat32));
    } else if (weight->dtype() == DType::kFloat32) {
      update(cfg_, step, gi, wrow.data<float>(), slots.data(), row_size);
    } else {
      w32.CopyFrom(wrow);
      update(cfg_, step, gi, w32.data<float>(), slots.data(), row_size);
      wrow.CopyFrom(w32);
    }
  }
}

int64_t Optimizer::UpdateCount(int64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? 0 : it->second->t;
}

// The blob's format: kvstore/states_file.h.
std::string Optimizer::SaveStates(bool dump_optimizer) const {
  std::lock_guard<std::mutex> lk(mu_);
  states::Blob b;
  b.dumped = dump_optimizer;
  b.config = cfg_.Serialize();
  b.num_update = num_update_;
  b.keys.reserve(states_.size());
  for (auto& [key, st] : states_) {
    // States on a device are written from host copies.
    std::vector<NDArray> slots;
    for (auto& sl : st->slots) slots.push_back(sl.device().is_cuda() ? sl.To(Device::CPU()) : sl);
    NDArray master = !st->master.empty() && st->master.device().is_cuda()
                         ? st->master.To(Device::CPU())
                         : st->master;
    b.keys.push_back({key, st->t, std::move(slots), std::move(master)});
  }
  return states::EncodeBlob(b);  // under mu_: one consistent snapshot
}

void Optimizer::LoadStates(const std::string& blob, const WeightInfo& weights) {
  states::Blob b = states::DecodeBlob(blob);
  OptimizerConfig saved = OptimizerConfig::Deserialize(b.config);
  if (!b.dumped && saved.type != cfg_.type)
    throw UsageError("optimizer states were saved by '" + saved.type + "' but this store runs '" +
                     cfg_.type + "'");
  const OptimizerConfig& kind = b.dumped ? saved : cfg_;
  const UpdateRule* kind_rule = FindUpdateRule(kind.type);  // non-null: both were validated
  const int num_slots = kind_rule->slots(kind);
  std::map<int64_t, std::unique_ptr<State>> states;
  for (states::KeyStates& k : b.keys) {
    const int64_t key = k.key;
    const size_t ns = k.slots.size();
    if (ns != static_cast<size_t>(num_slots))
      throw IOError("optimizer states: key " + std::to_string(key) + " has " + std::to_string(ns) +
                    " state buffers, expected " + std::to_string(num_slots));
    auto st = std::make_unique<State>();
    st->t = k.t;
    st->slots = std::move(k.slots);
    st->master = std::move(k.master);
    if (weights) {
      auto [n, low] = weights(key);
      if (n < 0)
        throw KeyError("optimizer states: key " + std::to_string(key) +
                       " is not held here (states saved from another model or job layout?)");
      for (auto& s : st->slots)
        if (s.size() != n)
          throw ShapeError("optimizer states: key " + std::to_string(key) + " has a state of " +
                           std::to_string(s.size()) + " elements but the weight has " +
                           std::to_string(n) + " (states saved from another model?)");
      if (!st->master.empty() && (st->master.size() != n || !low))
        throw ShapeError("optimizer states: key " + std::to_string(key) +
                         " has a float32 master copy of " + std::to_string(st->master.size()) +
                         " elements but the weight has " + std::to_string(n) +
                         (low ? "" : " and is not low precision") +
                         " (states saved from another model?)");
    }
    states[key] = std::move(st);
  }
  std::lock_guard<std::mutex> lk(mu_);
  states_ = std::move(states);
  num_update_ = b.num_update;
  if (b.dumped) {
    cfg_ = std::move(saved);
    rule_ = kind_rule;
  }
}

void MarkStatesDumped(std::string* blob) {
  states::MarkDumped(blob);
}

}  // namespace pskv
