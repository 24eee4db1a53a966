#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "pskv/error.h"
#include "pskv/optimizer.h"

using namespace pskv;

namespace {
OptimizerConfig Cfg(const std::string& type, std::map<std::string, std::string> p) {
  return OptimizerConfig::FromParams(type, p);
}
NDArray W(float v) {
  return NDArray::FromVector({v});
}
}  // namespace

TEST(Optimizer, SgdPlain) {
  // w -= lr*(rescale*g + wd*w): 1 - 0.1*(0.5*2 + 0.01*1) = 0.899
  Optimizer o(Cfg("sgd", {{"learning_rate", "0.1"}, {"rescale_grad", "0.5"}, {"wd", "0.01"}}));
  NDArray w = W(1);
  o.Update(0, W(2), &w);
  EXPECT_FLOAT_EQ(w.At(0), 0.899f);
}

TEST(Optimizer, SgdNegativeLearningRateAddsGradient) {
  // MXNet's tests use lr = -rate to get w += rate*g.
  Optimizer o(Cfg("sgd", {{"learning_rate", "-2"}}));
  NDArray w = W(1);
  o.Update(0, W(3), &w);
  o.Update(0, W(3), &w);
  EXPECT_FLOAT_EQ(w.At(0), 13.0f);
}

TEST(Optimizer, SgdMomentum) {
  Optimizer o(Cfg("sgd", {{"learning_rate", "0.1"}, {"momentum", "0.9"}}));
  NDArray w = W(1);
  o.Update(0, W(1), &w);  // m = -0.1, w = 0.9
  EXPECT_FLOAT_EQ(w.At(0), 0.9f);
  o.Update(0, W(1), &w);  // m = 0.9*-0.1 - 0.1 = -0.19, w = 0.71
  EXPECT_FLOAT_EQ(w.At(0), 0.71f);
}

TEST(Optimizer, ClipGradient) {
  Optimizer o(Cfg("sgd", {{"learning_rate", "1"}, {"clip_gradient", "0.5"}}));
  NDArray w = W(0);
  o.Update(0, W(10), &w);
  EXPECT_FLOAT_EQ(w.At(0), -0.5f);
  o.Update(0, W(-10), &w);
  EXPECT_FLOAT_EQ(w.At(0), 0.0f);
}

TEST(Optimizer, Nag) {
  Optimizer o(Cfg("nag", {{"learning_rate", "0.1"}, {"momentum", "0.5"}}));
  NDArray w = W(1);
  o.Update(0, W(1), &w);  // m = 1; w = 1 - 0.1*(1 + 0.5) = 0.85
  EXPECT_FLOAT_EQ(w.At(0), 0.85f);
  o.Update(0, W(1), &w);  // m = 1.5; w = 0.85 - 0.1*(1 + 0.75) = 0.675
  EXPECT_FLOAT_EQ(w.At(0), 0.675f);
}

TEST(Optimizer, Adam) {
  Optimizer o(Cfg("adam", {{"learning_rate", "0.1"}}));
  NDArray w = W(1);
  o.Update(0, W(0.5), &w);
  // t=1: m=0.05, v=0.00025; lr_t = 0.1*sqrt(0.001)/0.1; w -= lr_t*m/(sqrt(v)+eps)
  double m = 0.05, v = 0.00025, lr_t = 0.1 * std::sqrt(1 - 0.999) / (1 - 0.9);
  double want = 1 - lr_t * m / (std::sqrt(v) + 1e-8);
  EXPECT_NEAR(w.At(0), want, 1e-6);
  EXPECT_NEAR(w.At(0), 0.9, 1e-5);  // Adam's first step is ~lr in size
  o.Update(0, W(0.5), &w);
  m = 0.9 * m + 0.1 * 0.5;
  v = 0.999 * v + 0.001 * 0.25;
  lr_t = 0.1 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.81);
  want = want - lr_t * m / (std::sqrt(v) + 1e-8);
  EXPECT_NEAR(w.At(0), want, 5e-6);  // float32 arithmetic in the update
}

