// Checkpoints of the dynamic embedding table (src/embedding/table_io.cc): full and
// delta saves, restore bit for bit, onto other shard counts, export, and every
// corruption of a file refused with a typed error naming the fix.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "embedding/embedding_test_util.h"
#include "embedding/table.h"
#include "pskv/error.h"

namespace pskv::embedding {
namespace {

using test::AdmissionState;
using test::Snapshot;
using test::TempPath;

TableConfig Config(AdmissionConfig::Mode mode, int64_t width = 8) {
  TableConfig c;
  c.name = "ckpt";
  c.width = width;
  c.seed = 3;
  c.optimizer = OptimizerConfig::FromParams("adam", {{"learning_rate", "0.01"}});
  c.admission.mode = mode;
  c.admission.admit_after = 2;
  c.admission.cbf_counters = 8192;
  c.ttl_steps = 40;
  c.capacity = 600;
  return c;
}

// One step of a job: a Zipf batch routed to its shard.
void Step(std::vector<Table*>& shards, test::Zipf& zipf, int64_t step, int batch = 64) {
  const auto S = static_cast<uint32_t>(shards.size());
  const int64_t w = shards[0]->config().width;
  std::vector<std::vector<uint64_t>> ids(S);
  for (int i = 0; i < batch; ++i) {
    const uint64_t id = zipf.Next();
    ids[ShardOf(id, S)].push_back(id);
  }
  for (uint32_t s = 0; s < S; ++s) {
    std::vector<float> g(ids[s].size() * static_cast<size_t>(w));
    for (size_t i = 0; i < g.size(); ++i)
      g[i] =
          static_cast<float>((ids[s][i / static_cast<size_t>(w)] >> (i % 13)) % 97) / 97.0f - 0.5f;
    shards[s]->Push(step, ids[s].data(), static_cast<int64_t>(ids[s].size()), g.data());
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}
void WriteAll(const std::string& path, const std::string& bytes, size_t n) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(n));
}

void ExpectSameStats(const Table& a, const Table& b) {
  const TableStats x = a.Stats(), y = b.Stats();
  EXPECT_EQ(x.live, y.live);
  EXPECT_EQ(x.admitted, y.admitted);
  EXPECT_EQ(x.evicted_ttl, y.evicted_ttl);
  EXPECT_EQ(x.evicted_capacity, y.evicted_capacity);
  EXPECT_EQ(x.dropped_grads, y.dropped_grads);
  EXPECT_EQ(x.pending_ids, y.pending_ids);
}

// Item 6: a full save and deltas (with TTL and capacity evictions between them)
// restore to the same table bit for bit, which then continues identically.
TEST(EmbeddingCheckpoint, FullPlusDeltasRestoreBitForBit) {
  for (auto mode : {AdmissionConfig::Mode::kExact, AdmissionConfig::Mode::kCountingBloom}) {
    SCOPED_TRACE(static_cast<int>(mode));
    const TableConfig c = Config(mode);
    Table a(c);
    std::vector<Table*> job{&a};
    test::Zipf zipf(5000, 1.05, 11);
    SavedShard files;
    uint64_t full_bytes = 0, delta_bytes = 0;
    for (int64_t step = 1; step <= 100; ++step) {
      Step(job, zipf, step);
      if (step == 20) {
        files.full = TempPath("full_" + std::to_string(int(mode)));
        a.SaveFull(files.full);
        full_bytes = ReadAll(files.full).size();
      } else if (step > 20 && step % 20 == 0) {
        files.deltas.push_back(
            TempPath("delta_" + std::to_string(int(mode)) + "_" + std::to_string(step)));
        a.SaveDelta(files.deltas.back());
        delta_bytes = std::max<uint64_t>(delta_bytes, ReadAll(files.deltas.back()).size());
      }
    }
    EXPECT_GT(a.Stats().evicted_ttl + a.Stats().evicted_capacity, 0);
    EXPECT_GT(a.Stats().dropped_grads, 0);
    std::printf("full save %llu bytes, largest delta %llu bytes (20 steps of 64 ids)\n",
                static_cast<unsigned long long>(full_bytes),
                static_cast<unsigned long long>(delta_bytes));
    Table b(c);
    b.Restore({files});
    EXPECT_EQ(Snapshot(b), Snapshot(a));
    EXPECT_TRUE(AdmissionState(b) == AdmissionState(a));
    ExpectSameStats(a, b);
    // Both continue identically (admission state, clocks and LRU order restored).
    std::vector<Table*> jb{&b};
    test::Zipf z1(5000, 1.05, 12), z2(5000, 1.05, 12);
    for (int64_t step = 101; step <= 140; ++step) {
      Step(job, z1, step);
      Step(jb, z2, step);
    }
    EXPECT_EQ(Snapshot(b), Snapshot(a));
    ExpectSameStats(a, b);
    // And the restored table continues the chain.
    files.deltas.push_back(TempPath("delta_after_" + std::to_string(int(mode))));
    b.SaveDelta(files.deltas.back());
    Table d(c);
    d.Restore({files});
    EXPECT_EQ(Snapshot(d), Snapshot(a));
    EXPECT_TRUE(AdmissionState(d) == AdmissionState(a));
  }
}

// Item 6: a delta holds the rows and the admission state that changed since the
// previous save, not the whole admission state: on a table with 20,000 pending ids
// (or a filter of 2^20 counters), a delta after a push of a few ids is a few hundred
// bytes, and full + deltas still restore the live table bit for bit, admission state
// included (counts raised, ids admitted, ids forgotten by the TTL, new ids).
TEST(EmbeddingCheckpoint, DeltaHoldsOnlyTheAdmissionStateThatChanged) {
  for (auto mode : {AdmissionConfig::Mode::kExact, AdmissionConfig::Mode::kCountingBloom}) {
    SCOPED_TRACE(static_cast<int>(mode));
    TableConfig c = Config(mode, 4);
    c.admission.admit_after = 3;
    c.admission.cbf_counters = 1 << 20;
    c.capacity = 0;
    c.ttl_steps = 1000;
    Table t(c);
    const std::vector<float> g(4 * 20000, 0.25f);
    std::vector<uint64_t> ids(20000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = test::Zipf::IdOf(i);
    t.Push(1, ids.data(), 20000, g.data());  // 20,000 ids seen once
    t.Push(2, ids.data(), 100, g.data());    // 100 of them twice
    t.Push(3, ids.data(), 10, g.data());     // 10 admitted
    ASSERT_EQ(t.Stats().live, 10);
    SavedShard files{TempPath("dc_full_" + std::to_string(int(mode))), {}};
    t.SaveFull(files.full);
    const uint64_t full = ReadAll(files.full).size();
    auto delta = [&](int64_t step, std::vector<uint64_t> push) {
      t.Push(step, push.data(), static_cast<int64_t>(push.size()), g.data());
      files.deltas.push_back(
          TempPath("dc_d" + std::to_string(int(mode)) + "_" + std::to_string(files.deltas.size())));
      t.SaveDelta(files.deltas.back());
      Table r(c);
      r.Restore({files});
      EXPECT_EQ(Snapshot(r), Snapshot(t));
      EXPECT_TRUE(AdmissionState(r) == AdmissionState(t));
      return ReadAll(files.deltas.back()).size();
    };
    // Admits 2 pending ids (seen twice before), counts 3 pending once more, 2 new ids.
    const uint64_t d1 = delta(4, {ids[10], ids[11], ids[200], ids[201], ids[202],
                                  test::Zipf::IdOf(50000), test::Zipf::IdOf(50001)});
    EXPECT_EQ(t.Stats().live, 12);
    // Updates 3 rows only: no admission change.
    const uint64_t d2 = delta(5, {ids[0], ids[1], ids[2]});
    // The TTL removes every row and forgets every pending id (exact counter); ids[3]
    // is seen again: pending once more (exact), or admitted again (the filter keeps
    // its count).
    const uint64_t d3 = delta(1010, {ids[3]});
    EXPECT_EQ(t.Stats().live, mode == AdmissionConfig::Mode::kExact ? 0 : 1);
    std::printf("full save %llu bytes; deltas %llu, %llu, %llu bytes\n",
                static_cast<unsigned long long>(full), static_cast<unsigned long long>(d1),
                static_cast<unsigned long long>(d2), static_cast<unsigned long long>(d3));
    const uint64_t row = 24 + 4 * 4 * (1 + static_cast<uint64_t>(t.slots())), head = 200;
    // 7 rows changed at most, 7 counter entries (16 bytes) or 7 x 4 counters (9 bytes).
    EXPECT_LE(d1, head + 7 * row + 7 * 4 * 9);
    EXPECT_LE(d2, head + 3 * row);
    EXPECT_GT(full, 100 * d1);
    if (mode == AdmissionConfig::Mode::kExact) {
      EXPECT_EQ(t.Stats().pending_ids, 1);
      EXPECT_GT(d3, 19000u * 16);  // 19,990 ids left the counter: each is listed
    }
  }
}

// Item 6: a table saved by 3 shards loads onto 2 and onto 5: the same rows, each on
// its shard under the new count.
TEST(EmbeddingCheckpoint, SavedByThreeShardsLoadsOntoTwoAndFive) {
  TableConfig c = Config(AdmissionConfig::Mode::kExact);
  c.capacity = 0;
  Table t0(c), t1(c), t2(c);
  std::vector<Table*> job{&t0, &t1, &t2};
  test::Zipf zipf(3000, 1.1, 5);
  std::vector<SavedShard> saved(3);
  for (int64_t step = 1; step <= 60; ++step) {
    Step(job, zipf, step, 96);
    for (uint32_t s = 0; s < 3; ++s) {
      if (step == 30) {
        saved[s].full = TempPath("rs_full_" + std::to_string(s));
        job[s]->SaveFull(saved[s].full, s, 3);
      } else if (step == 45 || step == 60) {
        saved[s].deltas.push_back(
            TempPath("rs_d" + std::to_string(step) + "_" + std::to_string(s)));
        job[s]->SaveDelta(saved[s].deltas.back());
      }
    }
  }
  std::map<uint64_t, test::RowCopy> all;
  for (Table* t : job)
    for (auto& [id, row] : Snapshot(*t)) all[id] = row;
  ASSERT_GT(all.size(), 100u);
  for (uint32_t n : {2u, 5u, 3u}) {
    std::map<uint64_t, test::RowCopy> got;
    int64_t pending = 0;
    for (uint32_t s = 0; s < n; ++s) {
      Table r(c);
      r.Restore(saved, s, n);
      for (auto& [id, row] : Snapshot(r)) {
        EXPECT_EQ(ShardOf(id, n), s);
        got[id] = row;
      }
      pending += r.Stats().pending_ids;
    }
    EXPECT_EQ(got, all) << n << " shards";
    int64_t saved_pending = 0;
    for (Table* t : job) saved_pending += t->Stats().pending_ids;
    EXPECT_EQ(pending, saved_pending) << n << " shards";
  }
}

// Item 6: the export of live rows (id -> values) for serving.
TEST(EmbeddingCheckpoint, ExportHoldsTheLiveRowsValues) {
  TableConfig c = Config(AdmissionConfig::Mode::kExact, 5);
  Table t(c);
  std::vector<Table*> job{&t};
  test::Zipf zipf(1000, 1.0, 9);
  for (int64_t step = 1; step <= 30; ++step) Step(job, zipf, step);
  const std::string path = TempPath("export");
  t.ExportRows(path);
  std::map<uint64_t, std::vector<float>> got;
  ReadExportFile(path, [&](uint64_t id, const float* v, int64_t w) {
    ASSERT_EQ(w, 5);
    got[id] = std::vector<float>(v, v + w);
  });
  ASSERT_EQ(static_cast<int64_t>(got.size()), t.Stats().live);
  for (auto& [id, v] : got) {
    Table::RowView r;
    ASSERT_TRUE(t.Row(id, &r));
    EXPECT_EQ(std::memcmp(v.data(), r.values, 20), 0);
  }
  std::string bytes = ReadAll(path);
  bytes[bytes.size() / 2] ^= 1;
  WriteAll(path, bytes, bytes.size());
  EXPECT_THROW(ReadExportFile(path, [](uint64_t, const float*, int64_t) {}), IOError);
}

// Item 9: every single-byte corruption (three ways) and every cut of a full save or a
// delta is refused by Restore with an IOError naming the file and the fix, and the
// table is left as it was.
TEST(EmbeddingCheckpoint, EverySingleByteCorruptionOrCutIsRefused) {
  TableConfig c = Config(AdmissionConfig::Mode::kExact, 2);
  c.optimizer = OptimizerConfig::For("sgd");
  c.admission.admit_after = 1;
  Table t(c);
  const std::vector<uint64_t> ids{1, 2, 3};
  const std::vector<float> g(6, 0.5f);
  t.Push(1, ids.data(), 3, g.data());
  SavedShard files{TempPath("c_full"), {TempPath("c_delta")}};
  t.SaveFull(files.full);
  t.Push(2, ids.data(), 2, g.data());
  t.SaveDelta(files.deltas[0]);
  Table target(c);
  const uint64_t other = 77;
  target.Push(1, &other, 1, g.data());
  const auto before = Snapshot(target);
  {
    Table ok(c);
    ok.Restore({files});
    ASSERT_EQ(Snapshot(ok), Snapshot(t));
  }
  for (const std::string& path : {files.full, files.deltas[0]}) {
    const std::string good = ReadAll(path);
    auto refused = [&](const std::string& what) {
      try {
        target.Restore({files});
      } catch (const IOError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(path), std::string::npos) << m;
        EXPECT_TRUE(m.find("restore from another copy") != std::string::npos ||
                    m.find("not a pskv embedding checkpoint") != std::string::npos)
            << what << ": " << m;
        return true;
      }
      ADD_FAILURE() << what << ": restored";
      return false;
    };
    for (size_t i = 0; i < good.size(); ++i) {
      for (int how = 0; how < 3; ++how) {
        std::string bad = good;
        bad[i] = how == 0   ? static_cast<char>(bad[i] ^ 0x01)
                 : how == 1 ? static_cast<char>(bad[i] ^ 0xff)
                            : (bad[i] == '\0' ? '0' : '\0');
        WriteAll(path, bad, bad.size());
        ASSERT_TRUE(refused("byte " + std::to_string(i) + " (" + std::to_string(how) + ")"));
      }
    }
    for (size_t n = 0; n < good.size(); ++n) {
      WriteAll(path, good, n);
      ASSERT_TRUE(refused("cut at " + std::to_string(n)));
    }
    WriteAll(path, good, good.size());
    EXPECT_EQ(Snapshot(target), before);
  }
}

// Item 6: misuse of the chain is refused, naming what to pass.
TEST(EmbeddingCheckpoint, MissingMisorderedOrForeignFilesAreRefused) {
  TableConfig c = Config(AdmissionConfig::Mode::kExact, 4);
  Table t(c);
  std::vector<Table*> job{&t};
  test::Zipf zipf(500, 1.0, 2);
  EXPECT_THROW(t.SaveDelta(TempPath("m_none")), UsageError);
  Step(job, zipf, 1);
  SavedShard f{TempPath("m_full"), {}};
  t.SaveFull(f.full);
  for (int k = 1; k <= 3; ++k) {
    Step(job, zipf, 1 + k);
    f.deltas.push_back(TempPath("m_d" + std::to_string(k)));
    t.SaveDelta(f.deltas.back());
  }
  auto message = [&](const std::vector<SavedShard>& files, uint32_t shard = 0, uint32_t n = 1) {
    Table r(c);
    try {
      r.Restore(files, shard, n);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("restored");
  };
  EXPECT_NE(message({{f.full, {f.deltas[0], f.deltas[2]}}}).find("missing or out of order"),
            std::string::npos);
  EXPECT_NE(message({{f.full, {f.deltas[1], f.deltas[0]}}}).find("missing or out of order"),
            std::string::npos);
  EXPECT_NE(message({{f.deltas[0], {}}}).find("not a full save"), std::string::npos);
  // A delta of another full save.
  Table u(c);
  std::vector<Table*> ju{&u};
  Step(ju, zipf, 1);
  SavedShard g{TempPath("m_full2"), {TempPath("m_g1")}};
  u.SaveFull(g.full);
  u.SaveDelta(g.deltas[0]);
  EXPECT_NE(message({{f.full, {g.deltas[0]}}}).find("another full save"), std::string::npos);
  // Shards passed out of order.
  t.SaveFull(TempPath("m_s0"), 0, 2);
  u.SaveFull(TempPath("m_s1"), 1, 2);
  EXPECT_NE(message({{TempPath("m_s1"), {}}, {TempPath("m_s0"), {}}}, 0, 3).find("shard order"),
            std::string::npos);
  // Another width, another optimizer.
  TableConfig wide = c;
  wide.width = 5;
  Table w(wide);
  EXPECT_THROW(w.Restore({f}), ShapeError);
  TableConfig sgd = c;
  sgd.optimizer = OptimizerConfig::For("sgd");
  Table s(sgd);
  EXPECT_THROW(s.Restore({f}), UsageError);
  EXPECT_EQ(message({f}), "restored");
}

// A save that cannot be written loses nothing: the rows it would have held go into
// the next delta.
TEST(EmbeddingCheckpoint, AFailedDeltaLosesNothing) {
  TableConfig c = Config(AdmissionConfig::Mode::kExact, 4);
  Table t(c);
  std::vector<Table*> job{&t};
  test::Zipf zipf(500, 1.0, 4);
  Step(job, zipf, 1);
  SavedShard f{TempPath("f_full"), {}};
  t.SaveFull(f.full);
  Step(job, zipf, 2);
  EXPECT_THROW(t.SaveDelta("/nonexistent-dir/x/delta"), IOError);
  Step(job, zipf, 3);
  f.deltas.push_back(TempPath("f_d1"));
  t.SaveDelta(f.deltas[0]);
  Table r(c);
  r.Restore({f});
  EXPECT_EQ(Snapshot(r), Snapshot(t));
  std::set<std::string> left;
  for (auto& e : std::filesystem::directory_iterator(std::filesystem::path(f.full).parent_path()))
    if (e.path().string().find(".tmp") != std::string::npos) left.insert(e.path().string());
  EXPECT_TRUE(left.empty()) << *left.begin();
}

}  // namespace
}  // namespace pskv::embedding
