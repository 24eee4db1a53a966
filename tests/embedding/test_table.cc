// The dynamic embedding table (src/embedding/): sharding, initializer, lazy
// optimizer updates against pskv::Optimizer, admission, eviction, memory, bad input.
#include <gtest/gtest.h>

#include <cstring>
#include <unordered_map>

#include "embedding/admission.h"
#include "embedding/embedding_test_util.h"
#include "embedding/id_map.h"
#include "embedding/table.h"
#include "pskv/error.h"
#include "pskv/optimizer.h"

namespace pskv::embedding {
namespace {

using test::Snapshot;

TableConfig Config(const std::string& opt = "adagrad", int64_t width = 8) {
  TableConfig c;
  c.width = width;
  c.seed = 42;
  c.optimizer = OptimizerConfig::For(opt);
  return c;
}

std::vector<float> Grad(int64_t n, int64_t width, float base) {
  std::vector<float> g(static_cast<size_t>(n * width));
  for (size_t i = 0; i < g.size(); ++i) g[i] = base + 0.01f * static_cast<float>(i % 17) - 0.07f;
  return g;
}

std::vector<float> PullOne(Table& t, uint64_t id) {
  std::vector<float> v(static_cast<size_t>(t.config().width));
  t.Pull(&id, 1, v.data());
  return v;
}

void ExpectShardsBalanced(const std::vector<uint64_t>& ids, uint32_t shards) {
  std::vector<int64_t> count(shards);
  for (uint64_t id : ids) ++count[ShardOf(id, shards)];
  const double mean = static_cast<double>(ids.size()) / shards;
  for (uint32_t s = 0; s < shards; ++s)
    // Six standard deviations of a fair binomial count.
    EXPECT_NEAR(count[s], mean, 6 * std::sqrt(mean)) << "shard " << s << " of " << shards;
}

// Item 1: a hash of the id spreads sequential ids and ids that are multiples of 2^32
// (which a modulo or a low-bits shard function would send to one shard) evenly.
TEST(EmbeddingShards, BalancedForSequentialAndStructuredIds) {
  std::vector<uint64_t> seq, high, zipf;
  for (uint64_t i = 0; i < (1 << 18); ++i) {
    seq.push_back(i);
    high.push_back(i << 32);
  }
  for (uint32_t s : {2u, 3u, 8u, 16u, 100u}) {
    ExpectShardsBalanced(seq, s);
    ExpectShardsBalanced(high, s);
  }
  EXPECT_EQ(ShardOf(12345, 1), 0u);
  for (uint64_t id : {uint64_t{0}, ~uint64_t{0}, uint64_t{1} << 63}) EXPECT_LT(ShardOf(id, 7), 7u);
}

// The initializer is a pure function of (seed, id, column): two tables (replicas, a
// restart) agree, a row starts from the value a pull read before it existed.
TEST(EmbeddingTable, InitializerIsDeterministicPerId) {
  for (auto kind :
       {Initializer::Kind::kUniform, Initializer::Kind::kNormal, Initializer::Kind::kZeros}) {
    TableConfig c = Config("sgd", 16);
    c.init.kind = kind;
    c.init.a = kind == Initializer::Kind::kNormal ? 0.5 : -0.25;
    c.init.b = 0.25;
    Table a(c), b(c);
    const uint64_t id = 0xfedcba9876543210ULL;
    const std::vector<float> before = PullOne(a, id);
    EXPECT_EQ(before, PullOne(b, id));
    std::vector<float> g(16, 0.0f);
    a.Push(1, &id, 1, g.data());  // a zero gradient: the row keeps its initial value
    EXPECT_TRUE(a.Contains(id));
    EXPECT_EQ(PullOne(a, id), before);
    if (kind == Initializer::Kind::kZeros) {
      EXPECT_EQ(before, std::vector<float>(16, 0.0f));
      continue;
    }
    EXPECT_NE(PullOne(a, id + 1), before);
    TableConfig other = c;
    other.seed = 43;
    Table d(other);
    EXPECT_NE(PullOne(d, id), before);
  }
  // Moments over many ids: uniform [-0.25, 0.25) and normal(0.5, 0.25).
  TableConfig c = Config("sgd", 4);
  c.init = {Initializer::Kind::kUniform, -0.25, 0.25};
  Table u(c);
  c.init = {Initializer::Kind::kNormal, 0.5, 0.25};
  Table nrm(c);
  double su = 0, sn = 0, sn2 = 0;
  float lo = 1, hi = -1;
  const int n = 20000;
  for (uint64_t id = 0; id < static_cast<uint64_t>(n); ++id) {
    for (float x : PullOne(u, id << 32)) {
      su += x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    for (float x : PullOne(nrm, id)) {
      sn += x;
      sn2 += double(x) * x;
    }
  }
  EXPECT_GE(lo, -0.25f);
  EXPECT_LT(hi, 0.25f);
  EXPECT_NEAR(su / (4 * n), 0.0, 0.005);
  const double mean = sn / (4 * n);
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(std::sqrt(sn2 / (4 * n) - mean * mean), 0.25, 0.005);
}

// Ids are the whole u64 space, and repeated ids of one push are summed in order.
TEST(EmbeddingTable, WholeU64SpaceAndDuplicatesSummed) {
  Table a(Config("sgd", 4)), b(Config("sgd", 4));
  const std::vector<uint64_t> ids{0, ~uint64_t{0}, uint64_t{1} << 63, 0};
  const std::vector<float> g = Grad(4, 4, 0.5f);
  a.Push(1, ids.data(), 4, g.data());
  EXPECT_EQ(a.Stats().live, 3);
  std::vector<float> sum(g.begin(), g.begin() + 12);
  for (int j = 0; j < 4; ++j)
    sum[static_cast<size_t>(j)] = g[static_cast<size_t>(j)] + g[12 + static_cast<size_t>(j)];
  b.Push(1, ids.data(), 3, sum.data());
  EXPECT_EQ(Snapshot(a), Snapshot(b));
  Table::RowView r;
  ASSERT_TRUE(a.Row(0, &r));
  EXPECT_EQ(r.t, 1);  // one update, of the sum
}

// Item 4: a row pushed on k of the steps equals pskv::Optimizer applied to that row on
// those k steps (lazy: its own step count, nothing on the other steps), bit for bit,
// for every built-in rule, with weight decay, clipping, rescaling and a schedule.
TEST(EmbeddingTable, LazyUpdatesEqualTheDenseOptimizerOnTheRowsSteps) {
  struct Case {
    std::string type;
    std::map<std::string, std::string> params;
  };
  const std::vector<Case> cases = {
      {"sgd", {{"learning_rate", "0.1"}, {"wd", "0.01"}}},
      {"sgd", {{"learning_rate", "0.1"}, {"momentum", "0.9"}, {"clip_gradient", "0.3"}}},
      {"nag", {{"learning_rate", "0.05"}, {"momentum", "0.8"}}},
      {"adam", {{"learning_rate", "0.01"}, {"wd", "0.001"}, {"rescale_grad", "0.5"}}},
      {"adamw", {{"learning_rate", "0.01"}, {"wd", "0.01"}}},
      {"rmsprop", {{"learning_rate", "0.01"}}},
      {"rmsprop", {{"learning_rate", "0.01"}, {"centered", "1"}, {"momentum", "0.5"}}},
      {"adagrad", {{"learning_rate", "0.1"}, {"wd", "0.001"}}},
      {"adagrad",
       {{"learning_rate", "0.1"},
        {"lr_scheduler", "factor"},
        {"lr_step", "3"},
        {"lr_factor", "0.5"}}},
  };
  const int64_t w = 16;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.type);
    TableConfig c = Config(k.type, w);
    c.optimizer = OptimizerConfig::FromParams(k.type, k.params);
    c.init = {Initializer::Kind::kNormal, 0.0, 0.1};
    Table table(c);
    // Row 7 on some steps only; row 11 on every step; the reference: one Optimizer per
    // row, Update with the schedule pinned at the push's step.
    const uint64_t ids7[] = {7, 11}, ids11[] = {11};
    Optimizer ref7(c.optimizer), ref11(c.optimizer);
    NDArray w7 = NDArray::FromVector(PullOne(table, 7)),
            w11 = NDArray::FromVector(PullOne(table, 11));
    for (int64_t step = 1; step <= 24; ++step) {
      const bool with7 = step % 3 == 0 || step % 5 == 0;
      std::vector<float> g = Grad(with7 ? 2 : 1, w, 0.1f * static_cast<float>(step % 7) - 0.3f);
      table.Push(step, with7 ? ids7 : ids11, with7 ? 2 : 1, g.data());
      int64_t at = step;
      if (with7) {
        ref7.Update(7, NDArray::FromVector(std::vector<float>(g.begin(), g.begin() + w)), &w7, &at);
        at = step;
        ref11.Update(11, NDArray::FromVector(std::vector<float>(g.begin() + w, g.end())), &w11,
                     &at);
      } else {
        ref11.Update(11, NDArray::FromVector(g), &w11, &at);
      }
    }
    const std::vector<float> r7 = PullOne(table, 7), r11 = PullOne(table, 11);
    EXPECT_EQ(std::memcmp(r7.data(), w7.raw(), w * 4), 0);
    EXPECT_EQ(std::memcmp(r11.data(), w11.raw(), w * 4), 0);
    Table::RowView r;
    ASSERT_TRUE(table.Row(7, &r));
    EXPECT_EQ(r.t, ref7.UpdateCount(7));
    EXPECT_EQ(r.last_step, 24);
  }
}

// Item 2, exact counter: an id gets a row at its N-th sighting; before that a pull
// reads the initializer's value (or zeros) and its gradients are dropped and counted.
TEST(EmbeddingAdmission, ExactCounterAdmitsAtTheNthSighting) {
  for (auto mode : {AdmissionConfig::Mode::kExact, AdmissionConfig::Mode::kCountingBloom}) {
    SCOPED_TRACE(static_cast<int>(mode));
    TableConfig c = Config("sgd", 4);
    c.optimizer = OptimizerConfig::FromParams("sgd", {{"learning_rate", "1"}});
    c.admission.mode = mode;
    c.admission.admit_after = 3;
    c.admission.cbf_counters = 4096;
    Table t(c);
    const uint64_t id = 99;
    const std::vector<float> init = PullOne(t, id);
    for (int64_t step = 1; step <= 2; ++step) {
      const std::vector<float> g = Grad(1, 4, 1.0f);
      t.Push(step, &id, 1, g.data());
      EXPECT_FALSE(t.Contains(id));
      EXPECT_EQ(PullOne(t, id), init);
    }
    EXPECT_EQ(t.Stats().dropped_grads, 2);
    EXPECT_EQ(t.Stats().pending_ids, mode == AdmissionConfig::Mode::kExact ? 1 : 0);
    const std::vector<float> g3 = Grad(1, 4, 2.0f);
    t.Push(3, &id, 1, g3.data());  // the third sighting: a row, with this gradient
    ASSERT_TRUE(t.Contains(id));
    const std::vector<float> row = PullOne(t, id);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(row[j], init[j] - g3[j]);
    EXPECT_EQ(t.Stats().admitted, 1);
    EXPECT_EQ(t.Stats().pending_ids, 0);
    // Within one push: the third occurrence admits, the first two are dropped.
    const uint64_t three[] = {5, 5, 5};
    const std::vector<float> g = Grad(3, 4, 1.0f);
    const std::vector<float> init5 = PullOne(t, 5);
    t.Push(4, three, 3, g.data());
    const std::vector<float> row5 = PullOne(t, 5);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(row5[j], init5[j] - g[8 + j]);
    EXPECT_EQ(t.Stats().dropped_grads, 4);
  }
  TableConfig c = Config("sgd", 4);
  c.admission.admit_after = 2;
  c.unadmitted_pull = TableConfig::UnadmittedPull::kZeros;
  Table z(c);
  EXPECT_EQ(PullOne(z, 1), std::vector<float>(4, 0.0f));
  EXPECT_EQ(z.Stats().pulled_defaults, 1);
}

// The counting Bloom filter: never below the true count, and ids never seen read as
// seen at about the stated false-positive rate.
TEST(EmbeddingAdmission, CountingBloomFilterFalsePositiveRateAsStated) {
  const uint64_t n = 20000;
  const AdmissionConfig cfg = AdmissionConfig::CountingBloom(2, n, 0.01);
  const double stated = CbfFalsePositiveRate(cfg.cbf_counters, cfg.cbf_hashes, n);
  EXPECT_NEAR(stated, 0.01, 0.002);
  Admission a(cfg);
  for (uint64_t i = 0; i < n; ++i) a.Add(test::Zipf::IdOf(i), 1 + i % 3, 1);
  for (uint64_t i = 0; i < n; ++i) EXPECT_GE(a.Count(test::Zipf::IdOf(i)), 1 + i % 3);
  int64_t fp = 0;
  const int64_t probes = 200000;
  for (int64_t i = 0; i < probes; ++i)
    fp += a.Count(test::Zipf::IdOf(n + static_cast<uint64_t>(i))) >= 1;
  const double measured = static_cast<double>(fp) / probes;
  std::printf(
      "counting Bloom filter: %llu counters, %u hashes, %llu ids: false positives "
      "%.4f measured, %.4f stated\n",
      static_cast<unsigned long long>(cfg.cbf_counters), cfg.cbf_hashes,
      static_cast<unsigned long long>(n), measured, stated);
  EXPECT_LT(measured, 1.5 * stated);
  EXPECT_EQ(a.bytes(), cfg.cbf_counters);
}

// Item 3, TTL: rows (and pending counts) not pushed for ttl_steps go.
TEST(EmbeddingEviction, TtlRemovesRowsNotPushedForTSteps) {
  TableConfig c = Config("adam", 4);
  c.ttl_steps = 10;
  c.admission.admit_after = 2;
  Table t(c);
  const std::vector<float> g = Grad(1, 4, 0.5f);
  const uint64_t a = 1, b = 2, p = 3, q = 4;
  t.Push(1, &a, 1, g.data());
  t.Push(1, &a, 1, g.data());
  t.Push(1, &p, 1, g.data());  // pending, seen once
  t.Push(5, &b, 1, g.data());
  t.Push(5, &b, 1, g.data());
  EXPECT_TRUE(t.Contains(a));
  EXPECT_EQ(t.Stats().pending_ids, 1);
  t.Push(11, &q, 1, g.data());  // sweep at 11: a (pushed at 1) is 10 steps old
  EXPECT_FALSE(t.Contains(a));
  EXPECT_TRUE(t.Contains(b));
  EXPECT_EQ(t.Stats().evicted_ttl, 1);
  EXPECT_EQ(t.Stats().pending_ids, 1);  // p forgotten, q counted
  t.ExpireRows(15);
  EXPECT_FALSE(t.Contains(b));
  EXPECT_EQ(t.Stats().live, 0);
  EXPECT_EQ(t.Stats().evicted_ttl, 2);
}

// Item 3, capacity: the least recently pushed rows go first (ties by id), down to
// capacity - capacity/32; rows of the push itself never; a push that cannot fit is
// refused whole.
TEST(EmbeddingEviction, CapacityEvictsLeastRecentlyPushedRows) {
  TableConfig c = Config("sgd", 4);
  c.capacity = 64;
  Table t(c);
  const std::vector<float> g = Grad(1, 4, 0.5f);
  for (uint64_t id = 0; id < 64; ++id) t.Push(static_cast<int64_t>(100 - id), &id, 1, g.data());
  // Oldest: id 63 (step 37), 62, 61.
  const uint64_t fresh = 1000;
  t.Push(101, &fresh, 1, g.data());
  EXPECT_EQ(t.Stats().live, 62);
  EXPECT_EQ(t.Stats().evicted_capacity, 3);
  for (uint64_t id : {61, 62, 63}) EXPECT_FALSE(t.Contains(id));
  EXPECT_TRUE(t.Contains(60));
  EXPECT_TRUE(t.Contains(fresh));

  Table ties(c);
  std::vector<uint64_t> ids(64);
  for (uint64_t i = 0; i < 64; ++i) ids[i] = 500 - i;
  const std::vector<float> g64 = Grad(64, 4, 0.5f);
  ties.Push(1, ids.data(), 64, g64.data());
  ties.Push(2, &fresh, 1, g.data());
  for (uint64_t id : {437, 438, 439}) EXPECT_FALSE(ties.Contains(id)) << id;
  EXPECT_TRUE(ties.Contains(440));

  // 60 live rows of the push + 5 new ones > 64: refused, nothing changed.
  TableConfig small = c;
  Table full(small);
  full.Push(1, ids.data(), 60, g64.data());
  const auto before = Snapshot(full);
  std::vector<uint64_t> more(ids.begin(), ids.begin() + 60);
  for (uint64_t i = 0; i < 5; ++i) more.push_back(9000 + i);
  const std::vector<float> g65 = Grad(65, 4, 0.5f);
  try {
    full.Push(2, more.data(), 65, g65.data());
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("raise the capacity"), std::string::npos) << e.what();
  }
  EXPECT_EQ(Snapshot(full), before);
}

