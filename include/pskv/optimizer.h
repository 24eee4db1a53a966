// Optimizers run by a KVStore (locally, or on the servers of a dist store).
//
// An optimizer is configured by OptimizerConfig, which is plain data: dist stores
// send its fields to every server (a binary payload of the control schema); its text
// form ("type=sgd\nlearning_rate=0.1\n...") is for users and saved states. No code is
// ever shipped (MXNet pickled Python objects).
//
// Update rules (g = clip(rescale_grad * grad, clip_gradient); t = this key's
// update count starting at 1; lr = the schedule's rate at the optimizer-wide update
// count, which is the largest t over all keys, as in MXNet):
//   sgd      momentum=0: w -= lr * (g + wd*w)
//            momentum>0: m = momentum*m - lr*(g + wd*w);  w += m
//   nag      g' = g + wd*w;  m = momentum*m + g';  w -= lr*(g' + momentum*m)
//   adam     g' = g + wd*w;  m = b1*m + (1-b1)*g';  v = b2*v + (1-b2)*g'^2
//            w -= lr*sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v)+eps)
//   adamw    (decoupled weight decay, Loshchilov & Hutter)
//            m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//            w -= lr*( (m/(1-b1^t)) / (sqrt(v/(1-b2^t))+eps) + wd*w )
//   rmsprop  g' = g + wd*w;  n = rho*n + (1-rho)*g'^2;  w -= lr*g'/(sqrt(n)+eps)
//            centered: a = rho*a + (1-rho)*g';  d = momentum*d - lr*g'/sqrt(n - a^2 + eps); w += d
//   adagrad  h += g^2;  w -= lr*(g/sqrt(h+eps) + wd*w)
// Row-sparse gradients (UpdateRows; MXNet's lazy_update): sgd and adam with
// `lazy_update=true` (the default, as in MXNet) and adagrad (always, as MXNet's
// sparse AdaGrad) apply the rule above to the pushed rows only — weight decay,
// momentum and moments of the other rows stay as they are. Every other case runs
// the dense rule on the whole table with a gradient that is zero in the other rows.
// Multi-precision (`multi_precision=true`): float16/bfloat16 weights get a float32
// master copy in the state; the update runs on the master and is cast back.
// More rules can be registered by name (pskv/update_rule.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "pskv/ndarray.h"

namespace pskv {

struct UpdateRule;

/// Learning-rate schedule (MXNet's lr_scheduler module). `num_update` counts from 1.
struct LRSchedule {
  /// "none", "factor", "multifactor" or "cosine".
  std::string type = "none";
  int64_t step = 1;              ///< factor: multiply by `factor` every `step` updates
  std::vector<int64_t> steps;    ///< multifactor: multiply by `factor` after each
  double factor = 1.0;           ///< factor, multifactor
  double stop_factor_lr = 1e-8;  ///< factor: lower bound of the rate
  int64_t max_update = 0;        ///< cosine: updates until `final_lr` is reached
  double final_lr = 0.0;         ///< cosine
  int64_t warmup_steps = 0;      ///< all: linear warm-up over this many updates
  double warmup_begin_lr = 0.0;  ///< all: rate at update 0 of the warm-up

