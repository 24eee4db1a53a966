#include "pskv/optimizer.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "common/byte_io.h"
#include "kvstore/states_file.h"
#include "pskv/error.h"

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

const char* const kTypes[] = {"sgd", "nag", "adam", "adamw", "rmsprop", "adagrad"};

std::string Fmt(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

double ToNum(const std::string& name, const std::string& v) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x))
    throw InvalidArgument("optimizer parameter " + name + "='" + v + "' is not a finite number");
  return x;
}

int64_t ToInt(const std::string& name, const std::string& v) {
  double x = ToNum(name, v);
  if (x != std::floor(x)) throw InvalidArgument("optimizer parameter " + name + " must be whole");
  return static_cast<int64_t>(x);
}

bool ToBool(const std::string& name, const std::string& v) {
  if (v == "1" || v == "true" || v == "True") return true;
  if (v == "0" || v == "false" || v == "False") return false;
  throw InvalidArgument("optimizer parameter " + name + "='" + v + "' is not a boolean");
}

// Applies one name=value to a config; false if the name is unknown.
bool Apply(OptimizerConfig& c, const std::string& k, const std::string& v) {
  LRSchedule& s = c.lr_schedule;
  if (k == "type")
    c.type = v;
  else if (k == "learning_rate" || k == "lr")
    c.learning_rate = ToNum(k, v);
  else if (k == "wd")
    c.wd = ToNum(k, v);
  else if (k == "rescale_grad")
    c.rescale_grad = ToNum(k, v);
  else if (k == "clip_gradient")
    c.clip_gradient = ToNum(k, v);
  else if (k == "momentum")
    c.momentum = ToNum(k, v);
  else if (k == "beta1")
    c.beta1 = ToNum(k, v);
  else if (k == "beta2")
    c.beta2 = ToNum(k, v);
  else if (k == "epsilon")
    c.epsilon = ToNum(k, v);
  else if (k == "rho" || k == "gamma1")
    c.rho = ToNum(k, v);
  else if (k == "centered")
    c.centered = ToBool(k, v);
  else if (k == "multi_precision")
    c.multi_precision = ToBool(k, v);
  else if (k == "lazy_update")
    c.lazy_update = ToBool(k, v);
  else if (k == "lr_scheduler")
    s.type = v;
  else if (k == "lr_step")
    s.step = ToInt(k, v);
  else if (k == "lr_steps") {
    s.steps.clear();
    std::stringstream ss(v);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) s.steps.push_back(ToInt(k, item));
  } else if (k == "lr_factor")
    s.factor = ToNum(k, v);
  else if (k == "stop_factor_lr")
    s.stop_factor_lr = ToNum(k, v);
  else if (k == "max_update")
    s.max_update = ToInt(k, v);
  else if (k == "final_lr")
    s.final_lr = ToNum(k, v);
  else if (k == "warmup_steps")
    s.warmup_steps = ToInt(k, v);
  else if (k == "warmup_begin_lr")
    s.warmup_begin_lr = ToNum(k, v);
  else if (k == "lr_mult" || k == "wd_mult") {
    auto& m = k == "lr_mult" ? c.lr_mult : c.wd_mult;
    m.clear();
    std::stringstream ss(v);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) continue;
      auto colon = item.find(':');
      if (colon == std::string::npos)
        throw InvalidArgument("optimizer parameter " + k +
                              " must look like 'key:mult,key:mult', got '" + v + "'");
      m[ToInt(k, item.substr(0, colon))] = ToNum(k, item.substr(colon + 1));
    }
  } else if (k == "sum_keys") {
    c.sum_keys.clear();
    std::stringstream ss(v);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) c.sum_keys.insert(ToInt(k, item));
  } else
    return false;
  return true;
}

const char* kKnownParams =
    "learning_rate, wd, rescale_grad, clip_gradient, momentum, beta1, beta2, epsilon, rho, "
    "centered, multi_precision, lazy_update, lr_scheduler, lr_step, lr_steps, lr_factor, "
    "stop_factor_lr, "
    "max_update, final_lr, warmup_steps, warmup_begin_lr, lr_mult, wd_mult, sum_keys";

}  // namespace

