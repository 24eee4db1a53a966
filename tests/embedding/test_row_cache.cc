// The worker's cache of hot embedding rows (src/embedding/row_cache.h), against a real
// table: S = 0 reads the table exactly, S > 0 never serves a row more than S steps
// older than the table's, the capacity bound and the eviction order.
#include <gtest/gtest.h>

#include <map>

#include "embedding/embedding_test_util.h"
#include "embedding/row_cache.h"
#include "embedding/table.h"
#include "pskv/error.h"

namespace pskv::embedding {
namespace {

constexpr int64_t kWidth = 4;

TableConfig SmallTable() {
  TableConfig c;
  c.name = "cached";
  c.width = kWidth;
  c.seed = 7;
  c.optimizer = OptimizerConfig::FromParams("adagrad", {{"learning_rate", "0.1"}});
  c.admission.admit_after = 2;  // some ids read the initializer (version -1)
  return c;
}

// The worker side of one step: plan, pull what the plan lists (rows and versions)
// from the table, fill, read the batch.
std::vector<float> CachedRead(RowCache& cache, Table& table, const std::vector<uint64_t>& ids,
                              int64_t step) {
  const std::vector<uint64_t> fetch =
      cache.Plan(ids.data(), static_cast<int64_t>(ids.size()), step);
  std::vector<float> rows(fetch.size() * kWidth);
  std::vector<int64_t> versions(fetch.size(), -1);
  table.Pull(fetch.data(), static_cast<int64_t>(fetch.size()), rows.data());
  for (size_t i = 0; i < fetch.size(); ++i) {
    Table::RowView r;
    if (table.Row(fetch[i], &r)) versions[i] = r.last_step;
  }
  cache.Fill(fetch.data(), static_cast<int64_t>(fetch.size()), rows.data(), versions.data());
  std::vector<float> out(ids.size() * kWidth);
  cache.Read(ids.data(), static_cast<int64_t>(ids.size()), out.data());
  return out;
}

std::vector<float> Grads(const std::vector<uint64_t>& ids, int64_t step) {
  std::vector<float> g(ids.size() * kWidth);
  for (size_t i = 0; i < g.size(); ++i)
    g[i] =
        static_cast<float>((ids[i / kWidth] + static_cast<uint64_t>(step) + i) % 17) / 17.0f - 0.5f;
  return g;
}

std::vector<uint64_t> Batch(test::Zipf& zipf, int n) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(zipf.Next());
  return ids;
}

// S = 0: every read equals a direct pull of the table at that step, bit for bit.
TEST(EmbeddingRowCache, StalenessZeroEqualsADirectPull) {
  Table table(SmallTable());
  RowCache cache({kWidth, 64, 0, 16});
  test::Zipf zipf(400, 1.1, 3);
  for (int64_t step = 0; step < 80; ++step) {
    const std::vector<uint64_t> ids = Batch(zipf, 48);
    const std::vector<float> got = CachedRead(cache, table, ids, step);
    std::vector<float> want(ids.size() * kWidth);
    table.Pull(ids.data(), static_cast<int64_t>(ids.size()), want.data());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "step " << step;
    // Reading again in the same step fetches nothing (the rows are as of this step).
    EXPECT_TRUE(cache.Plan(ids.data(), static_cast<int64_t>(ids.size()), step).empty());
    table.Push(step, ids.data(), static_cast<int64_t>(ids.size()), Grads(ids, step).data());
  }
  const RowCacheStats st = cache.Stats();
  EXPECT_EQ(st.planned, st.hits + st.fetched);
  EXPECT_EQ(st.planned, 2 * st.hits);  // S = 0: only the second plan of a step hits
}

// S > 0: a row served at step t is the table's row as of a step in [t - S, t] (checked
// against every step's snapshot), its version is the table's version at that step,
// and hot rows are served from the cache.
TEST(EmbeddingRowCache, NoRowIsServedMoreThanSStepsStale) {
  for (int64_t S : {1, 4, 16}) {
    SCOPED_TRACE(S);
    Table table(SmallTable());
    RowCache cache({kWidth, 128, S, 16});
    test::Zipf zipf(400, 1.1, 5);
    std::vector<std::map<uint64_t, std::vector<float>>> seen;  // the table at each step's reads
    int64_t served_stale = 0;
    for (int64_t step = 0; step < 100; ++step) {
      const std::vector<uint64_t> ids = Batch(zipf, 48);
      // The table as this step reads it: every id any step reads.
      std::map<uint64_t, std::vector<float>> now;
      for (uint64_t rank = 0; rank < 400; ++rank) {
        const uint64_t id = test::Zipf::IdOf(rank);
        std::vector<float> v(kWidth);
        table.Pull(&id, 1, v.data());
        now[id] = v;
      }
      seen.push_back(now);
      const std::vector<float> got = CachedRead(cache, table, ids, step);
      for (size_t i = 0; i < ids.size(); ++i) {
        const std::vector<float> v(got.begin() + static_cast<int64_t>(i) * kWidth,
                                   got.begin() + static_cast<int64_t>(i + 1) * kWidth);
        bool ok = false;
        for (int64_t back = 0; back <= S && back <= step && !ok; ++back)
          ok = seen[static_cast<size_t>(step - back)].at(ids[i]) == v;
        ASSERT_TRUE(ok) << "id " << ids[i] << " at step " << step;
        if (v != now.at(ids[i])) ++served_stale;
        int64_t version, fetched;
        ASSERT_TRUE(cache.Version(ids[i], &version, &fetched));
        EXPECT_GE(fetched, step - S);
        EXPECT_LE(version, fetched);
      }
      table.Push(step, ids.data(), static_cast<int64_t>(ids.size()), Grads(ids, step).data());
    }
    const RowCacheStats st = cache.Stats();
    EXPECT_GT(served_stale, 0);  // the bound is used, not just met by refetching everything
    EXPECT_GT(st.hits, st.planned / (S == 1 ? 5 : 3));
    EXPECT_EQ(st.planned, st.hits + st.fetched);
  }
}

// The capacity bounds the rows kept between steps; the rows with the fewest aged
// accesses go first, ties by the older last access, then by id; rows of the current
// step stay even beyond the capacity.
TEST(EmbeddingRowCache, CapacityAndEvictionOrder) {
  const std::vector<float> rows(16 * kWidth, 1.0f);
  const std::vector<int64_t> versions(16, 0);
  RowCache cache({kWidth, 4, 1000, 1000});
  auto step = [&](int64_t t, std::vector<uint64_t> ids) {
    const std::vector<uint64_t> fetch = cache.Plan(ids.data(), static_cast<int64_t>(ids.size()), t);
    cache.Fill(fetch.data(), static_cast<int64_t>(fetch.size()), rows.data(), versions.data());
  };
  step(0, {1, 2, 3, 4});  // counts 1
  step(1, {1, 2, 3});     // 1, 2, 3: 2 accesses
  step(2, {1, 2});        // 1, 2: 3
  EXPECT_EQ(cache.Stats().cached, 4);
  step(3, {5});  // 5 cached, over capacity: 4 (1 access) goes; down to 4 - 0 = 4
  EXPECT_FALSE(cache.Contains(4));
  for (uint64_t id : {1, 2, 3, 5}) EXPECT_TRUE(cache.Contains(id)) << id;
  step(4, {6});  // 5 (1 access, step 3) goes: 3 has 2 accesses
  EXPECT_FALSE(cache.Contains(5));
  EXPECT_TRUE(cache.Contains(3));
  step(5, {7});  // 6 and ... : 6 has 1 access (step 4): it goes
  EXPECT_FALSE(cache.Contains(6));
  // Ties: 8 and 9 both with one access at step 6; the next fill evicts the smaller id.
  step(6, {8, 9});  // over by 2: 7 (1 access, step 5) and 3 (2 accesses)
  EXPECT_FALSE(cache.Contains(7));
  EXPECT_FALSE(cache.Contains(3));
  step(7, {10});  // 8 and 9 tie (1 access, step 6): 8 goes (smaller id)
  EXPECT_FALSE(cache.Contains(8));
  EXPECT_TRUE(cache.Contains(9));
  EXPECT_EQ(cache.Stats().cached, 4);
  // A batch larger than the capacity is cached whole for its step, then trimmed.
  step(8, {20, 21, 22, 23, 24, 25});
  EXPECT_EQ(cache.Stats().cached, 6 + 0);  // 1, 2, 9, 10 went; the 6 stay
  for (uint64_t id : {20, 21, 22, 23, 24, 25}) EXPECT_TRUE(cache.Contains(id));
  step(9, {1});
  EXPECT_LE(cache.Stats().cached, 4);
  EXPECT_TRUE(cache.Contains(1));
}

// Aging: counts halve every aging_steps steps, so a row hot long ago loses to a row
// hot now.
TEST(EmbeddingRowCache, AgingLetsOldHotRowsGo) {
  const std::vector<float> rows(4 * kWidth, 0.5f);
  const std::vector<int64_t> versions(4, 0);
  RowCache cache({kWidth, 2, 1000, 4});
  auto step = [&](int64_t t, std::vector<uint64_t> ids) {
    const std::vector<uint64_t> fetch = cache.Plan(ids.data(), static_cast<int64_t>(ids.size()), t);
    cache.Fill(fetch.data(), static_cast<int64_t>(fetch.size()), rows.data(), versions.data());
  };
  for (int64_t t = 0; t < 8; ++t) step(t, {1});    // 1: 8 accesses by step 7
  for (int64_t t = 40; t < 43; ++t) step(t, {2});  // 2: 3 accesses at steps 40-42
  // 1's count (last aged at step 7, period 1) ages by 9 periods to 0 < 3.
  step(43, {3});
  EXPECT_FALSE(cache.Contains(1));
  EXPECT_TRUE(cache.Contains(2));
  EXPECT_TRUE(cache.Contains(3));
}

TEST(EmbeddingRowCache, MisuseIsRefused) {
  EXPECT_THROW(RowCache({0, 4, 0, 1}), InvalidArgument);
  EXPECT_THROW(RowCache({4, 0, 0, 1}), InvalidArgument);
  EXPECT_THROW(RowCache({4, 4, -1, 1}), InvalidArgument);
  RowCache cache({kWidth, 4, 0, 16});
  const uint64_t id = 9;
  EXPECT_EQ(cache.Plan(&id, 1, 3).size(), 1u);
  std::vector<float> out(kWidth);
  EXPECT_THROW(cache.Read(&id, 1, out.data()), UsageError);  // not filled
  EXPECT_THROW(cache.Plan(&id, 1, 2), InvalidArgument);      // step went back
}

}  // namespace
}  // namespace pskv::embedding