TEST(Optimizer, AdamWDecouplesWeightDecay) {
  Optimizer o(Cfg("adamw", {{"learning_rate", "0.1"}, {"wd", "0.1"}}));
  NDArray w = W(2);
  o.Update(0, W(0), &w);  // zero gradient: only decay acts: w -= 0.1*0.1*2
  EXPECT_NEAR(w.At(0), 1.98, 1e-6);
}

TEST(Optimizer, RmsProp) {
  Optimizer o(Cfg("rmsprop", {{"learning_rate", "0.01"}, {"rho", "0.9"}, {"epsilon", "1e-8"}}));
  NDArray w = W(1);
  o.Update(0, W(2), &w);  // n = 0.1*4 = 0.4, w = 1 - 0.01*2/sqrt(0.4)
  EXPECT_NEAR(w.At(0), 1 - 0.02 / std::sqrt(0.4), 1e-6);
}

TEST(Optimizer, RmsPropCentered) {
  Optimizer o(Cfg("rmsprop", {{"learning_rate", "0.01"}, {"centered", "1"}, {"momentum", "0.9"}}));
  NDArray w = W(1);
  o.Update(0, W(2), &w);  // n=0.4, a=0.2, d=-0.01*2/sqrt(0.4-0.04+1e-8)
  EXPECT_NEAR(w.At(0), 1 - 0.02 / std::sqrt(0.36 + 1e-8), 1e-6);
}

TEST(Optimizer, AdaGrad) {
  Optimizer o(Cfg("adagrad", {{"learning_rate", "0.1"}}));
  NDArray w = W(1);
  o.Update(0, W(2), &w);  // h=4, w = 1 - 0.1*2/2 = 0.9
  EXPECT_NEAR(w.At(0), 0.9, 1e-6);
  o.Update(0, W(2), &w);  // h=8, w = 0.9 - 0.1*2/sqrt(8)
  EXPECT_NEAR(w.At(0), 0.9 - 0.2 / std::sqrt(8.0), 1e-6);
}

TEST(Optimizer, MultiPrecisionKeepsFloat32Master) {
  // A step of 1e-4 is below half precision's resolution at 1.0 (~9.8e-4): without
  // a master copy the weight never moves; with it, 20 steps add up.
  auto run = [](bool mp) {
    Optimizer o(Cfg("sgd", {{"learning_rate", "-1e-4"}, {"multi_precision", mp ? "1" : "0"}}));
    NDArray w({1}, DType::kFloat16);
    w.Fill(1);
    NDArray g({1}, DType::kFloat16);
    g.Fill(1);
    for (int i = 0; i < 20; ++i) o.Update(0, g, &w);
    return w.At(0);
  };
  EXPECT_EQ(run(false), 1.0);
  EXPECT_NEAR(run(true), 1.0019531, 1e-6);  // 1.002 rounded to half
}

TEST(LRSchedule, FactorMultiFactorCosineWarmup) {
  LRSchedule f;
  f.type = "factor";
  f.step = 2;
  f.factor = 0.5;
  EXPECT_DOUBLE_EQ(f.Rate(1, 1), 1);
  EXPECT_DOUBLE_EQ(f.Rate(1, 2), 1);
  EXPECT_DOUBLE_EQ(f.Rate(1, 3), 0.5);
  EXPECT_DOUBLE_EQ(f.Rate(1, 5), 0.25);
  LRSchedule m;
  m.type = "multifactor";
  m.steps = {2, 4};
  m.factor = 0.1;
  EXPECT_DOUBLE_EQ(m.Rate(1, 2), 1);
  EXPECT_DOUBLE_EQ(m.Rate(1, 3), 0.1);
  EXPECT_NEAR(m.Rate(1, 5), 0.01, 1e-15);
  LRSchedule c;
  c.type = "cosine";
  c.max_update = 10;
  c.warmup_steps = 2;
  c.warmup_begin_lr = 0;
  c.final_lr = 0;
  EXPECT_DOUBLE_EQ(c.Rate(1, 1), 0.5);  // warm-up
  EXPECT_DOUBLE_EQ(c.Rate(1, 2), 1);
  EXPECT_NEAR(c.Rate(1, 6), 0.5, 1e-12);  // half way through the cosine
  EXPECT_DOUBLE_EQ(c.Rate(1, 11), 0);
}

