// The optimizer's one field table (kvstore/optimizer_fields.h) and its update-rule
// registry (pskv/update_rule.h): every field goes through every codec, ranges and
// names come from the table, rules are found by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/optimizer_fields.h"
#include "kvstore/optimizer_rules.h"
#include "pskv/error.h"
#include "pskv/optimizer.h"
#include "pskv/update_rule.h"

using namespace pskv;

namespace {

// A config with every field of the table away from its default and valid: doubles
// inside their range, whole numbers, flags flipped, lists with two entries. Written
// by walking the table, so a new row is covered without editing this test.
OptimizerConfig EveryFieldSet() {
  OptimizerConfig c;
  int i = 0;
  for (const OptimizerField& f : OptimizerFields()) {
    ++i;
    if (f.name == "type" || f.name == "lr_scheduler") continue;  // set below (validated names)
    std::visit(FieldVisitor{
                   [&](std::string* x) { *x += "_x"; },
                   // Halved plus a little: inside every range of the table (and
                   // lr_factor's (0, 1], a cross-field check), never the default.
                   [&](double* x) { *x = *x / 2 + 0.015625 * i / 64; },
                   [&](int64_t* x) { *x += 7 + i; },
                   [&](bool* x) { *x = !*x; },
                   [&](std::vector<int64_t>* x) {
                     *x = {3 + i, 9 + i};
                   },
                   [&](std::map<int64_t, double>* x) {
                     *x = {{1, 0.5 + i}, {5, 2.25}};
                   },
                   [&](std::set<int64_t>* x) {
                     *x = {11 + i, 12 + i};
                   },
               },
               f.Of(c));
  }
  c.type = "rmsprop";
  c.lr_schedule.type = "multifactor";
  c.lr_schedule.max_update = c.lr_schedule.warmup_steps + 100;
  return c;
}

}  // namespace

TEST(OptimizerFields, EveryFieldRoundTripsThroughTextPayloadAndStates) {
  const OptimizerConfig c = EveryFieldSet();
  ASSERT_NO_THROW(c.Validate());
  const std::string text = c.Serialize();
  const std::string defaults = OptimizerConfig().Serialize();
  for (const OptimizerField& f : OptimizerFields()) {
    std::string v, d;
    ASSERT_TRUE(FormatField(f, c, &v)) << f.name;
    EXPECT_NE(text.find(std::string(f.name) + "=" + v + "\n"), std::string::npos)
        << f.name << " missing from\n"
        << text;
    // Every field differs from its default, so a codec that drops one fails below.
    if (FormatField(f, OptimizerConfig(), &d)) {
      EXPECT_NE(v, d) << f.name;
    }
  }
  EXPECT_EQ(OptimizerConfig::Deserialize(text).Serialize(), text);
  EXPECT_EQ(payload::DecodeOptimizer(payload::EncodeOptimizer(c)).Serialize(), text);
  // A states blob saved with dump_optimizer carries the config.
  Optimizer o(c);
  Optimizer back(OptimizerConfig{});
  back.LoadStates(o.SaveStates(/*dump_optimizer=*/true));
  EXPECT_EQ(back.CurrentConfig().Serialize(), text);
  // FromParams takes every field by its name (the text form's values).
  std::map<std::string, std::string> params;
  for (const OptimizerField& f : OptimizerFields())
    if (f.name != "type") FormatField(f, c, &params[std::string(f.name)]);
  EXPECT_EQ(OptimizerConfig::FromParams(c.type, params).Serialize(), text);
}

TEST(OptimizerFields, EveryMemberHasARow) {
  // A member added to OptimizerConfig without a row in the table would be lost by
  // every codec. The size of the struct is the only reflection C++ has: when it
  // changes, add the row (and update this number). libstdc++ on 64-bit only.
#if defined(__GLIBCXX__) && __SIZEOF_POINTER__ == 8
  EXPECT_EQ(sizeof(OptimizerConfig), 416u)
      << "OptimizerConfig changed: give a new member a row in kvstore/optimizer_fields.cc";
#endif
  EXPECT_EQ(OptimizerFields().size(), 25u);
}

TEST(OptimizerFields, NamesAliasesAndParamsComeFromTheTable) {
  const auto params = OptimizerConfig::Params();
  ASSERT_EQ(params.size() + 1, OptimizerFields().size());  // all but "type"
  for (size_t i = 0; i < params.size(); ++i) {
    const OptimizerField& f = OptimizerFields()[i + 1];
    EXPECT_EQ(params[i].name, f.name);
    EXPECT_EQ(params[i].alias, f.alias);
    EXPECT_EQ(FindOptimizerField(f.name), &f);
    if (!f.alias.empty()) {
      EXPECT_EQ(FindOptimizerField(f.alias), &f);
    }
  }
  EXPECT_EQ(FindOptimizerField("lr")->name, "learning_rate");
  EXPECT_EQ(FindOptimizerField("gamma1")->name, "rho");
  EXPECT_EQ(FindOptimizerField("no_such"), nullptr);
  EXPECT_EQ(std::stod(params[0].default_value), 0.01);
  EXPECT_EQ(params[0].type, "float");
  EXPECT_EQ(OptimizerConfig::FromParams("sgd", {{"lr", "0.5"}}).learning_rate, 0.5);
  try {
    OptimizerConfig::FromParams("sgd", {{"no_such", "1"}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "known: learning_rate, wd, rescale_grad, clip_gradient, momentum, beta1, beta2, "
                  "epsilon, rho, centered, multi_precision, lazy_update, lr_scheduler, lr_step, "
                  "lr_steps, lr_factor, stop_factor_lr, max_update, final_lr, warmup_steps, "
                  "warmup_begin_lr, lr_mult, wd_mult, sum_keys"),
              std::string::npos)
        << e.what();
  }
}