  /// Learning rate at update `num_update` given the optimizer's base rate.
  double Rate(double base_lr, int64_t num_update) const;
};

/// One parameter OptimizerConfig::FromParams takes, described for users (Python's
/// list of parameters, messages).
struct OptimizerParamInfo {
  std::string name;
  std::string alias;          ///< MXNet's other name, or empty
  std::string type;           ///< "float", "int", "bool", "string", "ints", "key:float", "keys"
  std::string default_value;  ///< in the text form
  std::string range;          ///< "must be in [0, 1)", or empty
  std::string doc;
};

/// The fields are listed once, with names, ranges and docs, in one table
/// (src/kvstore/optimizer_fields.h) that drives the text form, the dist payload,
/// Validate and Params(); the defaults are the initialisers below.
struct OptimizerConfig {
  /// sgd, nag, adam, adamw, rmsprop, adagrad, or a type registered with
  /// RegisterUpdateRule (pskv/update_rule.h)
  std::string type = "sgd";
  double learning_rate = 0.01;
  double wd = 0.0;
  double rescale_grad = 1.0;
  double clip_gradient = -1.0;  ///< <= 0: no clipping
  double momentum = 0.0;        ///< sgd, nag, centered rmsprop
  double beta1 = 0.9;           ///< adam, adamw
  double beta2 = 0.999;         ///< adam, adamw
  double epsilon = 1e-8;        ///< adam, adamw, rmsprop, adagrad
  double rho = 0.9;             ///< rmsprop decay (MXNet's gamma1)
  bool centered = false;        ///< rmsprop
  bool multi_precision = false;
  bool lazy_update = true;  ///< sgd, adam: row-sparse gradients update their rows only
  LRSchedule lr_schedule;
  /// Per-key multipliers of the learning rate and of wd (Gluon's Parameter.lr_mult /
  /// wd_mult). They travel with the config, so they apply on dist servers too
  /// (MXNet dropped them there). Parameter form: "3:0.5,7:2".
  std::map<int64_t, double> lr_mult, wd_mult;
  /// Keys that are not parameters (e.g. BatchNorm buffers a Trainer keeps equal on
  /// every worker): no update rule, no state; the pushed sum becomes the stored
  /// value, as in a store without optimizer. Parameter form: "8,9,10".
  std::set<int64_t> sum_keys;
  /// Hyper-parameters that the rule of `type` declares itself (UpdateRule::params),
  /// by name; one that is not set has the rule's default. Parameter form: the name.
  std::map<std::string, double> rule_params;

  /// The value of the rule's parameter `name`: rule_params' or the rule's default.
  /// InvalidArgument if the rule of `type` declares no such parameter.
  double Param(const std::string& name) const;

  /// Text form, one `name=value` per line; round-trips exactly (doubles in %.17g).
  std::string Serialize() const;
  /// Parses Serialize()'s output; unknown names or bad values are InvalidArgument.
  static OptimizerConfig Deserialize(const std::string& text);
  /// The configuration of `type` with its rule's defaults (UpdateRule::field_defaults,
  /// e.g. adam's learning_rate 0.001); the initialisers above are those of sgd. Prefer
  /// it to setting `type` on a default-constructed config. InvalidArgument for an
  /// unknown type.
  static OptimizerConfig For(const std::string& type);
  /// Builds a config from string parameters (Python kwargs, CLI), starting from
  /// For(type): names as the
  /// fields above, plus `lr_scheduler`, `lr_step`, `lr_steps` ("10,20"), `lr_factor`,
  /// `max_update`, `final_lr`, `warmup_steps`, `warmup_begin_lr`.
  static OptimizerConfig FromParams(const std::string& type,
                                    const std::map<std::string, std::string>& params);
  /// Throws InvalidArgument for an unknown type or out-of-range hyper-parameter.
  void Validate() const;
  /// The parameters FromParams takes for `type`, with For(type)'s defaults: the shared
  /// fields in the order of the text form, then the parameters of the rule of `type`
  /// (none for "").
  static std::vector<OptimizerParamInfo> Params(const std::string& type = "");
  /// The optimizer types that can run here: the built-in ones, then the registered.
  static std::vector<std::string> Types();
};

/// Per-key optimizer state plus the update rule. Thread-safe: updates of different
/// keys may run concurrently; updates of one key must be serialised by the caller
/// (the KVStore guarantees this).
class Optimizer {
 public:
  explicit Optimizer(OptimizerConfig cfg);
  const OptimizerConfig& config() const { return cfg_; }

  /// Applies one update for `key`: `weight` is updated in place from `grad`
  /// (same element count; grad is converted to float32 if needed). A key
  /// (c << 32) | k with c >= 1 (a dist server's chunk c of key k) has its own state
  /// and k's lr_mult, wd_mult and sum_keys entry.
  ///
  /// A weight on a device is updated there (its states live with it) by the built-in
  /// rule's device kernel, bit-identical to the CPU's update (docs/gpu.md); a registered
  /// rule runs on the CPU only (UsageError for a device weight).
  ///
  /// `schedule_at` (optional) pins the learning-rate schedule: when it points at 0,
  /// the update uses the optimizer-wide update count as usual and stores that count
  /// there; when it points at n > 0, the update's rate is the schedule's at n and the
  /// optimizer-wide count becomes at least n. A replica of a dist server repeats its
  /// primary's updates this way with the primary's rates, whatever order its keys'
  /// updates interleave in (docs/fault-tolerance.md). A sum key leaves it unchanged.
  void Update(int64_t key, const NDArray& grad, NDArray* weight, int64_t* schedule_at = nullptr);
  /// Applies one update for `key` from a row-sparse gradient: `grad_rows` holds
  /// n rows of `row_size` elements for the ascending, unique row ids `ids` of
  /// `weight` (a table of rows of `row_size` elements). See the header comment for
  /// which rows change. Counts as one update of the key (Adam's bias correction).
  /// `schedule_at`: as for Update.
  void UpdateRows(int64_t key, const int64_t* ids, int64_t n, const NDArray& grad_rows,
                  int64_t row_size, NDArray* weight, int64_t* schedule_at = nullptr);