TEST(Optimizer, ScheduleUsesGlobalUpdateCount) {
  Optimizer o(Cfg("sgd", {{"learning_rate", "1"},
                          {"lr_scheduler", "factor"},
                          {"lr_step", "1"},
                          {"lr_factor", "0.5"}}));
  NDArray a = W(0), b = W(0);
  o.Update(0, W(1), &a);  // num_update 1: lr 1
  o.Update(0, W(1), &a);  // num_update 2: lr 0.5
  o.Update(1, W(1), &b);  // key 1's first update, but num_update is 2: lr 0.5
  EXPECT_FLOAT_EQ(a.At(0), -1.5f);
  EXPECT_FLOAT_EQ(b.At(0), -0.5f);
}

TEST(OptimizerConfig, SerialisesExactly) {
  auto c = Cfg("adam", {{"learning_rate", "0.1234567890123"},
                        {"wd", "1e-5"},
                        {"lr_scheduler", "multifactor"},
                        {"lr_steps", "10,20"},
                        {"lr_factor", "0.3"}});
  auto d = OptimizerConfig::Deserialize(c.Serialize());
  EXPECT_EQ(d.Serialize(), c.Serialize());
  EXPECT_EQ(d.learning_rate, 0.1234567890123);
  EXPECT_EQ(d.lr_schedule.steps, (std::vector<int64_t>{10, 20}));
}

TEST(OptimizerConfig, RejectsBadValues) {
  EXPECT_THROW(Cfg("sgdd", {}), InvalidArgument);
  EXPECT_THROW(Cfg("sgd", {{"learnig_rate", "0.1"}}), InvalidArgument);
  EXPECT_THROW(Cfg("sgd", {{"momentum", "1.5"}}), InvalidArgument);
  EXPECT_THROW(Cfg("sgd", {{"learning_rate", "abc"}}), InvalidArgument);
  EXPECT_THROW(Cfg("sgd", {{"lr_scheduler", "exp"}}), InvalidArgument);
  EXPECT_THROW(OptimizerConfig::Deserialize("type=sgd\nbogus=1\n"), InvalidArgument);
}

TEST(Optimizer, SaveLoadStatesRoundTrip) {
  auto cfg = Cfg("adam", {{"learning_rate", "0.01"}});
  Optimizer a(cfg);
  NDArray w1 = W(1), w2 = W(1);
  for (int i = 0; i < 3; ++i) a.Update(5, W(0.3f), &w1);
  std::string blob = a.SaveStates();
  Optimizer b(cfg);
  b.LoadStates(blob);
  EXPECT_EQ(b.UpdateCount(5), 3);
  w2.CopyFrom(w1);
  a.Update(5, W(0.7f), &w1);
  b.Update(5, W(0.7f), &w2);
  EXPECT_EQ(w1.At(0), w2.At(0));
  Optimizer sgd(Cfg("sgd", {}));
  EXPECT_THROW(sgd.LoadStates(blob), UsageError);
  EXPECT_THROW(b.LoadStates("garbage"), Error);
  EXPECT_THROW(b.LoadStates(blob.substr(0, blob.size() - 3)), Error);
}

TEST(OptimizerConfig, PerKeyMultipliersAndSumKeysRoundTrip) {
  auto c = Cfg("sgd", {{"learning_rate", "1"},
                       {"wd", "0.5"},
                       {"lr_mult", "1:0.5,7:2"},
                       {"wd_mult", "2:0"},
                       {"sum_keys", "8,9"}});
  EXPECT_EQ(c.lr_mult, (std::map<int64_t, double>{{1, 0.5}, {7, 2}}));
  EXPECT_EQ(c.sum_keys, (std::set<int64_t>{8, 9}));
  auto d = OptimizerConfig::Deserialize(c.Serialize());
  EXPECT_EQ(d.Serialize(), c.Serialize());
  EXPECT_EQ(d.wd_mult, c.wd_mult);
  // a plain config's text has no per-key lines
  EXPECT_EQ(Cfg("sgd", {}).Serialize().find("_mult"), std::string::npos);
  EXPECT_EQ(Cfg("sgd", {}).Serialize().find("sum_keys"), std::string::npos);
  EXPECT_THROW(Cfg("sgd", {{"lr_mult", "3"}}), InvalidArgument);
  EXPECT_THROW(Cfg("sgd", {{"wd_mult", "3:-1"}}), InvalidArgument);
}

