// A training loop over dynamic embedding tables for the failover tests
// (test_failover_embedding.cc):
//
//   embedding_failover_worker MODE ROUNDS OUT_DIR
//     MODE: sync | async | async-wide | sync-restore
//
// Two tables (A: AdaGrad, exact admission after 2 sightings, a TTL of 4 steps; B:
// Adam, a counting Bloom filter, a capacity of 40 rows per server: LRU eviction).
// Each round every worker pulls the rows of a Zipf batch of u64 ids (a forward pass)
// and pushes gradients that depend on the ids, its rank, the round and the rows it
// pulled (so a lost, repeated or stale update changes every later round). After round
// r it creates OUT_DIR/w<rank>.r<r>; at the end it pulls every id any worker pushed
// and writes the rows and versions of both tables to OUT_DIR/w<rank>.weights (each
// round's time in ms to OUT_DIR/w<rank>.times). dist_sync or dist_async (the tests run
// async with one worker: the order of its pushes is the table's). async-wide: table A's
// rows are 64 times wider (512 floats: a push of the batch's ~30 distinct ids is about
// 64 KiB, some above, some below: big replicated updates overtaken by smaller ones).
// sync-restore: dist_sync; both tables saved (full) to OUT_DIR/ckpt after round 4 and
// restored from it after round 6 (rounds 5 and 6 undone; the rounds after it go on
// from the restored rows, optimizer state, admission counters and step).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "embedding_zipf.h"
#include "failover_job_io.h"
#include "pskv/embedding.h"
#include "pskv/kvstore.h"

using namespace pskv;
using namespace embedding_job;

namespace {

EmbeddingConfig TableA(int wide) {
  EmbeddingConfig c;
  c.name = "A";
  c.width = 8 * wide;
  c.seed = 5;
  c.optimizer = OptimizerConfig::For("adagrad");
  c.optimizer.learning_rate = 0.1;
  c.admission.admit_after = 2;
  c.ttl_steps = 4;
  return c;
}
EmbeddingConfig TableB() {
  EmbeddingConfig c;
  c.name = "B";
  c.width = 4;
  c.init.kind = EmbeddingInitializer::Kind::kNormal;
  c.optimizer = OptimizerConfig::For("adam");
  c.optimizer.learning_rate = 0.01;
  c.admission = EmbeddingAdmission::CountingBloom(2, 2000, 0.01);
  c.capacity = 40;
  return c;
}

// One step of `t`: pull the batch's rows, push gradients made of them.
void Step(EmbeddingTable& t, const std::vector<uint64_t>& ids, int rank, int round) {
  const int64_t w = t.config().width;
  const NDArray rows = t.Pull(IdsArray(ids));
  std::vector<float> g = Grads(ids, w, rank, round);
  for (size_t i = 0; i < g.size(); ++i) g[i] += 0.25f * rows.data<float>()[i];
  t.Push(IdsArray(ids), Floats(g, w));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: embedding_failover_worker sync|async ROUNDS OUT_DIR\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int rounds = std::atoi(argv[2]);
  const std::string out = argv[3];
  try {
    const bool restore = mode == "sync-restore";
    auto kv = KVStore::Create(mode == "sync" || restore ? "dist_sync" : "dist_async");
    const int rank = kv->Rank(), workers = kv->NumWorkers();
    failover_job::Steps steps(out + "/w" + std::to_string(rank));
    auto a = EmbeddingTable::Create(*kv, 70, TableA(mode == "async-wide" ? 64 : 1));
    auto b = EmbeddingTable::Create(*kv, 71, TableB());
    const Zipf zipf;
    const std::string ckpt = out + "/ckpt";
    for (int r = 1; r <= rounds; ++r) {
      steps.Begin();
      const auto ids = zipf.Batch(rank, r, 48);
      Step(*a, ids, rank, r);
      Step(*b, ids, rank, r + 100);
      if (restore && r == 4) {  // both tables saved after round 4 ...
        a->Save(ckpt, EmbeddingSaveKind::kFull);
        b->Save(ckpt, EmbeddingSaveKind::kFull);
      }
      if (restore && r == 6) {  // ... and restored after round 6: rounds 5 and 6 undone
        a->Restore(ckpt);
        b->Restore(ckpt);
      }
      steps.End("r", r);
    }
    kv->Barrier();  // dist_async with several workers: every push applied
    std::vector<uint64_t> seen;
    for (int w = 0; w < workers; ++w)
      for (int r = 1; r <= rounds; ++r) {
        const auto ids = zipf.Batch(w, r, 48);
        seen.insert(seen.end(), ids.begin(), ids.end());
      }
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    std::vector<NDArray> finals;
    int64_t live = 0;
    for (EmbeddingTable* t : {a.get(), b.get()}) {
      NDArray versions;
      finals.push_back(t->Pull(IdsArray(seen), &versions));
      for (int64_t i = 0; i < versions.size(); ++i) live += versions.data<int64_t>()[i] >= 0;
      finals.push_back(versions);
    }
    steps.Write(finals);
    std::printf("embedding_failover_worker[%d]: %zu ids, %lld rows live in the two tables\n", rank,
                seen.size(), static_cast<long long>(live));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embedding_failover_worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