std::string OptimizerConfig::Serialize() const {
  std::ostringstream os;
  os << "type=" << type << "\n"
     << "learning_rate=" << Fmt(learning_rate) << "\n"
     << "wd=" << Fmt(wd) << "\n"
     << "rescale_grad=" << Fmt(rescale_grad) << "\n"
     << "clip_gradient=" << Fmt(clip_gradient) << "\n"
     << "momentum=" << Fmt(momentum) << "\n"
     << "beta1=" << Fmt(beta1) << "\n"
     << "beta2=" << Fmt(beta2) << "\n"
     << "epsilon=" << Fmt(epsilon) << "\n"
     << "rho=" << Fmt(rho) << "\n"
     << "centered=" << (centered ? 1 : 0) << "\n"
     << "multi_precision=" << (multi_precision ? 1 : 0) << "\n"
     << "lazy_update=" << (lazy_update ? 1 : 0) << "\n"
     << "lr_scheduler=" << lr_schedule.type << "\n"
     << "lr_step=" << lr_schedule.step << "\n"
     << "lr_steps=";
  for (size_t i = 0; i < lr_schedule.steps.size(); ++i)
    os << (i ? "," : "") << lr_schedule.steps[i];
  os << "\n"
     << "lr_factor=" << Fmt(lr_schedule.factor) << "\n"
     << "stop_factor_lr=" << Fmt(lr_schedule.stop_factor_lr) << "\n"
     << "max_update=" << lr_schedule.max_update << "\n"
     << "final_lr=" << Fmt(lr_schedule.final_lr) << "\n"
     << "warmup_steps=" << lr_schedule.warmup_steps << "\n"
     << "warmup_begin_lr=" << Fmt(lr_schedule.warmup_begin_lr) << "\n";
  // Per-key fields only when set (keeps the text of plain configs unchanged).
  auto mults = [&](const char* name, const std::map<int64_t, double>& m) {
    if (m.empty()) return;
    os << name << "=";
    bool first = true;
    for (auto& [key, x] : m) {
      os << (first ? "" : ",") << key << ":" << Fmt(x);
      first = false;
    }
    os << "\n";
  };
  mults("lr_mult", lr_mult);
  mults("wd_mult", wd_mult);
  if (!sum_keys.empty()) {
    os << "sum_keys=";
    bool first = true;
    for (int64_t key : sum_keys) {
      os << (first ? "" : ",") << key;
      first = false;
    }
    os << "\n";
  }
  return os.str();
}

OptimizerConfig OptimizerConfig::Deserialize(const std::string& text) {
  OptimizerConfig c;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.empty()) continue;
    auto eq = line.find('=');
    if (eq == std::string::npos)
      throw InvalidArgument("malformed optimizer configuration line '" + line + "'");
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "lr_steps" && v.empty()) {
      c.lr_schedule.steps.clear();
      continue;
    }
    if (!Apply(c, k, v)) throw InvalidArgument("unknown optimizer configuration field '" + k + "'");
  }
  c.Validate();
  return c;
}

OptimizerConfig OptimizerConfig::FromParams(const std::string& type,
                                            const std::map<std::string, std::string>& params) {
  OptimizerConfig c;
  c.type = type;
  for (auto& [k, v] : params) {
    if (k == "type") throw InvalidArgument("give the optimizer type as the name, not a parameter");
    if (!Apply(c, k, v))
      throw InvalidArgument("unknown optimizer parameter '" + k + "' for " + type +
                            "; known: " + kKnownParams);
  }
  c.Validate();
  return c;
}

void OptimizerConfig::Validate() const {
  bool known = false;
  for (const char* t : kTypes) known |= type == t;
  if (!known)
    throw InvalidArgument("unknown optimizer '" + type +
                          "'; valid: sgd, nag, adam, adamw, rmsprop, adagrad");
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw InvalidArgument(msg);
  };
  need(std::isfinite(learning_rate), "learning_rate must be finite");
  need(wd >= 0 && std::isfinite(wd), "wd must be >= 0");
  need(std::isfinite(rescale_grad), "rescale_grad must be finite");
  need(momentum >= 0 && momentum < 1, "momentum must be in [0, 1)");
  need(beta1 >= 0 && beta1 < 1, "beta1 must be in [0, 1)");
  need(beta2 >= 0 && beta2 < 1, "beta2 must be in [0, 1)");
  need(epsilon > 0, "epsilon must be > 0");
  need(rho >= 0 && rho < 1, "rho must be in [0, 1)");
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
}

// ---------------------------------------------------------------- Optimizer

Optimizer::Optimizer(OptimizerConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.Validate();
}

