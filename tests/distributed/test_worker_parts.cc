// The dist worker's parts that need no nodes: grouping a call, the key table's checks,
// the strict-rounds rule (RoundRules) and the choice of fusion groups.
#include <gtest/gtest.h>

#include "kvstore/distributed/worker/fusion.h"
#include "kvstore/distributed/worker/key_table.h"
#include "pskv/error.h"

using namespace pskv;
using namespace pskv::dist;

namespace {

std::string Name(int k) {
  return std::to_string(k);
}

std::unique_ptr<KeyMeta> Dense(int key, int64_t n, int servers = 1, int64_t bound = 1000) {
  auto m = std::make_unique<KeyMeta>();
  m->key = key;
  m->shape = {n};
  m->dtype = DType::kFloat32;
  m->size = n;
  PlaceDense(m.get(), 0, servers, bound, {}, 1 << 20, nullptr);
  return m;
}

}  // namespace

TEST(WorkerParts, GroupSortsKeysStablyAndRefusesEmptyArrays) {
  const std::vector<NDArray> a = {NDArray({1}), NDArray({2}), NDArray({3}), NDArray({4})};
  const Grouped g = Group({5, 2, 5, 2}, a);
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_EQ(g.groups[0].key, 2);
  EXPECT_EQ(g.groups[0].count, 2u);
  EXPECT_EQ(g.At(0, 0, a).size(), 2);  // the order given within a key
  EXPECT_EQ(g.At(0, 1, a).size(), 4);
  EXPECT_EQ(g.At(1, 0, a).size(), 1);
  EXPECT_TRUE(g.Has(5));
  EXPECT_FALSE(g.Has(3));
  EXPECT_THROW(Group({1}, {NDArray()}), InvalidArgument);
}

TEST(WorkerParts, PlacementSlicesBigKeysOverServers) {
  auto small = Dense(3, 10, 2, 100);
  EXPECT_EQ(small->slices.size(), 1u);
  auto big = Dense(3, 1000, 2, 100);
  ASSERT_EQ(big->slices.size(), 2u);
  EXPECT_NE(big->slices[0].server, big->slices[1].server);
  EXPECT_EQ(big->lens[0] + big->lens[1], 4000u);
  EXPECT_EQ(big->ps_keys.size(), 2u);
}

TEST(WorkerParts, KeyTableChecksWithoutChangingAnything) {
  KeyTable t(Name);
  t.Add(Dense(1, 4));
  t.Add(Dense(3, 4));
  auto sparse = Dense(2, 4);
  sparse->sparse = true;
  t.Add(std::move(sparse));
  const std::vector<NDArray> ok = {NDArray({4}), NDArray({4})};
  const auto metas = t.Check(Group({3, 1}, ok), ok, "Push", "pushed value");
  ASSERT_EQ(metas.size(), 2u);
  EXPECT_EQ(metas[0]->key, 1);
  EXPECT_EQ(metas[0]->next->key, 2);  // linked in key order
  EXPECT_EQ(metas[1]->key, 3);
  EXPECT_EQ(metas[0]->pushes, 0);  // a check records nothing
  EXPECT_THROW(t.Check(Group({4}, {NDArray({4})}), {NDArray({4})}, "Push", "v"), KeyError);
  EXPECT_THROW(t.Check(Group({2}, {NDArray({4})}), {NDArray({4})}, "Push", "v"), UsageError);
  EXPECT_THROW(t.Check(Group({1}, {NDArray({5})}), {NDArray({5})}, "Push", "v"), ShapeError);
  EXPECT_THROW(t.FindSparse(1, "RowSparsePull"), UsageError);
  EXPECT_EQ(t.FindSparse(2, "RowSparsePull").key, 2);
}

TEST(WorkerParts, RoundRulesAdmitRoundsAndRecordOnlyWhenAllPass) {
  auto a = Dense(1, 4), b = Dense(2, 4);
  using S = RoundRules::Step;
  std::vector<KeyMeta*> both = {a.get(), b.get()};
  RoundRules::Admit(both, S::kPull, "Pull", Name);  // pulls before the first push are free
  RoundRules::Admit(both, S::kPush, "Push", Name);
  EXPECT_EQ(a->pushes, 1);
  EXPECT_FALSE(a->pulled);
  RoundRules::Admit({a.get()}, S::kPull, "Pull", Name);
  // b was pushed and not pulled: a second push of both breaks the rule, and a is not
  // recorded either.
  EXPECT_THROW(RoundRules::Admit(both, S::kPush, "Push", Name), UsageError);
  EXPECT_EQ(a->pushes, 1);
  EXPECT_TRUE(a->pulled);
  // A second pull of a's round is a pull of the next round before pushing it.
  EXPECT_THROW(RoundRules::Admit({a.get()}, S::kPull, "Pull", Name), UsageError);
  RoundRules::Admit({a.get()}, S::kPushPull, "PushPull", Name);
  EXPECT_EQ(a->pushes, 2);
  EXPECT_TRUE(a->pulled);  // a push-pull is its own round's pull
}

TEST(WorkerParts, FusionGroupsSmallKeysOfOneServerUpToTheCap) {
  std::vector<std::unique_ptr<KeyMeta>> keys;
  for (int k = 0; k < 5; ++k) keys.push_back(Dense(k, 4));  // 16 bytes each, one server
  keys.push_back(Dense(5, 100));                            // 400 bytes: too big to fuse
  std::vector<KeyMeta*> metas;
  for (auto& k : keys) metas.push_back(k.get());
  std::vector<char> fused(metas.size(), 0);
  auto groups = FusionGroups(metas, 64, 32, &fused);  // at most 2 keys of 16 bytes per group
  ASSERT_EQ(groups.size(), 2u);                       // {0,1}, {2,3}; 4 alone is not fused
  EXPECT_EQ(groups[0], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(groups[1], (std::vector<size_t>{2, 3}));
  EXPECT_EQ(fused, (std::vector<char>{1, 1, 1, 1, 0, 0}));
  std::vector<char> none(metas.size(), 0);
  EXPECT_TRUE(FusionGroups(metas, 0, 1 << 20, &none).empty());  // fusion off
}
