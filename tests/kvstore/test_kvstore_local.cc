// MXNet's single-machine kvstore tests (tests/python/unittest/test_kvstore.py),
// re-expressed in C++ with exact expected values, plus the error catalogue (spec 2.14).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "pskv/error.h"
#include "pskv/kvstore.h"

using namespace pskv;

namespace {
const Shape kShape = {4, 4};
const std::vector<int> kKeys = {5, 7, 11};
const std::vector<std::string> kStrKeys = {"b", "c", "d"};

NDArray Ones(Shape s = kShape, double v = 1, DType t = DType::kFloat32) {
  NDArray a(s, t);
  a.Fill(v);
  return a;
}
void ExpectAll(const NDArray& a, double v) {
  for (int64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.At(i), v) << "element " << i;
}
std::unique_ptr<KVStore> Make(const std::string& type = "local") {
  Options o;  // explicit options: tests do not depend on the environment
  return KVStore::Create(type, o);
}
}  // namespace

class LocalStores : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Types, LocalStores, ::testing::Values("local", "device"));

TEST_P(LocalStores, SingleKvPair) {
  auto kv = Make(GetParam());
  kv->Init(3, Ones());
  kv->Push(3, {Ones(kShape, 4)});
  NDArray out = Ones(kShape, 0);
  kv->Pull(3, {out});
  kv->WaitAll();
  ExpectAll(out, 4);
}

TEST_P(LocalStores, ListKvPair) {
  auto kv = Make(GetParam());
  kv->Init(kKeys, {Ones(), Ones(), Ones()});
  kv->Push(kKeys, {Ones(kShape, 4), Ones(kShape, 4), Ones(kShape, 4)});
  std::vector<NDArray> outs = {Ones(kShape, 0), Ones(kShape, 0), Ones(kShape, 0)};
  kv->Pull(kKeys, outs);
  kv->WaitAll();
  for (auto& o : outs) ExpectAll(o, 4);
}

TEST_P(LocalStores, AggregatorSumsValuesOfOneKey) {
  auto kv = Make(GetParam());
  const int num_devs = 4;
  kv->Init(3, Ones());
  std::vector<NDArray> vals(num_devs, Ones());
  kv->Push(3, vals);
  std::vector<NDArray> outs;
  for (int d = 0; d < num_devs; ++d) outs.push_back(Ones(kShape, 0));
  kv->Pull(3, outs);
  kv->WaitAll();
  for (auto& o : outs) ExpectAll(o, num_devs);

  // list of keys with a list of values each (list-of-lists, flattened)
  kv->Init(kKeys, {Ones(), Ones(), Ones()});
  std::vector<int> keys;
  std::vector<NDArray> flat, flat_out;
  for (int k : kKeys)
    for (int d = 0; d < num_devs; ++d) {
      keys.push_back(k);
      flat.push_back(Ones(kShape, 2));
      flat_out.push_back(Ones(kShape, 0));
    }
  kv->Push(keys, flat);
  kv->Pull(keys, flat_out);
  kv->WaitAll();
  for (auto& o : flat_out) ExpectAll(o, 2.0 * num_devs);
}

TEST_P(LocalStores, UpdaterIsCalledWithMergedValue) {
  auto kv = Make(GetParam());
  kv->Init(3, Ones());
  kv->Init(kKeys, {Ones(), Ones(), Ones()});
  std::vector<int> seen;
  kv->SetUpdater([&](int key, const NDArray& recv, NDArray* stored) {
    seen.push_back(key);
    for (int64_t i = 0; i < stored->size(); ++i) stored->data<float>()[i] += recv.data<float>()[i];
  });
  const int num_devs = 4, num_push = 4;
  for (int p = 0; p < num_push; ++p) kv->Push(3, std::vector<NDArray>(num_devs, Ones()));
  NDArray out = Ones(kShape, 0);
  kv->Pull(3, {out});
  kv->WaitAll();
  ExpectAll(out, 1 + num_devs * num_push);
  EXPECT_EQ(seen, std::vector<int>(num_push, 3));

  std::vector<int> keys;
  std::vector<NDArray> vals;
  for (int k : kKeys)
    for (int d = 0; d < num_devs; ++d) {
      keys.push_back(k);
      vals.push_back(Ones());
    }
  for (int p = 0; p < num_push; ++p) kv->Push(keys, vals);
  std::vector<NDArray> outs = {Ones(kShape, 0), Ones(kShape, 0), Ones(kShape, 0)};
  kv->Pull(kKeys, outs);
  kv->WaitAll();
  for (auto& o : outs) ExpectAll(o, 1 + num_devs * num_push);
}

