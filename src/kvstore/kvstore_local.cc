#include "kvstore/kvstore_local.h"

#include "kvstore/kvstore_common.h"
#include "pskv/error.h"

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
    e->value = values[i].Clone();  // a copy taken now: later changes to the argument don't leak in
    store_.emplace(keys[i], std::move(e));
  }
}

void KVStoreLocal::CheckPush(const std::map<int, std::vector<NDArray>>& groups) {
  for (auto& [k, vals] : groups) {
    Entry& e = Lookup(k, "Push");
    for (auto& v : vals)
      CheckMatches(v, e.value.shape(), e.value.dtype(), "pushed value", KeyName(k));
  }
}

void KVStoreLocal::CheckPull(const std::map<int, std::vector<NDArray>>& groups) {
  for (auto& [k, outs] : groups) {
    Entry& e = Lookup(k, "Pull");
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
  if (values.size() == 1) return values[0];  // read-only use below: no copy needed
  if (e.merge.empty()) e.merge = NDArray(e.value.shape(), e.value.dtype());
  reducer_.Sum(values, &e.merge);
  return e.merge;
}

void KVStoreLocal::DoPush(int key, Entry& e, const std::vector<NDArray>& values) {
  NDArray merged = Reduce(e, values);
  std::shared_ptr<Updater> up;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    up = updater_;
  }
  if (up) {
    (*up)(key, merged, &e.value);
  } else {
    reducer_.Copy(merged, &e.value);  // ASSIGN; copies (MXNet aliased the input here)
  }
}

void KVStoreLocal::PushImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                            int priority) {
  auto groups = GroupByKey(keys, values);
  std::vector<std::pair<int, Entry*>> entries;
  {
    std::lock_guard<std::mutex> lk(meta_mu_);
    CheckPush(groups);
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
    engine_.PushSync({k}, priority, [this, e = e, dst = groups[k]] {
      for (auto o : dst) reducer_.Copy(e->value, &o);
    });
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
    for (auto& [k, v] : pushes) entries[k] = &Lookup(k, "PushPull");
    for (auto& [k, v] : pulls) entries[k] = &Lookup(k, "PushPull");
  }
  for (auto& [k, e] : entries) all.push_back(k);
  // One operation over all keys: every push (which reads the inputs) runs before
  // any output is written, even when outputs alias inputs of other keys (spec 2.7).
  engine_.PushSync(all, priority, [this, pushes, pulls, entries] {
    for (auto& [k, vals] : pushes) DoPush(k, *entries.at(k), vals);
    for (auto& [k, dst] : pulls)
      for (auto o : dst) reducer_.Copy(entries.at(k)->value, &o);
  });
}

void KVStoreLocal::WaitImpl(const std::vector<int>* keys, std::chrono::milliseconds timeout) {
  engine_.Wait(keys, timeout);
}

void KVStoreLocal::SetUpdaterImpl(Updater updater) {
  auto up = std::make_shared<Updater>(std::move(updater));
  std::lock_guard<std::mutex> lk(meta_mu_);
  updater_ = up;
}

}  // namespace pskv
