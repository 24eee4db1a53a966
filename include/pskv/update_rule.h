// Update rules of the optimizer, registered by name (OptimizerConfig::type).
//
// A rule says how many float32 state buffers a weight needs and applies one update
// to a run of float32 elements. Optimizer owns everything else: the states, the
// multi-precision master copies, the schedule, the per-key multipliers, sum keys,
// and the row loop of row-sparse gradients; it calls the rule once per key and
// update (once per row for a lazy row-sparse update), never per element.
//
// Adding an optimizer (docs/design.md, "Add an optimizer"; followed once in
// tests/kvstore/test_optimizer_add.cc): write one file with the rule's functions and
//   RegisterUpdateRule("name", {slots, update, lazy_rows, {{"param", default, ...}}});
// built-in rules are listed in src/kvstore/optimizer_rules.cc. The rule's own
// hyper-parameters (RuleParam) travel in OptimizerConfig::rule_params: through
// FromParams, the text form, states files and the dist payload, with no codec change.
// A dist job needs the rule registered in its server processes as well (built-in
// rules are everywhere).
//
// A rule sees one slice (a dist server's part) of a key at a time: rules that need
// the whole tensor (LAMB, LARS: a norm over all of it) do not fit this interface.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pskv/optimizer.h"

namespace pskv {

/// The per-update values a rule needs besides its configuration.
struct UpdateStep {
  double lr = 0;  ///< the scheduled rate times the key's lr_mult
  double wd = 0;  ///< wd times the key's wd_mult
  int64_t t = 0;  ///< this key's update count, from 1
};

/// A hyper-parameter of one rule (beyond OptimizerConfig's shared fields): a
/// number in [lo, hi] (both finite or infinite; NaN never valid).
struct RuleParam {
  std::string name{};
  double default_value = 0;
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  std::string doc{};
};

struct UpdateRule {
  /// float32 state buffers per weight element (momentum, moments, ...); each has the
  /// weight's element count and starts at zero.
  int (*slots)(const OptimizerConfig&) = nullptr;
  /// One update of n elements: `grad` as pushed (apply ScaledGrad first), `w` the
  /// weight (or its float32 master copy) updated in place, slots[s] the n elements
  /// of state buffer s. Called concurrently for different keys.
  void (*update)(const OptimizerConfig&, const UpdateStep&, const float* grad, float* w,
                 float* const* slots, int64_t n) = nullptr;
  /// Whether a row-sparse gradient updates only its rows (MXNet's lazy update);
  /// null: never (the dense rule runs with zeros in the other rows).
  bool (*lazy_rows)(const OptimizerConfig&) = nullptr;
  /// The rule's own hyper-parameters, read with OptimizerConfig::RuleParam.
  std::vector<RuleParam> params{};
  /// Defaults of shared fields of OptimizerConfig (by name; numbers only) that differ
  /// for this rule from the field's initialiser, e.g. adam's learning_rate 0.001
  /// (MXNet's per-optimizer defaults). OptimizerConfig::For and FromParams apply them;
  /// Params lists them, and Python's optimizer classes read them from there.
  std::vector<std::pair<std::string, double>> field_defaults{};
};

/// rescale_grad, then clip_gradient (if > 0): the gradient every rule starts from.
struct ScaledGrad {
  explicit ScaledGrad(const OptimizerConfig& c)
      : rescale(static_cast<float>(c.rescale_grad)), clip(static_cast<float>(c.clip_gradient)) {}
  float operator()(float g) const {
    g = rescale * g;
    return clip > 0 ? std::min(std::max(g, -clip), clip) : g;
  }
  float rescale, clip;
};

/// Adds a rule for `type`. InvalidArgument if the type is taken, the rule lacks
/// slots or update, or a parameter is named like a field of OptimizerConfig (or
/// twice), or its default is outside its range, or a field default names no numeric
/// field of OptimizerConfig or lies outside that field's range. Thread-safe; register before
/// creating optimizers of the type.
void RegisterUpdateRule(const std::string& type, UpdateRule rule);
/// The rule of `type`, or nullptr. The pointer stays valid for the process.
const UpdateRule* FindUpdateRule(std::string_view type);

}  // namespace pskv
