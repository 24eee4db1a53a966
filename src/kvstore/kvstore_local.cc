#include "kvstore/kvstore_local.h"

#include "common/observe.h"
#include "kvstore/kvstore_common.h"
#include "pskv/error.h"
#include "sparse/sparse_ops.h"

namespace pskv {

KVStoreLocal::KVStoreLocal(std::string type, Options options, bool device)
    : KVStore(std::move(type), std::move(options)),
      device_(device),
      reducer_(options_.bigarray_bound, options_.reduction_threads) {}

KVStoreLocal::~KVStoreLocal() {
  engine_.Shutdown(options_.op_timeout);
}

void KVStoreLocal::SetGradientCompression(const CompressionConfig& config) {
  if (!device_) KVStore::SetGradientCompression(config);  // throws: `local` rejects it
  config.Validate();
  std::lock_guard<std::mutex> lk(meta_mu_);
  if (!store_.empty())
    throw UsageError("SetGradientCompression must be called before the first Init");
  compressor_ = config.active() ? std::make_unique<GradientCompressor>(config) : nullptr;
}

KVStoreLocal::Entry& KVStoreLocal::Lookup(int key, const char* op) {
  auto it = store_.find(key);
  if (it == store_.end())
    throw KeyError(std::string(op) + ": key " + KeyName(key) +
                   " has not been inited (call Init first)");
  return *it->second;
}

void KVStoreLocal::InitImpl(const std::vector<int>& keys, const std::vector<NDArray>& values) {
  std::lock_guard<std::mutex> lk(meta_mu_);
  CheckNewKeys(
      keys, values, compressor_ != nullptr, [&](int k) { return store_.count(k) > 0; },
      [&](int k) { return KeyName(k); });
  for (size_t i = 0; i < keys.size(); ++i) {
    auto e = std::make_unique<Entry>();
    // A copy taken now (later changes to the argument don't leak in), on the host: a
    // `device` store moves it to the key's home device at the first device push.
    e->value = values[i].device().is_cuda() ? values[i].To(Device::CPU()) : values[i].Clone();
    store_.emplace(keys[i], std::move(e));
  }
}

void KVStoreLocal::CheckPush(const std::map<int, std::vector<NDArray>>& groups) {
  for (auto& [k, vals] : groups) {
    Entry& e = Lookup(k, "Push");
    if (e.sparse) throw DenseUseOfSparseKey("Push of a dense value", KeyName(k));
    for (auto& v : vals)
      CheckMatches(v, e.value.shape(), e.value.dtype(), "pushed value", KeyName(k));
    if (compressor_ && AnyOnDevice(vals))
      throw UsageError("Push of key " + KeyName(k) +
                       ": gradient compression quantises on the CPU and does not take values "
                       "on devices; push CPU values or turn compression off");
  }
}

void KVStoreLocal::PlaceKeys(const std::map<int, std::vector<NDArray>>& groups) {
  if (!device_) return;
  std::vector<Placement::Request> requests;
  for (auto& [k, vals] : groups) {
    Entry& e = Lookup(k, "Push");
    if (e.dev.home >= 0 || !AnyOnDevice(vals)) continue;
    Placement::Request r{k, e.value.nbytes(), {}};
    for (auto& v : vals)
      if (v.device().is_cuda()) r.devices.push_back(v.device().id);
    requests.push_back(std::move(r));
  }
  if (requests.empty()) return;
  for (auto& [k, home] : placement_.Place(std::move(requests))) Lookup(k, "Push").dev.home = home;
}

void KVStoreLocal::CheckPull(const std::map<int, std::vector<NDArray>>& groups) {
  for (auto& [k, outs] : groups) {
    Entry& e = Lookup(k, "Pull");
    if (e.sparse) throw DenseUseOfSparseKey("Pull", KeyName(k));
    for (auto& o : outs)
      CheckMatches(o, e.value.shape(), e.value.dtype(), "pull output", KeyName(k));
  }
}

NDArray KVStoreLocal::Reduce(Entry& e, const std::vector<NDArray>& values) {
  if (compressor_) {
    // Every source is quantised with its own residual, then dequantised and summed.
    const int64_t n = e.value.size();
    if (e.merge.empty()) e.merge = NDArray(e.value.shape(), DType::kFloat32);
    while (e.residuals.size() < values.size())
      e.residuals.emplace_back(e.value.shape(), DType::kFloat32);
    e.packed.resize(static_cast<size_t>(compressor_->CompressedBytes(n)));
    e.merge.Fill(0);
    for (size_t d = 0; d < values.size(); ++d) {
      compressor_->Quantize(values[d].data<float>(), e.residuals[d].data<float>(), e.packed.data(),
                            n);
      compressor_->DequantizeAdd(e.packed.data(), e.merge.data<float>(), n);
    }
    return e.merge;
  }
  if (e.dev.home >= 0) return ReduceOnDevice(e.dev, e.value, values);
  // Read-only use below: a single host source needs no copy.
  return ReduceOnHost(reducer_, values, &e.merge);
}

namespace {
// A timeline slice of device work (lane "device": copies, the sum, the update); the
// copy counters it moved are in the metrics (pskv_device_copy_bytes_total).
class DeviceSpan {
 public:
  DeviceSpan(const char* name, int key, bool on, uint64_t bytes)
      : name_(name), key_(key), bytes_(bytes), t0_(on && obs::Enabled() ? obs::NowUs() : 0) {}
  ~DeviceSpan() {
    if (t0_) obs::Span(name_, "device", std::to_string(key_), bytes_, t0_, obs::NowUs());
  }
  DeviceSpan(const DeviceSpan&) = delete;
  DeviceSpan& operator=(const DeviceSpan&) = delete;