// Item 9: over the memory budget, a push is refused whole (naming the fixes); a
// capacity whose rows exceed the budget is refused at construction.
TEST(EmbeddingTable, MemoryBudgetRefusesAPushWholeAndNamesTheFixes) {
  TableConfig c = Config("adagrad", 64);
  c.max_bytes = 1 << 20;
  Table t(c);
  std::vector<uint64_t> ids(256);
  const std::vector<float> g = Grad(256, 64, 0.5f);
  uint64_t next = 0;
  int64_t step = 0;
  std::map<uint64_t, test::RowCopy> before;
  for (;;) {
    for (uint64_t& id : ids) id = next++;
    before = Snapshot(t);
    const TableStats st = t.Stats();
    try {
      t.Push(++step, ids.data(), 256, g.data());
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("max_bytes"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("capacity"), std::string::npos) << e.what();
      EXPECT_EQ(Snapshot(t), before);  // nothing lost, nothing half-applied
      EXPECT_EQ(t.Stats().dropped_grads, st.dropped_grads);
      break;
    }
    ASSERT_LE(t.Stats().memory_bytes, c.max_bytes);
    ASSERT_LT(next, 100000u) << "the budget never refused";
  }
  EXPECT_GT(t.Stats().live, 0);
  c.capacity = 100000;
  EXPECT_THROW(Table{c}, InvalidArgument);
}