TEST(OptimizerFields, RangesComeFromTheTable) {
  auto message = [](const std::string& name, const std::string& value) -> std::string {
    try {
      OptimizerConfig::FromParams("sgd", {{name, value}});
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message("wd", "-1"), "wd must be >= 0");
  EXPECT_EQ(message("momentum", "1"), "momentum must be in [0, 1)");
  EXPECT_EQ(message("beta2", "-0.5"), "beta2 must be in [0, 1)");
  EXPECT_EQ(message("epsilon", "0"), "epsilon must be > 0");
  EXPECT_EQ(message("rho", "1.5"), "rho must be in [0, 1)");
  EXPECT_EQ(message("clip_gradient", "-7"), "");  // unchecked: <= 0 means no clipping
  // Values the text form cannot give arrive through the payload.
  OptimizerConfig c;
  c.learning_rate = std::nan("");
  EXPECT_THROW(payload::DecodeOptimizer(payload::EncodeOptimizer(c)).Validate(), InvalidArgument);
  for (const OptimizerField& f : OptimizerFields())
    if (f.range.checked) {
      EXPECT_FALSE(f.range.Contains(std::nan(""))) << f.name;
    }
}

TEST(OptimizerRules, BuiltinRulesAreRegisteredInOrder) {
  const auto types = OptimizerConfig::Types();
  ASSERT_GE(types.size(), 6u);
  EXPECT_EQ(std::vector<std::string>(types.begin(), types.begin() + 6),
            (std::vector<std::string>{"sgd", "nag", "adam", "adamw", "rmsprop", "adagrad"}));
  for (auto& t : types) EXPECT_NE(FindUpdateRule(t), nullptr) << t;
  EXPECT_EQ(FindUpdateRule("lamb"), nullptr);
  // State counts as the header's formulas need them.
  auto slots = [](const std::string& type, std::map<std::string, std::string> p) {
    const OptimizerConfig c = OptimizerConfig::FromParams(type, p);
    return FindUpdateRule(type)->slots(c);
  };
  EXPECT_EQ(slots("sgd", {}), 0);
  EXPECT_EQ(slots("sgd", {{"momentum", "0.9"}}), 1);
  EXPECT_EQ(slots("nag", {}), 1);
  EXPECT_EQ(slots("adam", {}), 2);
  EXPECT_EQ(slots("adamw", {}), 2);
  EXPECT_EQ(slots("rmsprop", {}), 1);
  EXPECT_EQ(slots("rmsprop", {{"centered", "1"}}), 3);
  EXPECT_EQ(slots("adagrad", {}), 1);
  try {
    OptimizerConfig::FromParams("lamb", {});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("valid: sgd, nag, adam, adamw, rmsprop, adagrad"),
              std::string::npos)
        << e.what();
  }
}

TEST(OptimizerRules, RegistrationIsChecked) {
  auto slots = [](const OptimizerConfig&) { return 0; };
  auto update = [](const OptimizerConfig&, const UpdateStep&, const float*, float*, float* const*,
                   int64_t) {};
  EXPECT_THROW(RegisterUpdateRule("sgd", {slots, update, nullptr, {}}), InvalidArgument);
  EXPECT_THROW(RegisterUpdateRule("fields_test_a", {nullptr, update, nullptr, {}}),
               InvalidArgument);
  EXPECT_THROW(RegisterUpdateRule("fields_test_b", {slots, update, nullptr, {{"lr", 0}}}),
               InvalidArgument);  // a field's alias
  EXPECT_THROW(RegisterUpdateRule("fields_test_c", {slots, update, nullptr, {{"k", 0}, {"k", 1}}}),
               InvalidArgument);
  EXPECT_THROW(RegisterUpdateRule("fields_test_d", {slots, update, nullptr, {{"k", -1, 0, 1}}}),
               InvalidArgument);
  using D = std::vector<std::pair<std::string, double>>;
  EXPECT_THROW(RegisterUpdateRule("fields_test_e", {slots, update, nullptr, {}, D{{"nope", 1}}}),
               InvalidArgument);  // no such field
  EXPECT_THROW(
      RegisterUpdateRule("fields_test_f", {slots, update, nullptr, {}, D{{"lr_steps", 1}}}),
      InvalidArgument);  // not a number field
  EXPECT_THROW(
      RegisterUpdateRule("fields_test_g", {slots, update, nullptr, {}, D{{"momentum", 1.5}}}),
      InvalidArgument);  // outside the field's range
  EXPECT_EQ(FindUpdateRule("fields_test_a"), nullptr);
  EXPECT_EQ(FindUpdateRule("fields_test_d"), nullptr);
  EXPECT_EQ(FindUpdateRule("fields_test_g"), nullptr);
}

