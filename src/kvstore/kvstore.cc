// KVStore base class: key kinds, string-key ids, argument checks common to every
// store type, optimizer plumbing, and the factory.
#include "pskv/kvstore.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <unordered_map>

#include "kvstore/kvstore_dist.h"
#include "kvstore/kvstore_local.h"
#include "pskv/error.h"

namespace pskv {

// ------------------------------------------------------------ CompressionConfig

CompressionConfig CompressionConfig::FromParams(const std::map<std::string, std::string>& params) {
  CompressionConfig c;
  bool has_type = false;
  for (auto& [k, v] : params) {
    if (k == "type") {
      c.type = v;
      has_type = true;
    } else if (k == "threshold") {
      char* end = nullptr;
      double t = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0')
        throw InvalidArgument("gradient compression threshold '" + v + "' is not a number");
      c.threshold = static_cast<float>(t);
    } else {
      throw InvalidArgument("unknown gradient compression parameter '" + k +
                            "'; valid: type, threshold");
    }
  }
  if (!has_type)
    throw InvalidArgument("gradient compression parameters need a 'type' (\"2bit\" or \"1bit\")");
  c.Validate();
  return c;
}

void CompressionConfig::Validate() const {
  if (type != "none" && type != "2bit" && type != "1bit")
    throw InvalidArgument("Unknown type for gradient compression '" + type +
                          "'; valid: 2bit, 1bit, none");
  if (type == "2bit" && !(threshold > 0))
    throw InvalidArgument("threshold must be greater than 0 for two bit compression (got " +
                          std::to_string(threshold) + ")");
  if (!std::isfinite(threshold))
    throw InvalidArgument("gradient compression threshold must be finite");
}

// ------------------------------------------------------------ key table

struct KVStore::KeyTable {
  KeyKind kind = KeyKind::kUnset;
  std::mutex mu;
  std::unordered_map<std::string, int> ids;
  std::vector<std::string> names;
};

KVStore::KVStore(std::string type, Options options)
    : type_(std::move(type)), options_(std::move(options)), table_(std::make_unique<KeyTable>()) {}

KVStore::~KVStore() = default;

void KVStore::UseKind(KeyKind k) {
  std::lock_guard<std::mutex> lk(table_->mu);
  if (table_->kind == KeyKind::kUnset) table_->kind = k;
  if (table_->kind != k)
    throw KeyError(std::string("Mixed key types are not allowed: this store already uses ") +
                   (table_->kind == KeyKind::kInt ? "int" : "string") +
                   " keys; use one kind of key for the whole life of a store");
}

std::vector<int> KVStore::CheckIntKeys(const std::vector<int>& keys) {
  UseKind(KeyKind::kInt);
  for (int k : keys)
    if (k < 0) throw KeyError("key " + std::to_string(k) + " is negative; int keys must be >= 0");
  return keys;
}

std::vector<int> KVStore::MapKeys(const std::vector<std::string>& keys, bool create) {
  UseKind(KeyKind::kString);
  std::vector<int> out;
  out.reserve(keys.size());
  std::vector<std::pair<std::string, int>> created;
  {
    std::lock_guard<std::mutex> lk(table_->mu);
    for (const auto& s : keys) {
      auto it = table_->ids.find(s);
      if (it != table_->ids.end()) {
        out.push_back(it->second);
      } else if (create) {
        int id = static_cast<int>(table_->names.size());
        table_->ids.emplace(s, id);
        table_->names.push_back(s);
        created.emplace_back(s, id);
        out.push_back(id);
      } else {
        throw KeyError("key '" + s + "' doesn't exist. Did you init?");
      }
    }
  }
  for (auto& [s, id] : created) OnStringKeyCreated(s, id);
  return out;
}

std::string KVStore::KeyName(int k) const {
  std::lock_guard<std::mutex> lk(table_->mu);
  if (table_->kind == KeyKind::kString && k >= 0 && k < static_cast<int>(table_->names.size()))
    return "'" + table_->names[static_cast<size_t>(k)] + "'";
  return std::to_string(k);
}

// ------------------------------------------------------------ int-key API

namespace {
// Runs Broadcast's Init, explaining a duplicate init in Broadcast's terms.
template <typename F>
void InitForBroadcast(F&& init) {
  try {
    init();
  } catch (const KeyError& e) {
    throw KeyError(std::string(e.what()) +
                   " (Broadcast initialises its keys: check for an earlier kv.init or "
                   "kv.broadcast of the same key)");
  }
}
}  // namespace

void KVStore::Init(int key, const NDArray& value) {
  Init(std::vector<int>{key}, {value});
}
void KVStore::Init(const std::vector<int>& keys, const std::vector<NDArray>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument("Init: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  InitImpl(CheckIntKeys(keys), values);
}
void KVStore::Push(int key, const std::vector<NDArray>& values, int priority) {
  Push(std::vector<int>(values.size(), key), values, priority);
}
void KVStore::Push(const std::vector<int>& keys, const std::vector<NDArray>& values, int priority) {
  if (keys.size() != values.size())
    throw InvalidArgument("Push: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  PushImpl(CheckIntKeys(keys), values, priority);
}
void KVStore::Pull(int key, const std::vector<NDArray>& outs, int priority) {
  Pull(std::vector<int>(outs.size(), key), outs, priority);
}
void KVStore::Pull(const std::vector<int>& keys, const std::vector<NDArray>& outs, int priority) {
  if (keys.size() != outs.size())
    throw InvalidArgument("Pull: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(outs.size()) + " outputs");
  if (outs.empty()) throw InvalidArgument("Pull needs at least one output array");
  PullImpl(CheckIntKeys(keys), outs, priority);
}
void KVStore::PushPull(int key, const std::vector<NDArray>& values,
                       const std::vector<NDArray>& outs, int priority) {
  const std::vector<NDArray>& o = outs.empty() ? values : outs;
  PushPull(std::vector<int>(values.size(), key), values, std::vector<int>(o.size(), key), o,
           priority);
}
void KVStore::PushPull(const std::vector<int>& keys, const std::vector<NDArray>& values,
                       const std::vector<int>& out_keys, const std::vector<NDArray>& outs,
                       int priority) {
  if (keys.size() != values.size() || out_keys.size() != outs.size())
    throw InvalidArgument(
        "PushPull: the number of keys and values (or out keys and outputs) differ");
  PushPullImpl(CheckIntKeys(keys), values, CheckIntKeys(out_keys), outs, priority);
}
void KVStore::Broadcast(int key, const NDArray& value, const std::vector<NDArray>& outs,
                        int priority) {
  Broadcast(std::vector<int>{key}, {value}, std::vector<int>(outs.size(), key), outs, priority);
}
void KVStore::Broadcast(const std::vector<int>& keys, const std::vector<NDArray>& values,
                        const std::vector<int>& out_keys, const std::vector<NDArray>& outs,
                        int priority) {
  InitForBroadcast([&] { Init(keys, values); });
  Pull(out_keys, outs, priority);
}

// ------------------------------------------------------------ string-key API

void KVStore::Init(const std::string& key, const NDArray& value) {
  Init(std::vector<std::string>{key}, {value});
}
void KVStore::Init(const std::vector<std::string>& keys, const std::vector<NDArray>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument("Init: the number of keys and values differ");
  InitImpl(MapKeys(keys, /*create=*/true), values);
}
void KVStore::Push(const std::string& key, const std::vector<NDArray>& values, int priority) {
  Push(std::vector<std::string>(values.size(), key), values, priority);
}
void KVStore::Push(const std::vector<std::string>& keys, const std::vector<NDArray>& values,
                   int priority) {
  if (keys.size() != values.size())
    throw InvalidArgument("Push: the number of keys and values differ");
  PushImpl(MapKeys(keys, false), values, priority);
}
void KVStore::Pull(const std::string& key, const std::vector<NDArray>& outs, int priority) {
  Pull(std::vector<std::string>(outs.size(), key), outs, priority);
}
void KVStore::Pull(const std::vector<std::string>& keys, const std::vector<NDArray>& outs,
                   int priority) {
  if (keys.size() != outs.size())
    throw InvalidArgument("Pull: the number of keys and outputs differ");
  if (outs.empty()) throw InvalidArgument("Pull needs at least one output array");
  PullImpl(MapKeys(keys, false), outs, priority);
}
void KVStore::PushPull(const std::string& key, const std::vector<NDArray>& values,
                       const std::vector<NDArray>& outs, int priority) {
  const std::vector<NDArray>& o = outs.empty() ? values : outs;
  PushPull(std::vector<std::string>(values.size(), key), values,
           std::vector<std::string>(o.size(), key), o, priority);
}
void KVStore::PushPull(const std::vector<std::string>& keys, const std::vector<NDArray>& values,
                       const std::vector<std::string>& out_keys, const std::vector<NDArray>& outs,
                       int priority) {
  if (keys.size() != values.size() || out_keys.size() != outs.size())
    throw InvalidArgument(
        "PushPull: the number of keys and values (or out keys and outputs) differ");
  PushPullImpl(MapKeys(keys, false), values, MapKeys(out_keys, false), outs, priority);
}
void KVStore::Broadcast(const std::string& key, const NDArray& value,
                        const std::vector<NDArray>& outs, int priority) {
  InitForBroadcast([&] { Init(key, value); });
  Pull(key, outs, priority);
}

// ------------------------------------------------------------ row_sparse keys

void KVStore::Init(int key, const RowSparseNDArray& value) {
  if (value.empty())
    throw InvalidArgument("Init of key " + std::to_string(key) +
                          " with an empty RowSparseNDArray handle");
  InitRowSparseImpl(CheckIntKeys({key})[0], value);
}
void KVStore::Init(const std::string& key, const RowSparseNDArray& value) {
  if (value.empty())
    throw InvalidArgument("Init of key '" + key + "' with an empty RowSparseNDArray handle");
  InitRowSparseImpl(MapKeys({key}, /*create=*/true)[0], value);
}
void KVStore::Push(int key, const std::vector<RowSparseNDArray>& values, int priority) {
  if (values.empty())
    throw InvalidArgument("Push of key " + std::to_string(key) + " without values");
  for (auto& v : values)
    if (v.empty())
      throw InvalidArgument("Push of key " + std::to_string(key) +
                            " with an empty RowSparseNDArray handle");
  PushRowSparseImpl(CheckIntKeys({key})[0], values, priority);
}
void KVStore::Push(const std::string& key, const std::vector<RowSparseNDArray>& values,
                   int priority) {
  if (values.empty()) throw InvalidArgument("Push of key '" + key + "' without values");
  for (auto& v : values)
    if (v.empty())
      throw InvalidArgument("Push of key '" + key + "' with an empty RowSparseNDArray handle");
  PushRowSparseImpl(MapKeys({key}, false)[0], values, priority);
}

namespace {
std::vector<NDArray> MatchRowIds(const std::string& key, size_t outs,
                                 const std::vector<NDArray>& row_ids) {
  if (outs == 0)
    throw InvalidArgument("RowSparsePull of key " + key + " needs at least one output");
  if (row_ids.size() == 1) return std::vector<NDArray>(outs, row_ids[0]);
  if (row_ids.size() != outs)
    throw InvalidArgument("RowSparsePull of key " + key + ": the number of row_ids (" +
                          std::to_string(row_ids.size()) +
                          ") doesn't match the number of values (" + std::to_string(outs) +
                          "); give one row_ids array per output, or one for all");
  return row_ids;
}
}  // namespace

void KVStore::RowSparsePull(int key, const std::vector<RowSparseNDArray>& outs,
                            const std::vector<NDArray>& row_ids, int priority) {
  auto ids = MatchRowIds(std::to_string(key), outs.size(), row_ids);
  for (auto& o : outs)
    if (o.empty())
      throw InvalidArgument("RowSparsePull of key " + std::to_string(key) +
                            " into an empty RowSparseNDArray handle");
  RowSparsePullImpl(CheckIntKeys({key})[0], outs, ids, priority);
}
void KVStore::RowSparsePull(const std::string& key, const std::vector<RowSparseNDArray>& outs,
                            const std::vector<NDArray>& row_ids, int priority) {
  auto ids = MatchRowIds("'" + key + "'", outs.size(), row_ids);
  for (auto& o : outs)
    if (o.empty())
      throw InvalidArgument("RowSparsePull of key '" + key +
                            "' into an empty RowSparseNDArray handle");
  RowSparsePullImpl(MapKeys({key}, false)[0], outs, ids, priority);
}

void KVStore::InitRowSparseImpl(int, const RowSparseNDArray&) {
  throw UsageError("kvstore type '" + type_ + "' does not support row_sparse keys");
}
void KVStore::PushRowSparseImpl(int, const std::vector<RowSparseNDArray>&, int) {
  throw UsageError("kvstore type '" + type_ + "' does not support row_sparse keys");
}
void KVStore::RowSparsePullImpl(int, const std::vector<RowSparseNDArray>&,
                                const std::vector<NDArray>&, int) {
  throw UsageError("kvstore type '" + type_ + "' does not support row_sparse keys");
}

void KVStore::Wait(const std::vector<int>& keys, std::chrono::milliseconds timeout) {
  std::vector<int> k = CheckIntKeys(keys);
  WaitImpl(&k, timeout.count() > 0 ? timeout : options_.op_timeout);
}
void KVStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<int> k = MapKeys(keys, false);
  WaitImpl(&k, timeout.count() > 0 ? timeout : options_.op_timeout);
}
void KVStore::WaitAll(std::chrono::milliseconds timeout) {
  WaitImpl(nullptr, timeout.count() > 0 ? timeout : options_.op_timeout);
}

// ------------------------------------------------------------ updaters, optimizer

void KVStore::SetUpdater(Updater updater) {
  if (!updater) throw InvalidArgument("SetUpdater: empty updater");
  SetUpdaterImpl(std::move(updater));
}

void KVStore::SetUpdater(StrUpdater updater) {
  if (!updater) throw InvalidArgument("SetUpdater: empty updater");
  KeyTable* table = table_.get();
  SetUpdaterImpl([table, fn = std::move(updater)](int key, const NDArray& recv, NDArray* stored) {
    std::string name;
    {
      std::lock_guard<std::mutex> lk(table->mu);
      if (table->kind != KeyKind::kString || key < 0 ||
          key >= static_cast<int>(table->names.size()))
        throw UsageError("a string-key updater was called for int key " + std::to_string(key) +
                         "; install an int-key updater for int keys");
      name = table->names[static_cast<size_t>(key)];
    }
    fn(name, recv, stored);
  });
}

void KVStore::SetOptimizer(const OptimizerConfig& config) {
  auto opt = std::make_shared<Optimizer>(config);
  optimizer_ = opt;
  SetUpdaterImpl(
      [opt](int key, const NDArray& grad, NDArray* weight) { opt->Update(key, grad, weight); });
}

void KVStore::SetGradientCompression(const CompressionConfig&) {
  throw UsageError("Gradient compression is not supported for kvstore type '" + type_ +
                   "'; use 'device' or a dist type");
}

void KVStore::SaveOptimizerStates(const std::string& fname, bool dump_optimizer) {
  if (!optimizer_)
    throw UsageError(
        "Cannot save optimizer states: no optimizer is set on this store "
        "(call SetOptimizer first)");
  WaitAll();
  WriteOptimizerStatesFile(fname, optimizer_->SaveStates(dump_optimizer));
}

void KVStore::LoadOptimizerStates(const std::string& fname) {
  if (!optimizer_)
    throw UsageError(
        "Cannot load optimizer states: no optimizer is set on this store "
        "(call SetOptimizer with the same optimizer first)");
  const std::string blob = ReadOptimizerStatesFile(fname);
  WaitAll();
  optimizer_->LoadStates(blob);
}

// ------------------------------------------------------------ factory

std::unique_ptr<KVStore> KVStore::Create(const std::string& type) {
  return Create(type, Options::FromEnv());
}

}  // namespace pskv