  /// Serialises all per-key states (and the config) to bytes / restores them.
  /// LoadStates keeps this optimizer's configuration, unless the blob was saved
  /// with `dump_optimizer` (MXNet's save_optimizer_states(dump_optimizer=True)):
  /// then the saved configuration (learning rate, ...) replaces it.
  std::string SaveStates(bool dump_optimizer = false) const;
  /// For LoadStates: the weight of `key` as (element count, low precision), or
  /// element count -1 when there is no such key.
  using WeightInfo = std::function<std::pair<int64_t, bool>(int64_t key)>;
  /// Restores states saved by SaveStates. With `weights`, every state buffer (the
  /// multi-precision float32 master copy included) is checked against the weight it
  /// will update, and states of unknown keys are refused: ShapeError / KeyError
  /// naming the key, nothing loaded. Without it the sizes are checked at the first
  /// update of each key.
  void LoadStates(const std::string& blob, const WeightInfo& weights = {});
  /// The configuration in use (after a LoadStates of a dumped blob: the saved one).
  OptimizerConfig CurrentConfig() const {
    std::lock_guard<std::mutex> lk(mu_);
    return cfg_;
  }
  /// Number of updates applied to `key` so far (0 if never).
  int64_t UpdateCount(int64_t key) const;

 private:
  struct State {
    int64_t t = 0;
    std::vector<NDArray> slots;  // float32 buffers; meaning depends on the type
    NDArray master;              // float32 master weight (multi-precision), or empty
  };
  State& GetState(int64_t key, const NDArray& weight);
  /// One update's state, step count and rates (lr/wd with their per-key multipliers).
  struct Step {
    State* state = nullptr;
    double lr = 0, wd = 0;
    int64_t t = 0;
  };
  Step BeginStep(int64_t key, const NDArray& weight, int64_t* schedule_at);
  /// Update for a weight on a device (the built-in rules' device kernels).
  void UpdateOnDevice(int64_t key, const NDArray& grad, NDArray* weight, int64_t* schedule_at);

  OptimizerConfig cfg_;
  const UpdateRule* rule_ = nullptr;  ///< of cfg_.type (pskv/update_rule.h)
  mutable std::mutex mu_;
  std::map<int64_t, std::unique_ptr<State>> states_;
  int64_t num_update_ = 0;
};

/// Turns a SaveStates() blob into a dumped one (for states gathered from servers).
void MarkStatesDumped(std::string* blob);

/// The optimizer configuration saved in states file `fname` with dump_optimizer
/// (KVStore::SaveOptimizerStates(fname, true), Trainer::SaveStates): of the file's
/// one blob, or of a dist store's file the first server's. nullopt when the file
/// carries none. Checks the file's checksum (reading it once, keeping only the text);
/// IOError naming the file if it cannot be read, is not a states file, is cut short
/// or corrupt.
std::optional<OptimizerConfig> ReadDumpedOptimizerConfig(const std::string& fname);

/// Writes a SaveStates() blob to states file `fname` as KVStore::SaveOptimizerStates
/// does: with a checksum (CRC32C), to a temporary file renamed once complete.
/// IOError naming the file if it cannot be written.
void WriteOptimizerStatesFile(const std::string& fname, const std::string& blob);
/// The blob in states file `fname` (for LoadStates), its checksum checked. IOError
/// naming the file if it cannot be read, is not a states file, is cut short or its
/// checksum does not match (corrupt).
std::string ReadOptimizerStatesFile(const std::string& fname);

}  // namespace pskv
