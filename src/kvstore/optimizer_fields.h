// The fields of OptimizerConfig, listed once: name, MXNet's alias, where the value
// lives (which also says its type), valid range, doc. The text form
// (OptimizerConfig::Serialize, Deserialize, FromParams and the list of known names),
// the payload codec (kvstore/distributed/wire/kv_payload.cc: EncodeOptimizer,
// DecodeOptimizer), Validate's range
// checks and Python's list of parameters (OptimizerConfig::Params, bound as
// _pskv.optimizer_params) all walk this table, in its order; the defaults are the
// member initialisers of OptimizerConfig. A new row changes the payload's layout
// (protocol/payload.h: versions), so an optimizer that needs its own hyper-parameter declares
// it with its update rule instead (pskv/update_rule.h: RuleParam).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "pskv/optimizer.h"

namespace pskv {

/// The valid values of a number. Endpoints may be infinite; NaN is never valid.
struct FieldRange {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = true, hi_open = true;
  bool checked = false;  ///< false: any value

  bool Contains(double x) const {
    return !checked || ((lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi));
  }
  /// "must be finite", "must be >= 0", "must be in [0, 1)", ... ("" when unchecked).
  std::string Describe() const;

  static constexpr FieldRange Any() { return {}; }
  static constexpr FieldRange Finite() { return {.checked = true}; }
  /// [x, inf): finite values from x.
  static constexpr FieldRange AtLeast(double x) {
    return {.lo = x, .lo_open = false, .checked = true};
  }
  /// (x, inf]: every value above x, infinity included.
  static constexpr FieldRange Above(double x) {
    return {.lo = x, .hi_open = false, .checked = true};
  }
  /// [0, 1): decay rates and momenta.
  static constexpr FieldRange Unit() {
    return {.lo = 0, .hi = 1, .lo_open = false, .checked = true};
  }
};

struct OptimizerField {
  /// Where the value lives; the alternative is the type, which says how the value is
  /// parsed, printed and encoded: text; double ("%.17g"; on the wire 8 bytes); whole
  /// number; 0/1 (also true/false; one byte); "1,2,3"; "key:x,key:x"; "key,key".
  using Ref = std::variant<std::string*, double*, int64_t*, bool*, std::vector<int64_t>*,
                           std::map<int64_t, double>*, std::set<int64_t>*>;
  std::string_view name;
  std::string_view alias;  ///< MXNet's other name ("lr", "gamma1"), or empty
  Ref (*at)(OptimizerConfig&);
  FieldRange range;  ///< doubles only (other checks need several fields: Validate)
  std::string_view doc;
  /// The text form leaves the field out while it is empty (per-key fields), so a
  /// plain configuration's text does not mention them.
  bool omit_when_empty = false;
  /// The payload codec's words for the elements of a list field ("sum keys", and
  /// one of them: "sum key"), in its error messages.
  std::string_view elements = {};
  std::string_view element = {};

  Ref Of(OptimizerConfig& c) const { return at(c); }
  /// Read access (the accessors take a mutable config; callers of this overload
  /// only read through the pointer).
  Ref Of(const OptimizerConfig& c) const { return at(const_cast<OptimizerConfig&>(c)); }
};

/// std::visit(FieldVisitor{[](double* x) {...}, ...}, field.Of(config)).
template <class... F>
struct FieldVisitor : F... {
  using F::operator()...;
};
// For compilers without class template argument deduction for aggregates (clang
// before 17: the fuzz build).
template <class... F>
FieldVisitor(F...) -> FieldVisitor<F...>;

/// Every field of OptimizerConfig, in the order of the text form and the payload
/// ("type" first).
std::span<const OptimizerField> OptimizerFields();
/// The field called `name` (or its alias), or nullptr.
const OptimizerField* FindOptimizerField(std::string_view name);

/// Sets field f of c from its text form; InvalidArgument naming f for a bad value.
void ParseField(const OptimizerField& f, OptimizerConfig& c, const std::string& text);
/// Field f of c in its text form into *out; false when the text form leaves it out.
bool FormatField(const OptimizerField& f, const OptimizerConfig& c, std::string* out);
/// The type's name as Params() reports it ("string", "float", "int", "bool", ...).
std::string_view FieldKind(const OptimizerField& f);

/// The text form's number parsers (also for rule parameters): InvalidArgument
/// "optimizer parameter NAME='V' is not a finite number" / "... must be whole".
double ParseOptimizerNumber(std::string_view name, const std::string& v);
/// A double in the text form: "%.17g", exact on reading back.
std::string FormatOptimizerNumber(double v);

}  // namespace pskv
