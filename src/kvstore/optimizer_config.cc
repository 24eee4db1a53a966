// OptimizerConfig's text form, parameters and validation, driven by the field table
// (kvstore/optimizer_fields.h) and the rules' own parameters (pskv/update_rule.h);
// the learning-rate schedule.
#include <cmath>
#include <sstream>

#include "kvstore/optimizer_fields.h"
#include "kvstore/optimizer_rules.h"
#include "pskv/error.h"
#include "pskv/optimizer.h"

namespace pskv {

// ---------------------------------------------------------------- LRSchedule

double LRSchedule::Rate(double base_lr, int64_t num_update) const {
  if (warmup_steps > 0 && num_update < warmup_steps) {
    return warmup_begin_lr +
           (base_lr - warmup_begin_lr) * static_cast<double>(num_update) / warmup_steps;
  }
  if (type == "none") return base_lr;
  if (type == "factor") {
    // MXNet's FactorScheduler: the rate is multiplied by `factor` each time
    // num_update passes another multiple of `step`.
    int64_t k = num_update > 0 ? (num_update - 1) / step : 0;
    double lr = base_lr * std::pow(factor, static_cast<double>(k));
    // Bound the magnitude (MXNet bounded the signed value, which turned the
    // negative rates its own tests use into +stop_factor_lr).
    if (std::fabs(lr) < stop_factor_lr) lr = std::copysign(stop_factor_lr, base_lr);
    return lr;
  }
  if (type == "multifactor") {
    double lr = base_lr;
    for (int64_t s : steps)
      if (num_update > s) lr *= factor;
    return lr;
  }
  if (type == "cosine") {
    if (num_update > max_update) return final_lr;
    const double span = static_cast<double>(max_update - warmup_steps);
    const double pos = static_cast<double>(num_update - warmup_steps);
    return final_lr + (base_lr - final_lr) * (1 + std::cos(M_PI * pos / span)) / 2;
  }
  throw InvalidArgument("unknown lr schedule '" + type + "'");
}

// ---------------------------------------------------------------- OptimizerConfig

namespace {

// The shared fields' names (no aliases, no type), then the rule's parameters.
std::string KnownParams(const UpdateRule* rule) {
  std::string s;
  for (auto& f : OptimizerFields())
    if (f.name != "type") s += (s.empty() ? "" : ", ") + std::string(f.name);
  if (rule)
    for (auto& p : rule->params) s += ", " + p.name;
  return s;
}

const RuleParam* FindRuleParam(const UpdateRule* rule, const std::string& name) {
  if (rule)
    for (auto& p : rule->params)
      if (p.name == name) return &p;
  return nullptr;
}

std::string RuleRange(const RuleParam& p) {
  return FieldRange{p.lo, p.hi, false, false, !std::isinf(p.lo) || !std::isinf(p.hi)}.Describe();
}

}  // namespace

std::string OptimizerConfig::Serialize() const {
  std::string out, v;
  for (auto& f : OptimizerFields())
    if (FormatField(f, *this, &v)) out += std::string(f.name) + "=" + v + "\n";
  for (auto& [name, x] : rule_params) out += name + "=" + FormatOptimizerNumber(x) + "\n";
  return out;
}

OptimizerConfig OptimizerConfig::Deserialize(const std::string& text) {
  OptimizerConfig c;
  std::vector<std::pair<std::string, std::string>> others;  // the rule's, once the type is known
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.empty()) continue;
    auto eq = line.find('=');
    if (eq == std::string::npos)
      throw InvalidArgument("malformed optimizer configuration line '" + line + "'");
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (const OptimizerField* f = FindOptimizerField(k))
      ParseField(*f, c, v);
    else
      others.emplace_back(std::move(k), std::move(v));
  }
  const UpdateRule* rule = FindUpdateRule(c.type);
  for (auto& [k, v] : others) {
    if (!FindRuleParam(rule, k))
      throw InvalidArgument("unknown optimizer configuration field '" + k + "'");
    c.rule_params[k] = ParseOptimizerNumber(k, v);
  }
  c.Validate();
  return c;
}

OptimizerConfig OptimizerConfig::For(const std::string& type) {
  OptimizerConfig c;
  c.type = type;
  if (const UpdateRule* rule = FindUpdateRule(type))
    for (auto& [name, value] : rule->field_defaults)
      *std::get<double*>(FindOptimizerField(name)->Of(c)) = value;  // checked when registered
  else
    c.Validate();  // throws; the message lists the valid types
  return c;
}

