// A worker of the dynamic embedding tables' real-process jobs (test_dist.cc,
// "Embedding*"), started by pskv-launch with W workers and S servers:
//
//   embedding_worker SCENARIO ROUNDS
//
//  sync    Each round every worker pushes gradients for a Zipf-distributed batch of
//          u64 ids (repeats and ids with the high bit set included; a function of rank
//          and round) to two tables:
//            A  AdaGrad, exact admission after 2 sightings, a TTL of 3 steps;
//            B  Adam, a counting Bloom filter (admission after 2), a capacity of 30 W
//               rows per server (LRU eviction).
//          Every worker computes the same references in process: A as one
//          embedding::Table pushed, each round, the workers' de-duplicated batches
//          concatenated in rank order; B as one Table per server (capacity and the
//          filter are per server) pushed the same ids that server holds. After the
//          rounds every id ever pushed is pulled: rows must be bit-equal, and an id
//          must have a row (and the same version) exactly when the reference has one.
//  async   The same with dist_async and one worker: each push is applied when it
//          arrives, at the table's next step, so the references are the same.
//  misuse  Typed errors naming the fix: ids of another dtype, gradients of another
//          width or dtype, a push over a server's memory budget (refused for every
//          worker, the table unchanged).
//  replicas  What replication does not cover yet (spare servers, PSKV_SPARE_SERVERS):
//          Create fails on every worker with a UsageError naming the setting.
// Exit status 0 = every check passed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "embedding/batch.h"
#include "embedding/table.h"
#include "embedding_zipf.h"
#include "pskv/embedding.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"

using namespace pskv;
using namespace embedding_job;

namespace {

int g_failures = 0;
void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "embedding_worker: CHECK FAILED: %s\n", what.c_str());
    ++g_failures;
  }
}

EmbeddingConfig ConfigA() {
  EmbeddingConfig c;
  c.name = "A";
  c.width = 8;
  c.seed = 3;
  c.optimizer = OptimizerConfig::For("adagrad");
  c.optimizer.learning_rate = 0.1;
  c.admission.admit_after = 2;
  c.ttl_steps = 3;
  return c;
}
EmbeddingConfig ConfigB(int workers) {
  EmbeddingConfig c;
  c.name = "B";
  c.width = 4;
  c.init.kind = EmbeddingInitializer::Kind::kNormal;
  c.optimizer = OptimizerConfig::For("adam");
  c.optimizer.learning_rate = 0.01;
  c.admission = EmbeddingAdmission::CountingBloom(2, 2000, 0.01);
  c.capacity = 30 * workers;  // so that it binds with one worker too
  return c;
}

// The pulled rows and versions of `ids` against references: ref(id) is the table
// holding id.
template <typename RefOf>
void Compare(EmbeddingTable& t, const std::vector<uint64_t>& ids, RefOf&& ref_of,
             const std::string& name) {
  NDArray versions;
  const NDArray rows = t.Pull(IdsArray(ids), &versions);
  const int64_t w = t.config().width;
  int live = 0, differ = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    embedding::Table& ref = ref_of(ids[i]);
    std::vector<float> want(static_cast<size_t>(w));
    ref.Pull(&ids[i], 1, want.data());
    embedding::Table::RowView v;
    const bool has = ref.Row(ids[i], &v);
    live += has;
    const int64_t got_version = versions.data<int64_t>()[i];
    if (std::memcmp(rows.data<float>() + static_cast<int64_t>(i) * w, want.data(),
                    static_cast<size_t>(w) * 4) != 0 ||
        got_version != (has ? v.last_step : -1))
      ++differ;
  }
  Check(differ == 0, name + ": " + std::to_string(differ) + " of " + std::to_string(ids.size()) +
                         " ids differ from the reference");
  Check(live > 0 && live < static_cast<int>(ids.size()),
        name + ": admission left " + std::to_string(live) + " rows of " +
            std::to_string(ids.size()) + " ids (expected some, not all)");
}