TEST_P(LocalStores, StringKeysAndStringUpdater) {
  auto kv = Make(GetParam());
  kv->Init(kStrKeys, {Ones(), Ones(), Ones()});
  std::vector<std::string> seen;
  kv->SetUpdater([&](const std::string& key, const NDArray& recv, NDArray* stored) {
    seen.push_back(key);
    for (int64_t i = 0; i < stored->size(); ++i)
      stored->data<float>()[i] += 2 * recv.data<float>()[i];
  });
  kv->Push(std::vector<std::string>{"c", "b"}, {Ones(kShape, 3), Ones(kShape, 5)});
  std::vector<NDArray> outs = {Ones(kShape, 0), Ones(kShape, 0)};
  kv->Pull(std::vector<std::string>{"b", "c"}, outs);
  kv->WaitAll();
  ExpectAll(outs[0], 11);
  ExpectAll(outs[1], 7);
  // Keys are processed in ascending id order; ids follow first-init order: b < c.
  EXPECT_EQ(seen, (std::vector<std::string>{"b", "c"}));
}

TEST_P(LocalStores, PushPullReadsAllInputsBeforeWritingOutputs) {
  // spec 2.7 / test_pushpull_single_kv_pair: the same 4 arrays of 2.0 are the
  // inputs and outputs of three keys; every output must be 8, not 32.
  auto kv = Make(GetParam());
  kv->Init(kKeys, {Ones(), Ones(), Ones()});
  std::vector<NDArray> shared(4);
  for (auto& s : shared) s = Ones(kShape, 2);
  std::vector<int> keys;
  std::vector<NDArray> vals;
  for (int k : kKeys)
    for (auto& s : shared) {
      keys.push_back(k);
      vals.push_back(s);
    }
  kv->PushPull(keys, vals, keys, vals);
  kv->WaitAll();
  for (auto& s : shared) ExpectAll(s, 8);
}

TEST_P(LocalStores, PushPullInPlaceAndIntoOuts) {
  auto kv = Make(GetParam());
  kv->Init(1, Ones());
  NDArray a = Ones(kShape, 3), b = Ones(kShape, 4);
  kv->PushPull(1, {a, b}, {});  // out = the values
  kv->WaitAll();
  ExpectAll(a, 7);
  ExpectAll(b, 7);
  NDArray out = Ones(kShape, 0);
  kv->PushPull(1, {Ones(kShape, 1)}, {out});
  kv->WaitAll();
  ExpectAll(out, 1);
}

TEST_P(LocalStores, BroadcastInitsAndPulls) {
  auto kv = Make(GetParam());
  std::vector<NDArray> outs = {Ones(kShape, 0), Ones(kShape, 0)};
  kv->Broadcast(4, Ones(kShape, 6), outs);
  kv->WaitAll();
  for (auto& o : outs) ExpectAll(o, 6);
  try {
    kv->Broadcast(4, Ones(kShape, 6), outs);
    FAIL() << "second broadcast of a key must fail";
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate init"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("broadcast"), std::string::npos);
  }
}

TEST_P(LocalStores, InitCopiesTheValue) {
  auto kv = Make(GetParam());
  NDArray v = Ones();
  kv->Init(0, v);
  v.Fill(9);
  NDArray out = Ones(kShape, 0);
  kv->Pull(0, {out});
  kv->WaitAll();
  ExpectAll(out, 1);
}

TEST_P(LocalStores, PushWithoutUpdaterCopiesTheValue) {
  // MXNet aliased a single pushed array (quirk 2); pskv copies it.
  auto kv = Make(GetParam());
  kv->Init(0, Ones());
  NDArray v = Ones(kShape, 5);
  kv->Push(0, {v});
  kv->WaitAll();
  v.Fill(9);
  NDArray out = Ones(kShape, 0);
  kv->Pull(0, {out});
  kv->WaitAll();
  ExpectAll(out, 5);
}

TEST_P(LocalStores, OrderedPerKeyWithPriorities) {
  auto kv = Make(GetParam());
  kv->Init(kKeys, {Ones(), Ones(), Ones()});
  for (int round = 0; round < 20; ++round)
    for (size_t i = 0; i < kKeys.size(); ++i)
      kv->Push(kKeys[i], {Ones(kShape, round)}, -static_cast<int>(i));
  std::vector<NDArray> outs = {Ones(kShape, 0), Ones(kShape, 0), Ones(kShape, 0)};
  kv->Pull(kKeys, outs, 5);
  kv->Wait(kKeys);
  for (auto& o : outs) ExpectAll(o, 19);  // the last push wins without an updater
}