// Item 3: memory per row beyond its values, measured: the row block's header and the
// index entry (optimizer state is counted separately: AdaGrad, one float per value).
TEST(EmbeddingTable, MemoryPerRowBeyondValues) {
  for (int64_t rows : {100000, 150000}) {
    Table t(Config("adagrad", 64));
    std::vector<uint64_t> ids(1000);
    const std::vector<float> g = Grad(1000, 64, 0.5f);
    for (int64_t i = 0; i < rows; i += 1000) {
      for (int64_t k = 0; k < 1000; ++k)
        ids[static_cast<size_t>(k)] = test::Zipf::IdOf(static_cast<uint64_t>(i + k));
      t.Push(1, ids.data(), 1000, g.data());
    }
    const TableStats s = t.Stats();
    ASSERT_EQ(s.live, rows);
    const double per_row = static_cast<double>(s.memory_bytes) / static_cast<double>(rows);
    const double values = 64 * 4, state = 64 * 4;
    std::printf(
        "%lld rows of 64 float32 + AdaGrad state: %.1f bytes per row = %.0f values + "
        "%.0f state + %.1f overhead (block header 32, index %.1f, chunk slack)\n",
        static_cast<long long>(rows), per_row, values, state, per_row - values - state,
        static_cast<double>(16 * IdMap::BucketsFor(static_cast<size_t>(rows))) / rows);
    EXPECT_LE(per_row - values - state, 32 + 16 / 0.375 + 8);
    EXPECT_GE(per_row - values - state, 32 + 16 / 0.75);
  }
}

