#include "kvstore/optimizer_fields.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "pskv/error.h"

namespace pskv {

namespace {

using Ref = OptimizerField::Ref;

int64_t ToInt(std::string_view name, const std::string& v) {
  double x = ParseOptimizerNumber(name, v);
  if (x != std::floor(x) || std::fabs(x) >= 9.2e18)
    throw InvalidArgument("optimizer parameter " + std::string(name) +
                          " must be whole (of magnitude below 9.2e18)");
  return static_cast<int64_t>(x);
}

bool ToBool(std::string_view name, const std::string& v) {
  if (v == "1" || v == "true" || v == "True") return true;
  if (v == "0" || v == "false" || v == "False") return false;
  throw InvalidArgument("optimizer parameter " + std::string(name) + "='" + v +
                        "' is not a boolean");
}

// The non-empty items of "a,b,c".
std::vector<std::string> Items(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

constexpr FieldRange kAny = FieldRange::Any(), kFinite = FieldRange::Finite(),
                     kUnit = FieldRange::Unit();

// The table. Rows: name, alias, member, range, doc [, omitted while empty, payload
// words]. The order is the text form's and the payload's: appending or reordering
// rows changes both formats.
const OptimizerField kFields[] = {
    {"type", "", [](OptimizerConfig& c) -> Ref { return &c.type; }, kAny,
     "the update rule: sgd, nag, adam, adamw, rmsprop, adagrad or a registered one"},
    {"learning_rate", "lr", [](OptimizerConfig& c) -> Ref { return &c.learning_rate; }, kFinite,
     "base learning rate (before the schedule and lr_mult)"},
    {"wd", "", [](OptimizerConfig& c) -> Ref { return &c.wd; }, FieldRange::AtLeast(0),
     "weight decay"},
    {"rescale_grad", "", [](OptimizerConfig& c) -> Ref { return &c.rescale_grad; }, kFinite,
     "gradients are multiplied by this first"},
    {"clip_gradient", "", [](OptimizerConfig& c) -> Ref { return &c.clip_gradient; }, kAny,
     "clip rescaled gradients to [-c, c]; <= 0: no clipping"},
    {"momentum", "", [](OptimizerConfig& c) -> Ref { return &c.momentum; }, kUnit,
     "momentum (sgd, nag, centered rmsprop)"},
    {"beta1", "", [](OptimizerConfig& c) -> Ref { return &c.beta1; }, kUnit,
     "decay of the first moment (adam, adamw)"},
    {"beta2", "", [](OptimizerConfig& c) -> Ref { return &c.beta2; }, kUnit,
     "decay of the second moment (adam, adamw)"},
    {"epsilon", "", [](OptimizerConfig& c) -> Ref { return &c.epsilon; }, FieldRange::Above(0),
     "added to denominators (adam, adamw, rmsprop, adagrad)"},
    {"rho", "gamma1", [](OptimizerConfig& c) -> Ref { return &c.rho; }, kUnit,
     "decay of the squared-gradient average (rmsprop)"},
    {"centered", "", [](OptimizerConfig& c) -> Ref { return &c.centered; }, kAny,
     "Graves' centered rmsprop"},
    {"multi_precision", "", [](OptimizerConfig& c) -> Ref { return &c.multi_precision; }, kAny,
     "float32 master copies of float16/bfloat16 weights"},
    {"lazy_update", "", [](OptimizerConfig& c) -> Ref { return &c.lazy_update; }, kAny,
     "row-sparse gradients update their rows only (sgd, adam)"},
    {"lr_scheduler", "", [](OptimizerConfig& c) -> Ref { return &c.lr_schedule.type; }, kAny,
     "learning-rate schedule: none, factor, multifactor, cosine"},
    {"lr_step", "", [](OptimizerConfig& c) -> Ref { return &c.lr_schedule.step; }, kAny,
     "factor schedule: multiply by lr_factor every lr_step updates"},
    {"lr_steps", "", [](OptimizerConfig& c) -> Ref { return &c.lr_schedule.steps; }, kAny,
     "multifactor schedule: multiply by lr_factor after each of these updates", false, "lr steps",
     "lr step"},
    {"lr_factor", "", [](OptimizerConfig& c) -> Ref { return &c.lr_schedule.factor; }, kAny,
     "factor and multifactor schedules: the factor"},
    {"stop_factor_lr", "", [](OptimizerConfig& c) -> Ref { return &c.lr_schedule.stop_factor_lr; },
     kAny, "factor schedule: lower bound of the rate"},
    {"max_update", "", [](OptimizerConfig& c) -> Ref { return &c.lr_schedule.max_update; }, kAny,
     "cosine schedule: updates until final_lr"},
    {"final_lr", "", [](OptimizerConfig& c) -> Ref { return &c.lr_schedule.final_lr; }, kAny,
     "cosine schedule: the last rate"},
    {"warmup_steps", "", [](OptimizerConfig& c) -> Ref { return &c.lr_schedule.warmup_steps; },
     kAny, "every schedule: linear warm-up over this many updates"},
    {"warmup_begin_lr", "",
     [](OptimizerConfig& c) -> Ref { return &c.lr_schedule.warmup_begin_lr; }, kAny,
     "every schedule: the rate at update 0 of the warm-up"},
    {"lr_mult", "", [](OptimizerConfig& c) -> Ref { return &c.lr_mult; }, kAny,
     "per-key multipliers of the learning rate, 'key:mult,key:mult'", true, "lr_mult entries", ""},
    {"wd_mult", "", [](OptimizerConfig& c) -> Ref { return &c.wd_mult; }, kAny,
     "per-key multipliers of wd, 'key:mult,key:mult'", true, "wd_mult entries", ""},
    {"sum_keys", "", [](OptimizerConfig& c) -> Ref { return &c.sum_keys; }, kAny,
     "keys that are not parameters: the pushed sum becomes the value, 'key,key'", true, "sum keys",
     "sum key"},
};

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::string FieldRange::Describe() const {
  if (!checked) return "";
  const bool lo_inf = std::isinf(lo), hi_inf = std::isinf(hi);
  if (lo_inf && hi_inf) return "must be finite";
  if (hi_inf) return std::string("must be ") + (lo_open ? "> " : ">= ") + Num(lo);
  if (lo_inf) return std::string("must be ") + (hi_open ? "< " : "<= ") + Num(hi);
  return "must be in " + std::string(lo_open ? "(" : "[") + Num(lo) + ", " + Num(hi) +
         (hi_open ? ")" : "]");
}

double ParseOptimizerNumber(std::string_view name, const std::string& v) {
  // The whole text is the number: strtod stops at a NUL byte inside it ("0\0.1" would
  // read as 0) and skips leading blanks, so both are refused here.
  char* end = nullptr;
  const double x = v.empty() || std::isspace(static_cast<unsigned char>(v[0]))
                       ? NAN
                       : std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x))
    throw InvalidArgument("optimizer parameter " + std::string(name) + "='" + v +
                          "' is not a finite number");
  return x;
}

std::string FormatOptimizerNumber(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::span<const OptimizerField> OptimizerFields() {
  return kFields;
}

const OptimizerField* FindOptimizerField(std::string_view name) {
  for (auto& f : kFields)
    if (f.name == name || (!f.alias.empty() && f.alias == name)) return &f;
  return nullptr;
}

void ParseField(const OptimizerField& f, OptimizerConfig& c, const std::string& v) {
  const std::string_view k = f.name;
  std::visit(FieldVisitor{
                 [&](std::string* x) { *x = v; },
                 [&](double* x) { *x = ParseOptimizerNumber(k, v); },
                 [&](int64_t* x) { *x = ToInt(k, v); },
                 [&](bool* x) { *x = ToBool(k, v); },
                 [&](std::vector<int64_t>* x) {
                   x->clear();
                   for (auto& item : Items(v)) x->push_back(ToInt(k, item));
                 },
                 [&](std::map<int64_t, double>* x) {
                   x->clear();
                   for (auto& item : Items(v)) {
                     auto colon = item.find(':');
                     if (colon == std::string::npos)
                       throw InvalidArgument("optimizer parameter " + std::string(k) +
                                             " must look like 'key:mult,key:mult', got '" + v +
                                             "'");
                     (*x)[ToInt(k, item.substr(0, colon))] =
                         ParseOptimizerNumber(k, item.substr(colon + 1));
                   }
                 },
                 [&](std::set<int64_t>* x) {
                   x->clear();
                   for (auto& item : Items(v)) x->insert(ToInt(k, item));
                 },
             },
             f.Of(c));
}

bool FormatField(const OptimizerField& f, const OptimizerConfig& c, std::string* out) {
  std::ostringstream os;
  bool empty = false;
  std::visit(FieldVisitor{
                 [&](std::string* x) { os << *x; },
                 [&](double* x) { os << FormatOptimizerNumber(*x); },
                 [&](int64_t* x) { os << *x; },
                 [&](bool* x) { os << (*x ? 1 : 0); },
                 [&](std::vector<int64_t>* x) {
                   empty = x->empty();
                   for (size_t i = 0; i < x->size(); ++i) os << (i ? "," : "") << (*x)[i];
                 },
                 [&](std::map<int64_t, double>* x) {
                   empty = x->empty();
                   const char* sep = "";
                   for (auto& [key, m] : *x) {
                     os << sep << key << ":" << FormatOptimizerNumber(m);
                     sep = ",";
                   }
                 },
                 [&](std::set<int64_t>* x) {
                   empty = x->empty();
                   const char* sep = "";
                   for (int64_t key : *x) {
                     os << sep << key;
                     sep = ",";
                   }
                 },
             },
             f.Of(c));
  if (empty && f.omit_when_empty) return false;
  *out = os.str();
  return true;
}

std::string_view FieldKind(const OptimizerField& f) {
  static constexpr std::string_view kNames[] = {"string", "float",     "int", "bool",
                                                "ints",   "key:float", "keys"};
  return kNames[f.Of(OptimizerConfig{}).index()];
}

}  // namespace pskv
