#include "pskv/trainer_policy.h"
#include "pskv/store_type.h"

#include "pskv/error.h"

namespace pskv {

bool ResolveUpdateOnKVStore(const UpdatePlacement& p) {
  const StoreType type = StoreType::Parse(p.store_type);
  const bool dist = type.dist;
  const bool async = type.async;
  if (p.sparse_params) {
    if (p.requested == false)
      throw UsageError(
          "sparse parameters need update_on_kvstore=True: the store holds the table and updates "
          "only the pushed rows (MXNet does the same)");
    return true;
  }
  if (p.requested.has_value()) {
    if (async && !*p.requested)
      throw UsageError("Please set update_on_kvstore=True when training in async mode");
    return *p.requested;
  }
  bool uok = p.env_default;
  // MXNet's _create_kvstore: one device and no dist store given by name: no store at
  // all, so the workers update; a big "local" store from a name: local updates.
  constexpr int64_t kBigParam = int64_t{16} << 20;
  if (p.store_from_name && p.devices == 1 && !dist) uok = false;
  if (p.store_from_name && type.canonical == "local" && p.largest_param > kBigParam) uok = false;
  if (async) uok = true;
  return uok;
}

LossScale::LossScale(LossReduction reduction, int64_t global_batch_size, int workers, int devices)
    : reduction_(reduction) {
  if (global_batch_size < 0)
    throw InvalidArgument("global_batch_size must be > 0 (samples per step over all workers)");
  if (reduction_ == LossReduction::kUnset && global_batch_size > 0)
    reduction_ = LossReduction::kSum;
  if (reduction_ == LossReduction::kMean) {
    if (global_batch_size > 0)
      throw InvalidArgument(
          "global_batch_size is for loss_reduction 'sum'; with 'mean' the gradients are divided "
          "by the number of workers (and devices)");
    scale_ = 1.0 / (static_cast<double>(workers) * static_cast<double>(devices));
  } else if (global_batch_size > 0) {
    scale_ = 1.0 / static_cast<double>(global_batch_size);
  }
  shipped_ = scale_ > 0 ? scale_ : 1.0;
}

double LossScale::Ratio(int64_t batch_size) const {
  double scale = scale_;
  if (batch_size < 0) throw InvalidArgument("batch_size must be > 0");
  if (batch_size > 0) {
    if (reduction_ == LossReduction::kMean)
      throw UsageError(
          "a step's batch_size with loss_reduction 'mean': the gradients are already means; "
          "step without batch_size");
    scale = 1.0 / static_cast<double>(batch_size);
  } else if (scale == 0) {
    throw UsageError(
        "the loss scale is unknown: give the step a batch_size (Gluon; the summed gradients are "
        "divided by it), or construct the Trainer with loss_reduction 'mean' (mean losses) or "
        "global_batch_size (losses summed over the batch)");
  }
  return scale / shipped_;
}

OptimizerConfig TrainerOptimizerConfig(const OptimizerConfig& user, double shipped,
                                       int64_t key_offset, size_t num_params,
                                       const std::map<size_t, double>& lr_mult,
                                       const std::map<size_t, double>& wd_mult,
                                       size_t num_buffers) {
  OptimizerConfig cfg = user;
  cfg.rescale_grad = user.rescale_grad * shipped;
  cfg.lr_mult.clear();
  cfg.wd_mult.clear();
  for (auto [mults, out] : {std::pair{&lr_mult, &cfg.lr_mult}, std::pair{&wd_mult, &cfg.wd_mult}})
    for (auto& [i, x] : *mults) {
      if (i >= num_params)
        throw InvalidArgument("lr_mult/wd_mult of parameter " + std::to_string(i) +
                              ", but there are " + std::to_string(num_params) + " parameters");
      (*out)[key_offset + static_cast<int64_t>(i)] = x;
    }
  for (size_t j = 0; j < num_buffers; ++j)
    cfg.sum_keys.insert(key_offset + static_cast<int64_t>(num_params + j));
  cfg.Validate();
  return cfg;
}

}  // namespace pskv