 private:
  const char* name_;
  int key_;
  uint64_t bytes_;
  uint64_t t0_;
};
}  // namespace

void KVStoreLocal::DoPush(int key, Entry& e, const std::vector<NDArray>& values) {
  DeviceSpan span("device push", key, AnyOnDevice(values), e.value.nbytes() * values.size());
  NDArray merged = Reduce(e, values);
  std::shared_ptr<Updater> up;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    up = updater_;
  }
  if (e.dev.home >= 0) {
    std::shared_ptr<Optimizer> opt;
    {
      std::lock_guard<std::mutex> lk(meta_mu_);
      opt = sparse_optimizer_;
    }
    if (opt) {
      opt->Update(key, merged, &e.dev.weight);  // the built-in rule's device kernel
    } else if (up) {
      // A custom updater reads host memory: it gets host copies (counted d2h/h2d).
      NDArray grad = merged.To(Device::CPU());
      NDArray weight = e.dev.weight.To(Device::CPU());
      (*up)(key, grad, &weight);
      CopyToOutputs(weight, {e.dev.weight});
    } else {
      CopyToOutputs(merged, {e.dev.weight});  // ASSIGN
    }
    return;
  }
  if (up) {
    (*up)(key, merged, &e.value);
  } else {
    reducer_.Copy(merged, &e.value);  // ASSIGN; copies (MXNet aliased the input here)
  }
}

void KVStoreLocal::DoPull(Entry& e, const std::vector<NDArray>& outs) {
  if (e.dev.home >= 0) return CopyToOutputs(e.dev.weight, outs);
  if (!AnyOnDevice(outs)) {
    for (auto o : outs) reducer_.Copy(e.value, &o);
    return;
  }
  CopyToOutputs(e.value, outs);
}

void KVStoreLocal::PushImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                            int priority) {
  auto groups = GroupByKey(keys, values);
  std::vector<std::pair<int, Entry*>> entries;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    CheckPush(groups);
    PlaceKeys(groups);
    for (auto& [k, v] : groups) entries.emplace_back(k, &Lookup(k, "Push"));
  }
  for (auto& [k, e] : entries) {
    engine_.PushSync({k}, priority,
                     [this, k = k, e = e, vals = groups[k]] { DoPush(k, *e, vals); });
  }
}

void KVStoreLocal::PullImpl(const std::vector<int>& keys, const std::vector<NDArray>& outs,
                            int priority) {
  auto groups = GroupByKey(keys, outs);
  std::vector<std::pair<int, Entry*>> entries;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    CheckPull(groups);
    for (auto& [k, v] : groups) entries.emplace_back(k, &Lookup(k, "Pull"));
  }
  for (auto& [k, e] : entries) {
    engine_.PushSync({k}, priority, [this, e = e, dst = groups[k]] { DoPull(*e, dst); });
  }
}