TEST(Optimizer, LrMultWdMultAndSumKeys) {
  Optimizer o(Cfg("sgd", {{"learning_rate", "1"},
                          {"wd", "0.5"},
                          {"lr_mult", "1:0.5"},
                          {"wd_mult", "2:0"},
                          {"sum_keys", "3"}}));
  NDArray g = NDArray::FromVector({1.0f});
  std::vector<NDArray> w{W(1), W(1), W(1), W(1)};
  for (int k = 0; k < 4; ++k) o.Update(k, g, &w[static_cast<size_t>(k)]);
  EXPECT_FLOAT_EQ(w[0].data<float>()[0], 1 - 1.5f);
  EXPECT_FLOAT_EQ(w[1].data<float>()[0], 1 - 0.5f * 1.5f);
  EXPECT_FLOAT_EQ(w[2].data<float>()[0], 0.0f);
  EXPECT_FLOAT_EQ(w[3].data<float>()[0], 1.0f);  // the pushed sum, no update rule
  EXPECT_EQ(o.UpdateCount(3), 0);
}

TEST(Optimizer, DumpedStatesRestoreTheConfig) {
  Optimizer a(Cfg("sgd", {{"learning_rate", "0.1"}, {"momentum", "0.5"}}));
  NDArray w = W(0);
  a.Update(0, NDArray::FromVector({1.0f}), &w);
  Optimizer kept(Cfg("sgd", {{"learning_rate", "5"}, {"momentum", "0.5"}}));
  kept.LoadStates(a.SaveStates());
  EXPECT_EQ(kept.CurrentConfig().learning_rate, 5);  // states only
  Optimizer restored(Cfg("sgd", {{"learning_rate", "5"}, {"momentum", "0.5"}}));
  restored.LoadStates(a.SaveStates(/*dump_optimizer=*/true));
  EXPECT_EQ(restored.CurrentConfig().learning_rate, 0.1);
  EXPECT_EQ(restored.UpdateCount(0), 1);
  std::string blob = a.SaveStates();
  MarkStatesDumped(&blob);
  EXPECT_EQ(blob, a.SaveStates(true));
  // a dumped blob of another optimizer type is adopted whole
  Optimizer other(Cfg("adam", {}));
  other.LoadStates(a.SaveStates(true));
  EXPECT_EQ(other.CurrentConfig().type, "sgd");
}

// States of a 1-element fp16 key (multi-precision SGD: only a float32 master copy)
// must not be used for a 4M-element key: refused at load with the weights' sizes,
// and at the first update without them (the master copy overflowed before).
TEST(Optimizer, LoadStatesChecksEverySizeMasterCopyIncluded) {
  auto cfg = Cfg("sgd", {{"learning_rate", "0.1"}, {"multi_precision", "1"}});
  Optimizer a(cfg);
  NDArray small({1}, DType::kFloat16);
  small.Fill(1);
  a.Update(0, small, &small);
  const std::string blob = a.SaveStates();

  Optimizer b(cfg);
  auto big = [](int64_t key) -> std::pair<int64_t, bool> {
    return {key == 0 ? int64_t{4} << 20 : -1, true};
  };
  EXPECT_THROW(b.LoadStates(blob, big), ShapeError);
  EXPECT_EQ(b.UpdateCount(0), 0);  // nothing loaded
  EXPECT_THROW(b.LoadStates(blob,
                            [](int64_t) {
                              return std::pair<int64_t, bool>{-1, true};
                            }),
               KeyError);
  EXPECT_THROW(b.LoadStates(blob,
                            [](int64_t) {
                              return std::pair<int64_t, bool>{1, false};
                            }),
               ShapeError);  // a master copy for a float32 weight
  b.LoadStates(blob, [](int64_t) { return std::pair<int64_t, bool>{1, true}; });
  EXPECT_EQ(b.UpdateCount(0), 1);

  Optimizer c(cfg);
  c.LoadStates(blob);  // unchecked load: the first update catches it
  NDArray w({int64_t{4} << 20}, DType::kFloat16), g({int64_t{4} << 20}, DType::kFloat16);
  w.Fill(1);
  g.Fill(1);
  EXPECT_THROW(c.Update(0, g, &w), ShapeError);
}

