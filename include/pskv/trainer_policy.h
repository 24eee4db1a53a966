// The framework-independent semantics of pskv's Trainers, written once.
//
// Two front ends train through a KVStore with Gluon's Trainer API: the libtorch
// pskv::Trainer (pskv/torch.h) and Python's pskv.torch.Trainer (bound as
// pskv._pskv). Both decide with the functions below where the optimizer runs, how
// the loss is scaled, and which optimizer configuration the store (or the local
// updater) runs, so they cannot disagree on those. tests/trainer_scenarios.json is
// one table of scenarios that tests/python/test_trainer_scenarios.py runs over
// both front ends, requiring identical weights, configurations and states files.
//
// Key layout of a Trainer: keys key_offset .. key_offset+P-1 are its P parameters
// (in order), the next B keys its buffers (kept equal to rank 0's). The buffers are
// `sum_keys` of the optimizer (the pushed value becomes the stored one).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "pskv/optimizer.h"

namespace pskv {

enum class LossReduction {
  kUnset,  ///< kSum if global_batch_size > 0; otherwise each step gives its batch size
  kMean,
  kSum,
};

/// What decides whether the store runs the optimizer (update_on_kvstore).
struct UpdatePlacement {
  std::optional<bool> requested;  ///< the caller's choice; nullopt: decide as below
  std::string store_type;         ///< KVStore::Type()
  /// MXNET_UPDATE_ON_KVSTORE as read by Options::FromEnv (Options::update_on_kvstore).
  bool env_default = true;
  /// The Trainer created the store from a type name (Python's kvstore='local');
  /// false when it was given a store.
  bool store_from_name = false;
  int devices = 1;            ///< replicas per worker
  int64_t largest_param = 0;  ///< elements of the largest parameter
  bool sparse_params = false;
};

/// MXNet's Gluon Trainer policy (mxnet/gluon/trainer.py `_init_kvstore` with
/// model.py `_create_kvstore`):
///  - sparse parameters: true (UsageError if false was requested: the store holds
///    the table and updates the pushed rows);
///  - requested: that (UsageError for false with an async store);
///  - otherwise env_default, except: false when the Trainer made a non-dist store
///    from its name for one device (MXNet uses no store then), or a "local" store
///    from its name with a parameter of more than 16M elements; true with an async
///    store.
bool ResolveUpdateOnKVStore(const UpdatePlacement& p);

/// The loss-scaling convention (pskv/torch.h): the summed gradients are multiplied
/// by 1/(workers*devices) (kMean), 1/global_batch_size (kSum), or 1/batch_size
/// given to each step. The scale known at construction travels inside the
/// optimizer's rescale_grad ("shipped"); a step whose scale differs multiplies the
/// gradients by the ratio before sending them.
class LossScale {
 public:
  /// global_batch_size 0: not given. InvalidArgument for a negative one, or one
  /// given with kMean.
  LossScale(LossReduction reduction, int64_t global_batch_size, int workers, int devices);
  LossReduction reduction() const { return reduction_; }
  /// The scale fixed at construction; 0 when every step gives its batch size.
  double scale() const { return scale_; }
  /// The factor the optimizer's own rescale_grad is multiplied by.
  double shipped() const { return shipped_; }
  /// The factor a step multiplies the gradients by before sending them, for the
  /// step's batch_size (0: none given). UsageError when the scale is unknown or a
  /// batch size is given with kMean; InvalidArgument for a negative batch_size.
  double Ratio(int64_t batch_size) const;

 private:
  LossReduction reduction_;
  double scale_ = 0;
  double shipped_ = 1;
};

/// The optimizer configuration a Trainer runs: `user` with its rescale_grad
/// multiplied by `shipped`, the multipliers by parameter index turned into
/// multipliers by key (`key_offset` + index; InvalidArgument for an index >=
/// num_params), and the `num_buffers` buffer keys as sum_keys. Validated.
OptimizerConfig TrainerOptimizerConfig(const OptimizerConfig& user, double shipped,
                                       int64_t key_offset, size_t num_params,
                                       const std::map<size_t, double>& lr_mult,
                                       const std::map<size_t, double>& wd_mult, size_t num_buffers);

}  // namespace pskv