void Sync(KVStore& kv, int rounds) {
  const int W = kv.NumWorkers(), rank = kv.Rank();
  const uint32_t S = static_cast<uint32_t>(std::atoi(std::getenv("DMLC_NUM_SERVER")));
  auto a = EmbeddingTable::Create(kv, 40, ConfigA());
  auto b = EmbeddingTable::Create(kv, 41, ConfigB(W));
  embedding::Table ref_a(ConfigA());
  std::vector<std::unique_ptr<embedding::Table>> ref_b;
  for (uint32_t s = 0; s < S; ++s) ref_b.push_back(std::make_unique<embedding::Table>(ConfigB(W)));
  const Zipf zipf;
  std::vector<uint64_t> seen;
  for (int r = 0; r < rounds; ++r) {
    std::vector<uint64_t> all_ids;  // the round's pushes, de-duplicated per worker, rank order
    std::vector<float> all_a, all_b;
    for (int w = 0; w < W; ++w) {
      const auto ids = zipf.Batch(w, r, 64);
      const auto ga = Grads(ids, 8, w, r), gb = Grads(ids, 4, w, r + 100);
      if (w == rank) {
        a->Push(IdsArray(ids), Floats(ga, 8));
        b->Push(IdsArray(ids), Floats(gb, 4));
      }
      const auto d = embedding::DistinctOf(ids.data(), static_cast<int64_t>(ids.size()));
      const auto sa = embedding::SumGrads(d, ga.data(), static_cast<int64_t>(ids.size()), 8);
      const auto sb = embedding::SumGrads(d, gb.data(), static_cast<int64_t>(ids.size()), 4);
      all_ids.insert(all_ids.end(), d.ids.begin(), d.ids.end());
      all_a.insert(all_a.end(), sa.begin(), sa.end());
      all_b.insert(all_b.end(), sb.begin(), sb.end());
    }
    ref_a.Push(r, all_ids.data(), static_cast<int64_t>(all_ids.size()), all_a.data());
    for (uint32_t s = 0; s < S; ++s) {
      std::vector<uint64_t> ids;
      std::vector<float> g;
      for (size_t i = 0; i < all_ids.size(); ++i)
        if (EmbeddingShardOf(all_ids[i], S) == s) {
          ids.push_back(all_ids[i]);
          g.insert(g.end(), all_b.begin() + static_cast<int64_t>(i) * 4,
                   all_b.begin() + static_cast<int64_t>(i + 1) * 4);
        }
      ref_b[s]->Push(r, ids.data(), static_cast<int64_t>(ids.size()), g.data());
    }
    seen.insert(seen.end(), all_ids.begin(), all_ids.end());
  }
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  Compare(
      *a, seen, [&](uint64_t) -> embedding::Table& { return ref_a; }, "table A");
  Compare(
      *b, seen, [&](uint64_t id) -> embedding::Table& { return *ref_b[EmbeddingShardOf(id, S)]; },
      "table B");
  // The job exercised what it claims to compare.
  const auto sa = ref_a.Stats();
  Check(sa.dropped_grads > 0 && sa.evicted_ttl > 0, "table A: no admission drop or TTL eviction");
  int64_t capacity_evicted = 0;
  for (auto& t : ref_b) capacity_evicted += t->Stats().evicted_capacity;
  Check(capacity_evicted > 0, "table B: no capacity eviction");
  std::printf(
      "embedding_worker[%d]: %zu ids; A: %lld live, %lld TTL-evicted, %lld grads dropped; "
      "B: %lld evicted for capacity\n",
      rank, seen.size(), static_cast<long long>(sa.live), static_cast<long long>(sa.evicted_ttl),
      static_cast<long long>(sa.dropped_grads), static_cast<long long>(capacity_evicted));
}

template <typename E, typename F>
void ExpectError(F&& f, const std::string& what, const std::string& needle) {
  try {
    f();
    Check(false, what + ": no error");
  } catch (const E& e) {
    Check(std::string(e.what()).find(needle) != std::string::npos,
          what + ": the message does not say '" + needle + "': " + e.what());
  } catch (const std::exception& e) {
    Check(false, what + ": another error: " + e.what());
  }
}

void Misuse(KVStore& kv, int) {
  EmbeddingConfig c = ConfigA();
  c.admission.admit_after = 1;
  c.max_bytes = 256 << 10;  // per server: about 2,000 rows of width 8 with AdaGrad
  auto t = EmbeddingTable::Create(kv, 50, c);
  NDArray ids32(Shape{2}, DType::kInt32);
  ExpectError<InvalidArgument>(
      [&] {
        t->Push(ids32, NDArray(Shape{2, 8}));
      },
      "int32 ids", "must be int64");
  NDArray ids = IdsArray({1, 2});
  ExpectError<ShapeError>([&] { t->Push(ids, NDArray(Shape{2, 5})); }, "width 5", "width is 8");
  ExpectError<ShapeError>(
      [&] {
        t->Push(ids, NDArray(Shape{2, 8}, DType::kFloat64));
      },
      "float64 gradients", "float32");
  // Over budget: 20000 ids per worker; refused whole on every worker (a sync round).
  std::vector<uint64_t> many;
  for (uint64_t i = 0; i < 20000; ++i) many.push_back(i * 7919 + static_cast<uint64_t>(kv.Rank()));
  const std::vector<float> g(many.size() * 8, 0.5f);
  ExpectError<UsageError>([&] { t->Push(IdsArray(many), Floats(g, 8)); }, "over max_bytes",
                          "max_bytes");
  NDArray versions;
  t->Pull(IdsArray({many[0], many[1]}), &versions);
  Check(versions.data<int64_t>()[0] == -1, "a refused push left a row");
  t->Push(ids, NDArray(Shape{2, 8}));  // the table still takes pushes
  t->Pull(ids, &versions);
  Check(versions.data<int64_t>()[0] == 0, "the first applied push is not step 0");
}

void Replicas(KVStore& kv, int) {
  ExpectError<Error>([&] { EmbeddingTable::Create(kv, 60, ConfigA()); }, "create, replicated",
                     "are not supported yet");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: embedding_worker SCENARIO ROUNDS\n");
    return 2;
  }
  const std::string scenario = argv[1];
  const int rounds = std::atoi(argv[2]);
  try {
    auto kv = KVStore::Create(scenario == "async" ? "dist_async" : "dist_sync");
    if (scenario == "sync" || scenario == "async") {
      Sync(*kv, rounds);
    } else if (scenario == "misuse") {
      Misuse(*kv, rounds);
    } else if (scenario == "replicas") {
      Replicas(*kv, rounds);
    } else {
      std::fprintf(stderr, "embedding_worker: unknown scenario %s\n", scenario.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embedding_worker: %s\n", e.what());
    return 1;
  }
  return g_failures ? 1 : 0;
}