// A dist server's wire chunk c >= 1 of key k updates under (c << 32) | k: its own
// state and step count, k's multipliers (so chunks match the unchunked update).
TEST(Optimizer, ChunkStateKeysUseTheirKeysMultipliers) {
  auto cfg = OptimizerConfig::FromParams("adam", {{"learning_rate", "0.1"}, {"wd", "0.01"}});
  cfg.lr_mult[5] = 0.25;
  cfg.wd_mult[5] = 4;
  Optimizer whole(cfg), chunked(cfg);
  NDArray w({8}), a({4}), b({4}), g({8});
  for (int64_t i = 0; i < 8; ++i) {
    w.data<float>()[i] = 0.5f + static_cast<float>(i);
    g.data<float>()[i] = 0.1f * static_cast<float>(i) - 0.3f;
  }
  std::memcpy(a.raw(), w.raw(), 16);
  std::memcpy(b.raw(), w.data<float>() + 4, 16);
  NDArray ga({4}), gb({4});
  std::memcpy(ga.raw(), g.raw(), 16);
  std::memcpy(gb.raw(), g.data<float>() + 4, 16);
  const int64_t chunk1 = (int64_t{1} << 32) | 5;
  for (int step = 0; step < 3; ++step) {
    whole.Update(5, g, &w);
    chunked.Update(5, ga, &a);
    chunked.Update(chunk1, gb, &b);
  }
  EXPECT_EQ(std::memcmp(a.raw(), w.raw(), 16), 0);
  EXPECT_EQ(std::memcmp(b.raw(), w.data<float>() + 4, 16), 0);
  EXPECT_EQ(chunked.UpdateCount(5), 3);
  EXPECT_EQ(chunked.UpdateCount(chunk1), 3);
  // A negative key is its own parameter, not a chunk.
  cfg.lr_mult[-3] = 0;
  Optimizer neg(cfg);
  NDArray v({2}), gv({2});
  v.Fill(1);
  gv.Fill(1);
  neg.Update(-3, gv, &v);
  EXPECT_EQ(v.At(0), 1.0);
}

// A replica repeats its primary's updates with the primary's rates (schedule_at,
// docs/fault-tolerance.md): whatever order its keys' updates interleave in, the
// weights and the saved states are the primary's, bit for bit. Without the pin the
// step schedule (the largest count over all keys) gives key 1 another rate here.
TEST(Optimizer, PinnedScheduleRepeatsAnotherOrdersRates) {
  const auto cfg = Cfg(
      "sgd",
      {{"learning_rate", "1"}, {"lr_scheduler", "factor"}, {"lr_factor", "0.5"}, {"lr_step", "2"}});
  Optimizer primary(cfg), replica(cfg), unpinned(cfg);
  NDArray p0 = W(0), p1 = W(0), r0 = W(0), r1 = W(0), u0 = W(0), u1 = W(0);
  // Primary: key 0 three times, then key 1 (its rate comes from count 3).
  std::vector<int64_t> at;
  for (int i = 0; i < 3; ++i) {
    int64_t a = 0;
    primary.Update(0, W(1), &p0, &a);
    at.push_back(a);
  }
  int64_t a1 = 0;
  primary.Update(1, W(1), &p1, &a1);
  EXPECT_EQ(a1, 3);
  // Replica: key 1 first, with the primary's count; then key 0's updates.
  replica.Update(1, W(1), &r1, &a1);
  for (int i = 0; i < 3; ++i) replica.Update(0, W(1), &r0, &at[static_cast<size_t>(i)]);
  EXPECT_EQ(r0.At(0), p0.At(0));
  EXPECT_EQ(r1.At(0), p1.At(0));
  EXPECT_EQ(replica.SaveStates(), primary.SaveStates());
  // The same order without the pin: key 1 gets the rate of count 1.
  unpinned.Update(1, W(1), &u1);
  EXPECT_NE(u1.At(0), p1.At(0));
}