OptimizerConfig OptimizerConfig::FromParams(const std::string& type,
                                            const std::map<std::string, std::string>& params) {
  OptimizerConfig c = For(type);
  const UpdateRule* rule = FindUpdateRule(type);
  for (auto& [k, v] : params) {
    if (k == "type") throw InvalidArgument("give the optimizer type as the name, not a parameter");
    if (const OptimizerField* f = FindOptimizerField(k))
      ParseField(*f, c, v);
    else if (FindRuleParam(rule, k))
      c.rule_params[k] = ParseOptimizerNumber(k, v);
    else
      throw InvalidArgument("unknown optimizer parameter '" + k + "' for " + type +
                            "; known: " + KnownParams(rule));
  }
  c.Validate();
  return c;
}

double OptimizerConfig::Param(const std::string& name) const {
  const RuleParam* p = FindRuleParam(FindUpdateRule(type), name);
  if (!p) throw InvalidArgument("optimizer '" + type + "' has no parameter '" + name + "'");
  auto it = rule_params.find(name);
  return it == rule_params.end() ? p->default_value : it->second;
}

void OptimizerConfig::Validate() const {
  const UpdateRule* rule = FindUpdateRule(type);
  if (!rule) {
    std::string valid;
    for (auto& t : UpdateRuleTypes()) valid += (valid.empty() ? "" : ", ") + t;
    throw InvalidArgument("unknown optimizer '" + type + "'; valid: " + valid);
  }
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw InvalidArgument(msg);
  };
  for (auto& f : OptimizerFields()) {
    const OptimizerField::Ref ref = f.Of(*this);
    if (auto* x = std::get_if<double*>(&ref); x && !f.range.Contains(**x))
      throw InvalidArgument(std::string(f.name) + " " + f.range.Describe());
  }
  for (auto& [key, m] : lr_mult)
    need(std::isfinite(m), "lr_mult of key " + std::to_string(key) + " must be finite");
  for (auto& [key, m] : wd_mult)
    need(m >= 0 && std::isfinite(m), "wd_mult of key " + std::to_string(key) + " must be >= 0");
  const LRSchedule& s = lr_schedule;
  if (s.type == "factor") {
    need(s.step >= 1, "lr_step must be >= 1 for the factor schedule");
    need(s.factor > 0 && s.factor <= 1, "lr_factor must be in (0, 1] for the factor schedule");
  } else if (s.type == "multifactor") {
    need(!s.steps.empty(), "lr_steps must list at least one step for the multifactor schedule");
    for (size_t i = 0; i < s.steps.size(); ++i)
      need(s.steps[i] >= 1 && (i == 0 || s.steps[i] > s.steps[i - 1]),
           "lr_steps must be increasing and >= 1");
    need(s.factor > 0 && s.factor <= 1, "lr_factor must be in (0, 1]");
  } else if (s.type == "cosine") {
    need(s.max_update > s.warmup_steps, "max_update must exceed warmup_steps for cosine");
  } else if (s.type != "none") {
    throw InvalidArgument("unknown lr_scheduler '" + s.type +
                          "'; valid: none, factor, multifactor, cosine");
  }
  need(s.warmup_steps >= 0, "warmup_steps must be >= 0");
  for (auto& [name, x] : rule_params) {
    const RuleParam* p = FindRuleParam(rule, name);
    if (!p)
      throw InvalidArgument("unknown optimizer parameter '" + name + "' for " + type +
                            "; known: " + KnownParams(rule));
    need(x >= p->lo && x <= p->hi, name + " " + RuleRange(*p));
  }
}

std::vector<OptimizerParamInfo> OptimizerConfig::Params(const std::string& type) {
  std::vector<OptimizerParamInfo> out;
  const OptimizerConfig defaults = FindUpdateRule(type) ? For(type) : OptimizerConfig{};
  for (auto& f : OptimizerFields()) {
    if (f.name == "type") continue;
    OptimizerParamInfo p{std::string(f.name), std::string(f.alias), std::string(FieldKind(f)), "",
                         f.range.Describe(),  std::string(f.doc)};
    FormatField(f, defaults, &p.default_value);
    out.push_back(std::move(p));
  }
  if (const UpdateRule* rule = FindUpdateRule(type))
    for (auto& rp : rule->params)
      out.push_back(
          {rp.name, "", "float", FormatOptimizerNumber(rp.default_value), RuleRange(rp), rp.doc});
  return out;
}

std::vector<std::string> OptimizerConfig::Types() {
  return UpdateRuleTypes();
}

}  // namespace pskv
