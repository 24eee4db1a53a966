// The built-in update rules (their formulas: include/pskv/optimizer.h) and the
// registry that finds rules by type.
#include "kvstore/optimizer_rules.h"

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <variant>

#include "protocol/optimizer_fields.h"
#include "pskv/error.h"

namespace pskv {

namespace {

void Sgd(const OptimizerConfig& c, const UpdateStep& s, const float* grad, float* w,
         float* const* slots, int64_t n) {
  const ScaledGrad G(c);
  const float wd = static_cast<float>(s.wd), flr = static_cast<float>(s.lr);
  if (c.momentum > 0) {
    float* m = slots[0];
    const float mom = static_cast<float>(c.momentum);
    for (int64_t i = 0; i < n; ++i) {
      m[i] = mom * m[i] - flr * (G(grad[i]) + wd * w[i]);
      w[i] += m[i];
    }
  } else {
    for (int64_t i = 0; i < n; ++i) w[i] -= flr * (G(grad[i]) + wd * w[i]);
  }
}

void Nag(const OptimizerConfig& c, const UpdateStep& s, const float* grad, float* w,
         float* const* slots, int64_t n) {
  const ScaledGrad G(c);
  const float wd = static_cast<float>(s.wd), flr = static_cast<float>(s.lr);
  float* m = slots[0];
  const float mom = static_cast<float>(c.momentum);
  for (int64_t i = 0; i < n; ++i) {
    float g = G(grad[i]) + wd * w[i];
    m[i] = mom * m[i] + g;
    w[i] -= flr * (g + mom * m[i]);
  }
}

// Adam and AdamW share the moments; they differ in where the weight decay goes.
template <bool kDecoupled>
void AdamRule(const OptimizerConfig& c, const UpdateStep& s, const float* grad, float* w,
              float* const* slots, int64_t n) {
  const ScaledGrad G(c);
  const float wd = static_cast<float>(s.wd), flr = static_cast<float>(s.lr);
  float* m = slots[0];
  float* v = slots[1];
  const double b1 = c.beta1, b2 = c.beta2;
  const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
  const float eps = static_cast<float>(c.epsilon);
  const double c1 = 1 - std::pow(b1, static_cast<double>(s.t));
  const double c2 = 1 - std::pow(b2, static_cast<double>(s.t));
  if constexpr (!kDecoupled) {
    const float lr_t = static_cast<float>(s.lr * std::sqrt(c2) / c1);
    for (int64_t i = 0; i < n; ++i) {
      float g = G(grad[i]) + wd * w[i];
      m[i] = fb1 * m[i] + (1 - fb1) * g;
      v[i] = fb2 * v[i] + (1 - fb2) * g * g;
      w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  } else {
    const float ic1 = static_cast<float>(1 / c1), ic2 = static_cast<float>(1 / c2);
    for (int64_t i = 0; i < n; ++i) {
      float g = G(grad[i]);
      m[i] = fb1 * m[i] + (1 - fb1) * g;
      v[i] = fb2 * v[i] + (1 - fb2) * g * g;
      w[i] -= flr * ((m[i] * ic1) / (std::sqrt(v[i] * ic2) + eps) + wd * w[i]);
    }
  }
}

void RmsProp(const OptimizerConfig& c, const UpdateStep& s, const float* grad, float* w,
             float* const* slots, int64_t n) {
  const ScaledGrad G(c);
  const float wd = static_cast<float>(s.wd), flr = static_cast<float>(s.lr);
  float* sq = slots[0];
  const float rho = static_cast<float>(c.rho), eps = static_cast<float>(c.epsilon);
  if (!c.centered) {
    for (int64_t i = 0; i < n; ++i) {
      float g = G(grad[i]) + wd * w[i];
      sq[i] = rho * sq[i] + (1 - rho) * g * g;
      w[i] -= flr * g / (std::sqrt(sq[i]) + eps);
    }
  } else {
    float* a = slots[1];
    float* d = slots[2];
    const float mom = static_cast<float>(c.momentum);
    for (int64_t i = 0; i < n; ++i) {
      float g = G(grad[i]) + wd * w[i];
      sq[i] = rho * sq[i] + (1 - rho) * g * g;
      a[i] = rho * a[i] + (1 - rho) * g;
      d[i] = mom * d[i] - flr * g / std::sqrt(sq[i] - a[i] * a[i] + eps);
      w[i] += d[i];
    }
  }
}

void AdaGrad(const OptimizerConfig& c, const UpdateStep& s, const float* grad, float* w,
             float* const* slots, int64_t n) {
  const ScaledGrad G(c);
  const float wd = static_cast<float>(s.wd), flr = static_cast<float>(s.lr);
  float* h = slots[0];
  const float eps = static_cast<float>(c.epsilon);
  for (int64_t i = 0; i < n; ++i) {
    float g = G(grad[i]);
    h[i] += g * g;
    w[i] -= flr * (g / std::sqrt(h[i] + eps) + wd * w[i]);
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
    add("nag", {OneSlot, Nag, nullptr, {}});
    // MXNet's per-optimizer defaults where they differ from OptimizerConfig's.
    const std::vector<std::pair<std::string, double>> lr_1e3{{"learning_rate", 0.001}};
    add("adam", {TwoSlots, AdamRule<false>, LazyIfAsked, {}, lr_1e3});
    add("adamw", {TwoSlots, AdamRule<true>, nullptr, {}, lr_1e3});
    add("rmsprop", {[](const OptimizerConfig& c) { return c.centered ? 3 : 1; },
                    RmsProp,
                    nullptr,
                    {},
                    lr_1e3});
    add("adagrad", {OneSlot, AdaGrad, Always, {}, {{"epsilon", 1e-7}}});
    return reg;
  }();
  return *r;
}

}  // namespace

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