TEST_P(LocalStores, AllDTypesPushAndPull) {
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                  DType::kInt32, DType::kInt64, DType::kInt8, DType::kUInt8}) {
    auto kv = Make(GetParam());
    kv->Init(0, Ones({3}, 1, t));
    kv->Push(0, {Ones({3}, 2, t), Ones({3}, 3, t)});
    NDArray out = Ones({3}, 0, t);
    kv->Pull(0, {out});
    kv->WaitAll();
    ExpectAll(out, 5);
  }
}

TEST_P(LocalStores, BigArraysUseTheThreadedReduction) {
  Options o;
  o.bigarray_bound = 1000;
  o.reduction_threads = 3;
  auto kv = KVStore::Create(GetParam(), o);
  const Shape big = {12345};
  kv->Init(0, Ones(big));
  kv->Push(0, {Ones(big, 1), Ones(big, 2), Ones(big, 3)});
  NDArray out = Ones(big, 0);
  kv->Pull(0, {out});
  kv->WaitAll();
  ExpectAll(out, 6);
}

TEST_P(LocalStores, OptimizerRunsInTheStoreAndStatesSaveAndLoad) {
  auto kv = Make(GetParam());
  kv->SetOptimizer(
      OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.1"}, {"momentum", "0.9"}}));
  kv->Init(0, Ones({2}));
  kv->Push(0, {Ones({2}, 1)});
  NDArray out({2});
  kv->Pull(0, {out});
  kv->WaitAll();
  ExpectAll(out, 0.9f);
  // A file of this process's own: ctest -j runs the "local" and "device" cases at once
  // (a shared name let one remove the other's file: failed once in a fresh clone).
  auto path = (std::filesystem::temp_directory_path() /
               ("pskv_test_states_" + std::to_string(::getpid()) + ".bin"))
                  .string();
  kv->SaveOptimizerStates(path);
  kv->Push(0, {Ones({2}, 1)});
  kv->Pull(0, {out});
  kv->WaitAll();
  const double after_two = out.At(0);
  EXPECT_FLOAT_EQ(after_two, 0.71f);
  // A second store restored from the saved momentum continues identically.
  auto kv2 = Make(GetParam());
  kv2->SetOptimizer(
      OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.1"}, {"momentum", "0.9"}}));
  kv2->Init(0, Ones({2}, 0.9));
  kv2->LoadOptimizerStates(path);
  kv2->Push(0, {Ones({2}, 1)});
  kv2->Pull(0, {out});
  kv2->WaitAll();
  EXPECT_FLOAT_EQ(out.At(0), after_two);
  std::remove(path.c_str());
}

TEST_P(LocalStores, TypeRankAndWorkers) {
  auto kv = Make(GetParam());
  EXPECT_EQ(kv->Type(), GetParam());
  EXPECT_EQ(kv->Rank(), 0);
  EXPECT_EQ(kv->NumWorkers(), 1);
  kv->Barrier();  // a no-op, must not block
}

TEST_P(LocalStores, UpdaterExceptionReachesWait) {
  auto kv = Make(GetParam());
  kv->Init(0, Ones());
  kv->SetUpdater([](int, const NDArray&, NDArray*) { throw std::runtime_error("updater failed"); });
  kv->Push(0, {Ones()});
  EXPECT_THROW(kv->WaitAll(), std::runtime_error);
  kv->WaitAll();  // reported once
}

// ------------------------------------------------------------ error catalogue

TEST_P(LocalStores, Errors) {
  auto kv = Make(GetParam());
  NDArray out = Ones(kShape, 0);
  // uninitialised int key
  try {
    kv->Pull(9, {out});
    FAIL();
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("key 9 has not been inited"), std::string::npos);
  }
  EXPECT_THROW(kv->Push(9, {Ones()}), KeyError);  // MXNet silently created the key
  kv->Init(1, Ones());
  EXPECT_THROW(kv->Init(1, Ones()), KeyError);
  EXPECT_THROW(kv->Init(std::vector<int>{2, 2}, {Ones(), Ones()}), KeyError);
  // shape / dtype mismatch
  EXPECT_THROW(kv->Push(1, {Ones({2, 8})}), ShapeError);
  EXPECT_THROW(kv->Push(1, {Ones(kShape, 1, DType::kFloat64)}), ShapeError);
  NDArray wrong({3});
  EXPECT_THROW(kv->Pull(1, {wrong}), ShapeError);
  // mixed key kinds
  try {
    kv->Init("w", Ones());
    FAIL();
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("Mixed key types"), std::string::npos);
  }
  EXPECT_THROW(kv->Init(-1, Ones()), KeyError);
  // argument counts
  EXPECT_THROW(kv->Push(std::vector<int>{1, 1}, {Ones()}), InvalidArgument);
  EXPECT_THROW(kv->Pull(1, std::vector<NDArray>{}), InvalidArgument);
  // save / load without an optimizer
  EXPECT_THROW(kv->SaveOptimizerStates("/tmp/x"), UsageError);
  EXPECT_THROW(kv->LoadOptimizerStates("/tmp/x"), UsageError);
  kv->WaitAll();
}