void KVStoreLocal::PushPullImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                                const std::vector<int>& out_keys, const std::vector<NDArray>& outs,
                                int priority) {
  auto pushes = GroupByKey(keys, values);
  auto pulls = GroupByKey(out_keys, outs);
  std::vector<int> all;
  std::map<int, Entry*> entries;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    CheckPush(pushes);
    CheckPull(pulls);
    PlaceKeys(pushes);
    for (auto& [k, v] : pushes) entries[k] = &Lookup(k, "PushPull");
    for (auto& [k, v] : pulls) entries[k] = &Lookup(k, "PushPull");
  }
  for (auto& [k, e] : entries) all.push_back(k);
  // One operation over all keys: every push (which reads the inputs) runs before
  // any output is written, even when outputs alias inputs of other keys (as MXNet).
  engine_.PushSync(all, priority, [this, pushes, pulls, entries] {
    for (auto& [k, vals] : pushes) DoPush(k, *entries.at(k), vals);
    for (auto& [k, dst] : pulls) DoPull(*entries.at(k), dst);
  });
}

void KVStoreLocal::WaitImpl(const std::vector<int>* keys, std::chrono::milliseconds timeout) {
  engine_.Wait(keys, timeout);
}

void KVStoreLocal::SetUpdaterImpl(Updater updater) {
  auto up = std::make_shared<Updater>(std::move(updater));
  std::lock_guard<std::mutex> lk(meta_mu_);
  updater_ = up;
  sparse_optimizer_ = nullptr;
}

void KVStoreLocal::SetOptimizer(const OptimizerConfig& config) {
  KVStore::SetOptimizer(config);  // installs the optimizer's updater
  std::lock_guard<std::mutex> lk(meta_mu_);
  sparse_optimizer_ = optimizer_;
}

// ------------------------------------------------------------------ row_sparse

void KVStoreLocal::InitRowSparseImpl(int key, const RowSparseNDArray& value) {
  std::lock_guard<std::mutex> lk(meta_mu_);
  if (store_.count(key)) throw KeyError("duplicate init of key " + KeyName(key));
  if (compressor_) throw SparseWithCompression(KeyName(key));
  auto e = std::make_unique<Entry>();
  e->value = value.ToDense();  // a copy taken now
  e->sparse = true;
  e->row_size = value.RowSize();
  store_.emplace(key, std::move(e));
}

void KVStoreLocal::PushRowSparseImpl(int key, const std::vector<RowSparseNDArray>& values,
                                     int priority) {
  Entry* e;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    e = &Lookup(key, "Push");
    if (!e->sparse) throw SparseUseOfDenseKey("Push of a row_sparse value", KeyName(key));
    for (auto& v : values)
      CheckSparseMatches(v.shape(), v.dtype(), e->value.shape(), e->value.dtype(),
                         "pushed row_sparse value", KeyName(key));
  }
  engine_.PushSync({key}, priority, [this, key, e, values] {
    RowSparseNDArray merged = sparse::Sum(values);
    std::shared_ptr<Updater> up;
    std::shared_ptr<Optimizer> opt;
    {
      std::lock_guard<std::mutex> lk(meta_mu_);
      up = updater_;
      opt = sparse_optimizer_;
    }
    const int64_t* ids = merged.indices().data<int64_t>();
    if (opt) {
      opt->UpdateRows(key, ids, merged.nnz(), merged.data(), e->row_size, &e->value);
    } else if (up) {
      (*up)(key, merged.ToDense(), &e->value);
    } else {  // ASSIGN: the stored value becomes the sum
      e->value.Fill(0);
      sparse::Scatter(merged.data(), ids, merged.nnz(), e->row_size, &e->value, false);
    }
  });
}

void KVStoreLocal::RowSparsePullImpl(int key, const std::vector<RowSparseNDArray>& outs,
                                     const std::vector<NDArray>& row_ids, int priority) {
  Entry* e;
  std::vector<NDArray> ids;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    e = &Lookup(key, "RowSparsePull");
    if (!e->sparse) throw SparseUseOfDenseKey("RowSparsePull", KeyName(key));
    for (size_t i = 0; i < outs.size(); ++i) {
      CheckSparseMatches(outs[i].shape(), outs[i].dtype(), e->value.shape(), e->value.dtype(),
                         "row_sparse_pull output", KeyName(key));
      ids.push_back(CanonicalRowIds(row_ids[i], e->value.shape()[0]));
    }
  }
  engine_.PushSync({key}, priority, [e, outs, ids] {
    for (size_t i = 0; i < outs.size(); ++i) {
      NDArray rows = sparse::Gather(e->value, ids[i].data<int64_t>(), ids[i].size(), e->row_size);
      outs[i].Assign(RowSparseNDArray::FromRows(outs[i].shape(), ids[i], rows));
    }
  });
}

}  // namespace pskv
