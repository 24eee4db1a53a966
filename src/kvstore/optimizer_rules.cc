// The built-in update rules (their formulas: include/pskv/optimizer.h) and the
// registry that finds rules by type.
#include "kvstore/optimizer_rules.h"

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <variant>

#include "kvstore/optimizer_fields.h"
#include "pskv/error.h"

namespace pskv {

namespace {

// The built-in rules run the element functions the device kernels run
// (device/kernel_ops.h), with the scalars of UpdateScalarsFor: one source for both.
template <kops::UpdateKind K>
void Builtin(const OptimizerConfig& c, const UpdateStep& s, const float* grad, float* w,
             float* const* slots, int64_t n) {
  const kops::UpdateScalars sc = UpdateScalarsFor(K, c, s);
  for (int64_t i = 0; i < n; ++i) kops::UpdateAt<K>(sc, grad, w, slots, i);
}

void Sgd(const OptimizerConfig& c, const UpdateStep& s, const float* grad, float* w,
         float* const* slots, int64_t n) {
  if (c.momentum > 0) {
    Builtin<kops::UpdateKind::kSgdMomentum>(c, s, grad, w, slots, n);
  } else {
    Builtin<kops::UpdateKind::kSgd>(c, s, grad, w, slots, n);
  }
}

void RmsProp(const OptimizerConfig& c, const UpdateStep& s, const float* grad, float* w,
             float* const* slots, int64_t n) {
  if (c.centered) {
    Builtin<kops::UpdateKind::kRmsPropCentered>(c, s, grad, w, slots, n);
  } else {
    Builtin<kops::UpdateKind::kRmsProp>(c, s, grad, w, slots, n);
  }
}

bool LazyIfAsked(const OptimizerConfig& c) {
  return c.lazy_update;
}
bool Always(const OptimizerConfig&) {
  return true;
}

struct Registry {
  std::shared_mutex mu;
  std::map<std::string, std::unique_ptr<UpdateRule>, std::less<>> rules;
  std::vector<std::string> order;  // of registration (messages list the types so)
};

int OneSlot(const OptimizerConfig&) {
  return 1;
}
int TwoSlots(const OptimizerConfig&) {
  return 2;
}

Registry& Rules() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: rules may run while the process exits
    auto add = [&](const char* type, UpdateRule rule) {
      reg->rules.emplace(type, std::make_unique<UpdateRule>(std::move(rule)));
      reg->order.push_back(type);
    };
    add("sgd",
        {[](const OptimizerConfig& c) { return c.momentum > 0 ? 1 : 0; }, Sgd, LazyIfAsked, {}});
    add("nag", {OneSlot, Builtin<kops::UpdateKind::kNag>, nullptr, {}});
    // MXNet's per-optimizer defaults where they differ from OptimizerConfig's.
    const std::vector<std::pair<std::string, double>> lr_1e3{{"learning_rate", 0.001}};
    add("adam", {TwoSlots, Builtin<kops::UpdateKind::kAdam>, LazyIfAsked, {}, lr_1e3});
    add("adamw", {TwoSlots, Builtin<kops::UpdateKind::kAdamW>, nullptr, {}, lr_1e3});
    add("rmsprop", {[](const OptimizerConfig& c) { return c.centered ? 3 : 1; },
                    RmsProp,
                    nullptr,
                    {},
                    lr_1e3});
    add("adagrad", {OneSlot, Builtin<kops::UpdateKind::kAdaGrad>, Always, {}, {{"epsilon", 1e-7}}});
    return reg;
  }();
  return *r;
}

}  // namespace

kops::UpdateKind BuiltinUpdateKind(const OptimizerConfig& c) {
  using K = kops::UpdateKind;
  if (c.type == "sgd") return c.momentum > 0 ? K::kSgdMomentum : K::kSgd;
  if (c.type == "nag") return K::kNag;
  if (c.type == "adam") return K::kAdam;
  if (c.type == "adamw") return K::kAdamW;
  if (c.type == "rmsprop") return c.centered ? K::kRmsPropCentered : K::kRmsProp;
  if (c.type == "adagrad") return K::kAdaGrad;
  return K::kNone;
}

kops::UpdateScalars UpdateScalarsFor(kops::UpdateKind kind, const OptimizerConfig& c,
                                     const UpdateStep& s) {
  using K = kops::UpdateKind;
  kops::UpdateScalars sc;
  sc.rescale = static_cast<float>(c.rescale_grad);
  sc.clip = static_cast<float>(c.clip_gradient);
  sc.lr = static_cast<float>(s.lr);
  sc.wd = static_cast<float>(s.wd);
  sc.mom = static_cast<float>(c.momentum);
  sc.eps = static_cast<float>(c.epsilon);
  sc.rho = static_cast<float>(c.rho);
  if (kind == K::kAdam || kind == K::kAdamW) {
    sc.b1 = static_cast<float>(c.beta1);
    sc.b2 = static_cast<float>(c.beta2);
    const double c1 = 1 - std::pow(c.beta1, static_cast<double>(s.t));
    const double c2 = 1 - std::pow(c.beta2, static_cast<double>(s.t));
    sc.lr_t = static_cast<float>(s.lr * std::sqrt(c2) / c1);
    sc.ic1 = static_cast<float>(1 / c1);
    sc.ic2 = static_cast<float>(1 / c2);
  }
  return sc;
}

void RegisterUpdateRule(const std::string& type, UpdateRule rule) {
  if (type.empty() || !rule.slots || !rule.update)
    throw InvalidArgument("update rule '" + type + "' needs a name, slots and update");
  for (size_t i = 0; i < rule.params.size(); ++i) {
    const RuleParam& p = rule.params[i];
    if (p.name.empty() || FindOptimizerField(p.name))
      throw InvalidArgument("update rule '" + type + "': parameter '" + p.name +
                            "' is empty or a field of every optimizer");
    for (size_t j = 0; j < i; ++j)
      if (rule.params[j].name == p.name)
        throw InvalidArgument("update rule '" + type + "': parameter '" + p.name + "' twice");
    if (!(p.default_value >= p.lo && p.default_value <= p.hi))
      throw InvalidArgument("update rule '" + type + "': the default of '" + p.name +
                            "' is outside its range");
  }
  OptimizerConfig probe;
  for (auto& [name, value] : rule.field_defaults) {
    const OptimizerField* f = FindOptimizerField(name);
    if (!f || !std::holds_alternative<double*>(f->Of(probe)) || !f->range.Contains(value))
      throw InvalidArgument("update rule '" + type + "': the default of '" + name +
                            "' names no numeric field of every optimizer or is outside its range");
  }
  Registry& r = Rules();
  std::unique_lock lk(r.mu);
  if (!r.rules.emplace(type, std::make_unique<UpdateRule>(std::move(rule))).second)
    throw InvalidArgument("an update rule '" + type + "' is registered already");
  r.order.push_back(type);
}

const UpdateRule* FindUpdateRule(std::string_view type) {
  Registry& r = Rules();
  std::shared_lock lk(r.mu);
  auto it = r.rules.find(type);
  return it == r.rules.end() ? nullptr : it->second.get();
}

std::vector<std::string> UpdateRuleTypes() {
  Registry& r = Rules();
  std::shared_lock lk(r.mu);
  return r.order;
}

}  // namespace pskv