namespace {

int NumSlots(const OptimizerConfig& c) {
  if (c.type == "sgd") return c.momentum > 0 ? 1 : 0;
  if (c.type == "nag") return 1;
  if (c.type == "adam" || c.type == "adamw") return 2;
  if (c.type == "rmsprop") return c.centered ? 3 : 1;
  return 1;  // adagrad
}

// Runs the update rule on float32 buffers.
// `slots[s]` points at the first element of state s for these n elements.
void UpdateF32(const OptimizerConfig& c, double lr, double wd_, int64_t t, const float* grad,
               float* w, float* const* slots, int64_t n) {
  const float rescale = static_cast<float>(c.rescale_grad);
  const float clip = static_cast<float>(c.clip_gradient);
  const float wd = static_cast<float>(wd_);
  const float flr = static_cast<float>(lr);
  auto G = [&](int64_t i) {
    float g = rescale * grad[i];
    if (clip > 0) g = std::min(std::max(g, -clip), clip);
    return g;
  };
  const std::string& ty = c.type;
  if (ty == "sgd") {
    if (c.momentum > 0) {
      float* m = slots[0];
      const float mom = static_cast<float>(c.momentum);
      for (int64_t i = 0; i < n; ++i) {
        m[i] = mom * m[i] - flr * (G(i) + wd * w[i]);
        w[i] += m[i];
      }
    } else {
      for (int64_t i = 0; i < n; ++i) w[i] -= flr * (G(i) + wd * w[i]);
    }
  } else if (ty == "nag") {
    float* m = slots[0];
    const float mom = static_cast<float>(c.momentum);
    for (int64_t i = 0; i < n; ++i) {
      float g = G(i) + wd * w[i];
      m[i] = mom * m[i] + g;
      w[i] -= flr * (g + mom * m[i]);
    }
  } else if (ty == "adam" || ty == "adamw") {
    float* m = slots[0];
    float* v = slots[1];
    const double b1 = c.beta1, b2 = c.beta2;
    const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
    const float eps = static_cast<float>(c.epsilon);
    const double c1 = 1 - std::pow(b1, static_cast<double>(t));
    const double c2 = 1 - std::pow(b2, static_cast<double>(t));
    if (ty == "adam") {
      const float lr_t = static_cast<float>(lr * std::sqrt(c2) / c1);
      for (int64_t i = 0; i < n; ++i) {
        float g = G(i) + wd * w[i];
        m[i] = fb1 * m[i] + (1 - fb1) * g;
        v[i] = fb2 * v[i] + (1 - fb2) * g * g;
        w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
      }
    } else {
      const float ic1 = static_cast<float>(1 / c1), ic2 = static_cast<float>(1 / c2);
      for (int64_t i = 0; i < n; ++i) {
        float g = G(i);
        m[i] = fb1 * m[i] + (1 - fb1) * g;
        v[i] = fb2 * v[i] + (1 - fb2) * g * g;
        w[i] -= flr * ((m[i] * ic1) / (std::sqrt(v[i] * ic2) + eps) + wd * w[i]);
      }
    }
  } else if (ty == "rmsprop") {
    float* s = slots[0];
    const float rho = static_cast<float>(c.rho), eps = static_cast<float>(c.epsilon);
    if (!c.centered) {
      for (int64_t i = 0; i < n; ++i) {
        float g = G(i) + wd * w[i];
        s[i] = rho * s[i] + (1 - rho) * g * g;
        w[i] -= flr * g / (std::sqrt(s[i]) + eps);
      }
    } else {
      float* a = slots[1];
      float* d = slots[2];
      const float mom = static_cast<float>(c.momentum);
      for (int64_t i = 0; i < n; ++i) {
        float g = G(i) + wd * w[i];
        s[i] = rho * s[i] + (1 - rho) * g * g;
        a[i] = rho * a[i] + (1 - rho) * g;
        d[i] = mom * d[i] - flr * g / std::sqrt(s[i] - a[i] * a[i] + eps);
        w[i] += d[i];
      }
    }
  } else {  // adagrad
    float* h = slots[0];
    const float eps = static_cast<float>(c.epsilon);
    for (int64_t i = 0; i < n; ++i) {
      float g = G(i);
      h[i] += g * g;
      w[i] -= flr * (g / std::sqrt(h[i] + eps) + wd * w[i]);
    }
  }
}

}  // namespace

Optimizer::State& Optimizer::GetState(int64_t key, const NDArray& weight) {
  auto& st = states_[key];
  if (!st) {
    st = std::make_unique<State>();
    for (int i = 0; i < NumSlots(cfg_); ++i)
      st->slots.emplace_back(Shape{weight.size()}, DType::kFloat32);
    if (cfg_.multi_precision && IsLowPrecision(weight.dtype()))
      st->master = weight.AsType(DType::kFloat32).Reshape({weight.size()});
  }
  for (auto& s : st->slots)
    if (s.size() != weight.size())
      throw ShapeError("optimizer state of key " + std::to_string(key) + " has " +
                       std::to_string(s.size()) + " elements but the weight has " +
                       std::to_string(weight.size()) + " (states loaded for another model?)");
  // The float32 master copy (multi-precision) is written with the weight's size.
  if (!st->master.empty() && st->master.size() != weight.size())
    throw ShapeError("optimizer master copy of key " + std::to_string(key) + " has " +
                     std::to_string(st->master.size()) + " elements but the weight has " +
                     std::to_string(weight.size()) + " (states loaded for another model?)");
  return *st;
}