TEST_P(LocalStores, StringKeyErrors) {
  auto kv = Make(GetParam());
  NDArray out = Ones(kShape, 0);
  try {
    kv->Pull("nope", {out});
    FAIL();
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'nope' doesn't exist. Did you init?"),
              std::string::npos);
  }
  kv->Init("a", Ones());
  EXPECT_THROW(kv->Init("a", Ones()), KeyError);
  EXPECT_THROW(kv->Push(3, {Ones()}), KeyError);  // mixed
}

TEST(KVStoreFactory, UnknownTypeListsValidTypes) {
  try {
    Make("foo");
    FAIL();
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'foo'"), std::string::npos);
    for (auto t : {"local", "device", "dist_sync", "dist_async", "dist_sync_device"})
      EXPECT_NE(m.find(t), std::string::npos) << t;
  }
  EXPECT_EQ(Make("LOCAL")->Type(), "local");
  EXPECT_EQ(Make("local_allreduce_device")->Type(), "local_allreduce_device");
}

// ------------------------------------------------------------ gradient compression

TEST(LocalCompression, LocalRejectsDeviceAccepts) {
  auto kv = Make("local");
  EXPECT_THROW(kv->SetGradientCompression(CompressionConfig::FromParams({{"type", "2bit"}})),
               UsageError);
  auto dev = Make("device");
  EXPECT_THROW(dev->SetGradientCompression(
                   CompressionConfig::FromParams({{"type", "2bit"}, {"threshold", "-1"}})),
               InvalidArgument);
  dev->SetGradientCompression(
      CompressionConfig::FromParams({{"type", "2bit"}, {"threshold", "0.5"}}));
  dev->Init(0, Ones());
  EXPECT_THROW(dev->SetGradientCompression(CompressionConfig::FromParams({{"type", "2bit"}})),
               UsageError);  // after init
  EXPECT_THROW(dev->Init(1, Ones(kShape, 1, DType::kFloat16)), UsageError);
}

TEST(LocalCompression, TwoBitPerDeviceResidualsExactValues) {
  // Two devices push 0.3 each with threshold 0.5 and no updater (stored = merged):
  // round 1: each r=0.3 -> 0, merged 0; round 2: r=0.6 -> +0.5 each, merged 1.0,
  // residual 0.1; round 3: r=0.4 -> 0; round 4: r=0.7 -> 0.5 each -> 1.0.
  auto kv = Make("device");
  kv->SetGradientCompression(
      CompressionConfig::FromParams({{"type", "2bit"}, {"threshold", "0.5"}}));
  kv->Init(0, Ones({5}, 0));
  const double want[] = {0, 1.0, 0, 1.0};
  for (double w : want) {
    kv->Push(0, {Ones({5}, 0.3), Ones({5}, 0.3)});
    NDArray out({5});
    kv->Pull(0, {out});
    kv->WaitAll();
    ExpectAll(out, w);
  }
  // Negative values and a single device (compression applies even then).
  auto kv1 = Make("device");
  kv1->SetGradientCompression(
      CompressionConfig::FromParams({{"type", "2bit"}, {"threshold", "0.5"}}));
  kv1->Init(0, Ones({3}, 0));
  NDArray g = NDArray::FromVector({-0.7f, 0.2f, 2.0f});
  kv1->Push(0, {g});
  NDArray out({3});
  kv1->Pull(0, {out});
  kv1->WaitAll();
  EXPECT_EQ(out.ToDoubles(), (std::vector<double>{-0.5, 0, 0.5}));
}

TEST(LocalCompression, OneBit) {
  auto kv = Make("device");
  kv->SetGradientCompression(CompressionConfig::FromParams({{"type", "1bit"}, {"threshold", "0"}}));
  kv->Init(0, Ones({2}, 0));
  kv->Push(0, {NDArray::FromVector({0.3f, -0.3f})});
  NDArray out({2});
  kv->Pull(0, {out});
  kv->WaitAll();
  EXPECT_EQ(out.ToDoubles(), (std::vector<double>{1, -1}));
}