// Item 9: wrong dtypes and widths are typed errors naming the fix.
TEST(EmbeddingTable, BadInputIsATypedError) {
  Table t(Config("adagrad", 4));
  NDArray ids({2}, DType::kInt64);
  ids.data<int64_t>()[0] = 1;
  ids.data<int64_t>()[1] = -1;  // u64 2^64-1
  NDArray g({2, 4});
  g.Fill(0.5);
  t.Push(1, ids, g);
  EXPECT_TRUE(t.Contains(~uint64_t{0}));
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  NDArray fids({2}, DType::kFloat32);
  EXPECT_THROW(t.Push(1, fids, g), InvalidArgument);
  EXPECT_NE(message([&] { t.Push(1, fids, g); }).find("cast them to int64"), std::string::npos);
  EXPECT_THROW(t.Push(1, ids, NDArray({2, 4}, DType::kFloat64)), ShapeError);
  EXPECT_THROW(t.Push(1, ids, NDArray({2, 5})), ShapeError);
  EXPECT_NE(message([&] {
              t.Push(1, ids, NDArray({2, 5}));
            }).find("must be (2, 4)"),
            std::string::npos);
  NDArray out({2, 3});
  EXPECT_THROW(t.Pull(ids, &out), ShapeError);
  NDArray out_ok({2, 4});
  t.Pull(ids, &out_ok);
  EXPECT_THROW(t.Push(-1, ids, g), InvalidArgument);

  TableConfig c = Config();
  c.dtype = DType::kFloat16;
  EXPECT_THROW(Table{c}, InvalidArgument);
  c = Config();
  c.width = 0;
  EXPECT_THROW(Table{c}, InvalidArgument);
  c = Config();
  c.optimizer.type = "lamb";
  EXPECT_THROW(Table{c}, InvalidArgument);
  c = Config();
  c.optimizer.lr_mult[3] = 0.5;
  EXPECT_THROW(Table{c}, InvalidArgument);
  c = Config();
  c.admission = {AdmissionConfig::Mode::kCountingBloom, 300, 4096, 4};
  EXPECT_THROW(Table{c}, InvalidArgument);
  // A filter over the budget is refused before it is allocated (2^40 bytes here).
  c = Config();
  c.admission = {AdmissionConfig::Mode::kCountingBloom, 2, uint64_t{1} << 40, 4};
  c.max_bytes = 1 << 20;
  EXPECT_THROW(Table{c}, InvalidArgument);
}

// The index under churn (backward-shift deletion) against std::unordered_map.
TEST(EmbeddingIdMap, MatchesAReferenceMapUnderChurn) {
  IdMap m;
  std::unordered_map<uint64_t, uint32_t> ref;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t id = (rng() % 5000) << (rng() % 2 ? 32 : 0);
    if (rng() % 3 == 0) {
      if (IdMap::Entry* e = m.Find(id)) m.Erase(e);
      ref.erase(id);
    } else {
      bool inserted;
      IdMap::Entry& e = m.FindOrInsert(id, &inserted);
      EXPECT_EQ(inserted, ref.count(id) == 0);
      e.a = static_cast<uint32_t>(i + 1);
      ref[id] = e.a;
    }
  }
  EXPECT_EQ(m.size(), ref.size());
  for (auto& [id, v] : ref) {
    const IdMap::Entry* e = m.Find(id);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->a, v);
  }
  size_t seen = 0;
  m.ForEach([&](const IdMap::Entry&) { ++seen; });
  EXPECT_EQ(seen, ref.size());
}

}  // namespace
}  // namespace pskv::embedding