namespace {
// The parameter a state key belongs to: chunk c >= 1 of a dist key (wire chunks,
// dist_protocol.h) has its own state under (c << 32) | key, and the key's
// multipliers and sum_keys entry.
int64_t ParamKey(int64_t key) {
  return (key >> 32) > 0 ? static_cast<int64_t>(static_cast<int32_t>(key & 0xffffffff)) : key;
}
}  // namespace

Optimizer::Step Optimizer::BeginStep(int64_t key, const NDArray& weight) {
  Step s;
  s.wd = cfg_.wd;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.state = &GetState(key, weight);
    s.t = ++s.state->t;
    num_update_ = std::max(num_update_, s.t);
    s.lr = cfg_.lr_schedule.Rate(cfg_.learning_rate, num_update_);
  }
  if (auto it = cfg_.lr_mult.find(ParamKey(key)); it != cfg_.lr_mult.end()) s.lr *= it->second;
  if (auto it = cfg_.wd_mult.find(ParamKey(key)); it != cfg_.wd_mult.end()) s.wd *= it->second;
  return s;
}

void Optimizer::Update(int64_t key, const NDArray& grad, NDArray* weight) {
  if (grad.size() != weight->size())
    throw ShapeError("optimizer update of key " + std::to_string(key) + ": gradient has " +
                     std::to_string(grad.size()) + " elements, weight has " +
                     std::to_string(weight->size()));
  if (cfg_.sum_keys.count(ParamKey(key))) {  // not a parameter: the pushed sum becomes the value
    weight->CopyFrom(grad.dtype() == weight->dtype() ? grad : grad.AsType(weight->dtype()),
                     /*allow_reshape=*/true);
    return;
  }
  auto [st, lr, wd, t] = BeginStep(key, *weight);
  NDArray g32 = grad.dtype() == DType::kFloat32 ? grad : grad.AsType(DType::kFloat32);
  const int64_t n = weight->size();
  std::vector<float*> slots;
  for (auto& sl : st->slots) slots.push_back(sl.data<float>());
  if (!st->master.empty()) {
    UpdateF32(cfg_, lr, wd, t, g32.data<float>(), st->master.data<float>(), slots.data(), n);
    weight->CopyFrom(st->master, /*allow_reshape=*/true);
  } else if (weight->dtype() == DType::kFloat32) {
    UpdateF32(cfg_, lr, wd, t, g32.data<float>(), weight->data<float>(), slots.data(), n);
  } else {
    NDArray w32 = weight->AsType(DType::kFloat32);
    UpdateF32(cfg_, lr, wd, t, g32.data<float>(), w32.data<float>(), slots.data(), n);
    weight->CopyFrom(w32);
  }
}