// MXNet's per-optimizer defaults are the rule's, written once (optimizer_rules.cc):
// For, FromParams and Params agree, and a given value wins.
TEST(OptimizerRules, EachTypeHasItsOwnDefaults) {
  EXPECT_EQ(OptimizerConfig::For("sgd").learning_rate, 0.01);
  EXPECT_EQ(OptimizerConfig::For("nag").learning_rate, 0.01);
  for (const char* t : {"adam", "adamw", "rmsprop"}) {
    EXPECT_EQ(OptimizerConfig::For(t).learning_rate, 0.001) << t;
    EXPECT_EQ(OptimizerConfig::FromParams(t, {}).learning_rate, 0.001) << t;
  }
  EXPECT_EQ(OptimizerConfig::For("adagrad").epsilon, 1e-7);
  EXPECT_EQ(OptimizerConfig::For("adam").epsilon, 1e-8);
  EXPECT_EQ(OptimizerConfig::FromParams("adam", {{"lr", "0.5"}}).learning_rate, 0.5);
  EXPECT_EQ(OptimizerConfig::FromParams("adagrad", {{"epsilon", "1e-3"}}).epsilon, 1e-3);
  auto default_of = [](const std::string& type, const std::string& name) {
    for (auto& p : OptimizerConfig::Params(type))
      if (p.name == name) return std::stod(p.default_value);
    ADD_FAILURE() << name;
    return 0.0;
  };
  EXPECT_EQ(default_of("adam", "learning_rate"), 0.001);
  EXPECT_EQ(default_of("sgd", "learning_rate"), 0.01);
  EXPECT_EQ(default_of("", "learning_rate"), 0.01);
  EXPECT_EQ(default_of("adagrad", "epsilon"), 1e-7);
  EXPECT_THROW(OptimizerConfig::For("lamb"), InvalidArgument);
  // The defaults survive the text form (servers get the whole configuration).
  EXPECT_EQ(OptimizerConfig::Deserialize(OptimizerConfig::For("adam").Serialize()).learning_rate,
            0.001);
}

TEST(OptimizerRules, RuleParametersTravelThroughEveryCodec) {
  static const bool registered = [] {
    RegisterUpdateRule("fields_test_scaled",
                       {[](const OptimizerConfig&) { return 0; },
                        [](const OptimizerConfig& c, const UpdateStep& s, const float* g, float* w,
                           float* const*, int64_t n) {
                          const float k = static_cast<float>(c.Param("gain") * s.lr);
                          for (int64_t i = 0; i < n; ++i) w[i] -= k * g[i];
                        },
                        nullptr,
                        {{"gain", 2, 0, 8, "gradient gain"}, {"unused", 1, 1, 1, ""}}});
    return true;
  }();
  ASSERT_TRUE(registered);
  OptimizerConfig c = OptimizerConfig::FromParams("fields_test_scaled", {{"gain", "4"}});
  EXPECT_EQ(c.Param("gain"), 4);
  EXPECT_EQ(c.Param("unused"), 1);  // the rule's default
  EXPECT_THROW(c.Param("nope"), InvalidArgument);
  EXPECT_NE(c.Serialize().find("\ngain=4\n"), std::string::npos) << c.Serialize();
  EXPECT_EQ(OptimizerConfig::Deserialize(c.Serialize()).rule_params, c.rule_params);
  EXPECT_EQ(payload::DecodeOptimizer(payload::EncodeOptimizer(c)).rule_params, c.rule_params);
  // Without rule parameters the payload has the bytes it always had (the fuzz seeds).
  OptimizerConfig plain = c;
  plain.rule_params.clear();
  EXPECT_EQ(payload::EncodeOptimizer(c).size(),
            payload::EncodeOptimizer(plain).size() + 4 + 4 + 4 + 8);
  EXPECT_THROW(OptimizerConfig::FromParams("fields_test_scaled", {{"gain", "9"}}),
               InvalidArgument);  // outside [0, 8]
  EXPECT_THROW(OptimizerConfig::FromParams("sgd", {{"gain", "1"}}), InvalidArgument);
  EXPECT_THROW(OptimizerConfig::Deserialize("type=sgd\ngain=1\n"), InvalidArgument);
  const auto params = OptimizerConfig::Params("fields_test_scaled");
  EXPECT_EQ(params[params.size() - 2].name, "gain");
  EXPECT_EQ(params[params.size() - 2].range, "must be in [0, 8]");
  Optimizer o(c);
  NDArray w = NDArray::FromVector({1.0f});
  o.Update(0, NDArray::FromVector({0.5f}), &w);  // 1 - 4 * 0.01 * 0.5
  EXPECT_EQ(w.At(0), 1.0f - static_cast<float>(4 * 0.01) * 0.5f);
}