void Optimizer::UpdateRows(int64_t key, const int64_t* ids, int64_t n, const NDArray& grad_rows,
                           int64_t row_size, NDArray* weight) {
  int64_t grad_elements;
  if (row_size <= 0 || n < 0 || weight->size() % row_size != 0 ||
      __builtin_mul_overflow(n, row_size, &grad_elements) || grad_rows.size() != grad_elements)
    throw ShapeError("sparse optimizer update of key " + std::to_string(key) + ": " +
                     std::to_string(n) + " rows of " + std::to_string(row_size) +
                     " elements do not fit a gradient of " + std::to_string(grad_rows.size()) +
                     " elements and a weight of " + std::to_string(weight->size()));
  const int64_t R = weight->size() / row_size;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= R || (i && ids[i] <= ids[i - 1]))
      throw KeyError("sparse optimizer update of key " + std::to_string(key) +
                     ": row ids must be ascending, unique and below " + std::to_string(R));
  const bool lazy =
      cfg_.type == "adagrad" || (cfg_.lazy_update && (cfg_.type == "sgd" || cfg_.type == "adam"));
  if (!lazy || cfg_.sum_keys.count(ParamKey(key))) {
    // The dense rule (or the sum-key assignment) with zeros in the other rows.
    NDArray dense(Shape{weight->size()}, grad_rows.dtype());
    NDArray rows = grad_rows.Reshape({grad_rows.size()});
    const size_t rb = static_cast<size_t>(row_size) * DTypeSize(grad_rows.dtype());
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(dense.raw()) + static_cast<size_t>(ids[i]) * rb,
                  static_cast<const char*>(rows.raw()) + static_cast<size_t>(i) * rb, rb);
    return Update(key, dense, weight);
  }
  auto [st, lr, wd, t] = BeginStep(key, *weight);
  NDArray g32 =
      grad_rows.dtype() == DType::kFloat32 ? grad_rows : grad_rows.AsType(DType::kFloat32);
  const float* g = g32.data<float>();
  std::vector<float*> slots(st->slots.size());
  NDArray w32;  // one row in float32, for low-precision weights without a master copy
  if (st->master.empty() && weight->dtype() != DType::kFloat32)
    w32 = NDArray(Shape{row_size}, DType::kFloat32);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t off = ids[i] * row_size;
    for (size_t s = 0; s < slots.size(); ++s) slots[s] = st->slots[s].data<float>() + off;
    const float* gi = g + i * row_size;
    NDArray wrow = weight->Reshape({weight->size()}).Slice1D(off, row_size);
    if (!st->master.empty()) {
      float* m = st->master.data<float>() + off;
      UpdateF32(cfg_, lr, wd, t, gi, m, slots.data(), row_size);
      wrow.CopyFrom(NDArray::Wrap(m, {row_size}, DType::kFloat32));
    } else if (weight->dtype() == DType::kFloat32) {
      UpdateF32(cfg_, lr, wd, t, gi, wrow.data<float>(), slots.data(), row_size);
    } else {
      w32.CopyFrom(wrow);
      UpdateF32(cfg_, lr, wd, t, gi, w32.data<float>(), slots.data(), row_size);
      wrow.CopyFrom(w32);
    }
  }
}

int64_t Optimizer::UpdateCount(int64_t key) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(key);
  return it == states_.end() ? 0 : it->second->t;
}

// The blob's format: kvstore/states_file.h.
std::string Optimizer::SaveStates(bool dump_optimizer) const {
  std::lock_guard<std::mutex> lk(mu_);
  states::Blob b;
  b.dumped = dump_optimizer;
  b.config = cfg_.Serialize();
  b.num_update = num_update_;
  b.keys.reserve(states_.size());
  for (auto& [key, st] : states_) b.keys.push_back({key, st->t, st->slots, st->master});
  return states::EncodeBlob(b);  // under mu_: one consistent snapshot
}

void Optimizer::LoadStates(const std::string& blob, const WeightInfo& weights) {
  states::Blob b = states::DecodeBlob(blob);
  OptimizerConfig saved = OptimizerConfig::Deserialize(b.config);
  if (!b.dumped && saved.type != cfg_.type)
    throw UsageError("optimizer states were saved by '" + saved.type + "' but this store runs '" +
                     cfg_.type + "'");
  const OptimizerConfig& kind = b.dumped ? saved : cfg_;
  std::map<int64_t, std::unique_ptr<State>> states;
  for (states::KeyStates& k : b.keys) {
    const int64_t key = k.key;
    const size_t ns = k.slots.size();
    if (ns != static_cast<size_t>(NumSlots(kind)))
      throw IOError("optimizer states: key " + std::to_string(key) + " has " + std::to_string(ns) +
                    " state buffers, expected " + std::to_string(NumSlots(kind)));
    auto st = std::make_unique<State>();
    st->t = k.t;
    st->slots = std::move(k.slots);
    st->master = std::move(k.master);
    if (weights) {
      auto [n, low] = weights(key);
      if (n < 0)
        throw KeyError("optimizer states: key " + std::to_string(key) +
                       " is not held here (states saved from another model or job layout?)");
      for (auto& s : st->slots)
        if (s.size() != n)
          throw ShapeError("optimizer states: key " + std::to_string(key) + " has a state of " +
                           std::to_string(s.size()) + " elements but the weight has " +
                           std::to_string(n) + " (states saved from another model?)");
      if (!st->master.empty() && (st->master.size() != n || !low))
        throw ShapeError("optimizer states: key " + std::to_string(key) +
                         " has a float32 master copy of " + std::to_string(st->master.size()) +
                         " elements but the weight has " + std::to_string(n) +
                         (low ? "" : " and is not low precision") +
                         " (states saved from another model?)");
    }
    states[key] = std::move(st);
  }
  std::lock_guard<std::mutex> lk(mu_);
  states_ = std::move(states);
  num_update_ = b.num_update;
  if (b.dumped) cfg_ = std::move(saved);
}

void MarkStatesDumped(std::string* blob) {
  states::MarkDumped(blob);
}

}  // namespace pskv
