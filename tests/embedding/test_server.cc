// A server's dynamic embedding tables (kvstore/distributed/server/embedding_server.h) in
// one process: a real DistServer over TCP on 127.0.0.1 with raw KVWorkers
// (support/inprocess_job.h), so the requests are exactly the bytes sent.
//  * sync rounds of two workers give the rows (and versions) of one embedding::Table
//    pushed the workers' concatenated pushes in rank order, bit for bit;
//  * hostile requests (each attack of test_wire.cc, sent over the wire) are refused
//    alone with a typed error and the server serves on, its table unchanged.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>

#include "embedding/table.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/embedding_codec.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/error.h"
#include "support/inprocess_job.h"

namespace pskv {
namespace {

using namespace std::chrono_literals;
namespace ew = dist::embedding_wire;
using dist::Kind;

constexpr int kTable = 7;

EmbeddingConfig Config() {
  EmbeddingConfig c;
  c.name = "t";
  c.width = 4;
  c.optimizer = OptimizerConfig::For("adagrad");
  c.optimizer.learning_rate = 0.5;
  c.admission.admit_after = 2;
  c.ttl_steps = 2;
  return c;
}

Frame FrameOf(std::string s) {
  return Frame::FromString(std::move(s));
}

struct Job {
  InProcessDistJob job{[] {
                         Options o;
                         o.server_threads = 2;
                         o.stall_warning = 0ms;
                         return o;
                       }(),
                       2};
  const uint64_t key = KVWorker::ServerRange(0, 1).first + kTable;

  // Sends one request and waits for it; rethrows its error.
  void Call(int w, const std::string& value, Kind kind, char* out = nullptr, uint64_t out_len = 0,
            DType dtype = DType::kFloat32) {
    auto c = std::make_shared<Completion>();
    KVWorker& kw = *job.workers[static_cast<size_t>(w)];
    const int cmd = dist::MakeCmd(kind, dtype);
    const uint64_t ts =
        out ? kw.PushPull({key}, FrameOf(value), {value.size()}, out, {out_len}, cmd,
                          Completion::Callback(c))
            : kw.Push({key}, FrameOf(value), {value.size()}, cmd, Completion::Callback(c));
    kw.Await(ts, c, 30s, 0ms, "embedding request");
  }
  void Create(const EmbeddingConfig& c, int w = 0) {
    Call(w, payload::EncodeEmbeddingTable(c), Kind::kEmbeddingCreate);
  }
  // Rows and versions of `ids`.
  std::pair<std::vector<float>, std::vector<int64_t>> Pull(const std::vector<uint64_t>& ids,
                                                           int64_t width) {
    std::string req;
    ew::AppendPull(&req, ids.data(), ids.size());
    std::string out(ew::PullReplyBytes(ids.size(), static_cast<uint64_t>(width)), '\0');
    Call(0, req, Kind::kEmbeddingPull, out.data(), out.size());
    std::vector<float> rows(ids.size() * static_cast<size_t>(width));
    std::vector<int64_t> versions(ids.size());
    std::memcpy(rows.data(), out.data(), rows.size() * 4);
    std::memcpy(versions.data(), out.data() + rows.size() * 4, versions.size() * 8);
    return {rows, versions};
  }
};

std::string PushValue(const std::vector<uint64_t>& ids, const std::vector<float>& g,
                      uint64_t width) {
  std::string b(ew::PushBytes(ids.size(), width), '\0');
  ew::EncodePush(b.data(), width, ids.data(), ids.size(), g.data());
  return b;
}

// Worker w's push of round r: a few ids (some shared, some repeated across rounds).
std::vector<uint64_t> IdsOf(int w, int r) {
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 5; ++i) ids.push_back(((i * 7 + w * 3 + r) % 9) * 0x100000001ULL + 1);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}
std::vector<float> GradsOf(int w, int r, size_t n) {
  std::vector<float> g(n * 4);
  for (size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>((i * 5 + w * 11 + r * 3) % 13) / 8.0f - 0.7f;
  return g;
}

TEST(EmbeddingServer, SyncRoundsEqualOneTablePushedTheRoundsInRankOrder) {
  Job j;
  j.Create(Config());
  j.Create(Config(), 1);  // the same configuration again: answered (a retry)
  EmbeddingConfig other = Config();
  other.width = 5;
  EXPECT_THROW(j.Create(other, 1), KeyError);
  embedding::Table ref(Config());
  std::vector<uint64_t> all;
  for (int r = 0; r < 5; ++r) {
    std::vector<uint64_t> ids;
    std::vector<float> grads;
    std::vector<std::thread> ts;
    std::exception_ptr err[2];
    for (int w = 0; w < 2; ++w) {
      const auto mine = IdsOf(w, r);
      const auto g = GradsOf(w, r, mine.size());
      ids.insert(ids.end(), mine.begin(), mine.end());
      grads.insert(grads.end(), g.begin(), g.end());
      ts.emplace_back([&, w, v = PushValue(mine, g, 4)] {
        try {
          j.Call(w, v, Kind::kEmbeddingPush);
        } catch (...) {
          err[w] = std::current_exception();
        }
      });
    }
    for (auto& t : ts) t.join();
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
    ref.Push(r, ids.data(), static_cast<int64_t>(ids.size()), grads.data());
    all.insert(all.end(), ids.begin(), ids.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  const auto [rows, versions] = j.Pull(all, 4);
  std::vector<float> want(all.size() * 4);
  ref.Pull(all.data(), static_cast<int64_t>(all.size()), want.data());
  EXPECT_EQ(std::memcmp(rows.data(), want.data(), want.size() * 4), 0);
  int live = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    embedding::Table::RowView v;
    const bool has = ref.Row(all[i], &v);
    EXPECT_EQ(versions[i], has ? v.last_step : -1) << all[i];
    live += has;
  }
  // The rounds exercised admission and the TTL, not only updates.
  const auto st = ref.Stats();
  EXPECT_GT(st.dropped_grads, 0);
  EXPECT_GT(st.evicted_ttl, 0);
  EXPECT_GT(live, 0);
}

TEST(EmbeddingServer, HostileRequestsAreRefusedAloneAndTheServerServesOn) {
  Job j;
  // Before the table exists: a push names the fix.
  try {
    j.Call(0, PushValue({1}, {1, 2, 3, 4}, 4), Kind::kEmbeddingPush);
    ADD_FAILURE() << "a push to a missing table was accepted";
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("create it first"), std::string::npos) << e.what();
  }
  EXPECT_THROW(j.Call(0, "\x0d\x01garbage", Kind::kEmbeddingCreate), InvalidArgument);
  EmbeddingConfig bad = Config();
  bad.width = 0;
  EXPECT_THROW(j.Create(bad), InvalidArgument);  // the table's own checks, on the server
  j.Create(Config());
  const auto before = j.Pull({1, 2}, 4);
  std::string huge;
  const uint64_t head[2] = {uint64_t{1} << 60, 4};
  huge.append(reinterpret_cast<const char*>(head), 16);
  huge.append(24, '\0');
  EXPECT_THROW(j.Call(0, huge, Kind::kEmbeddingPush), InvalidArgument);
  EXPECT_THROW(j.Call(0, "short", Kind::kEmbeddingPush), InvalidArgument);
  EXPECT_THROW(j.Call(0, PushValue({1}, {1, 2, 3, 4, 5}, 5), Kind::kEmbeddingPush), ShapeError);
  EXPECT_THROW(
      j.Call(0, PushValue({1}, {1, 2, 3, 4}, 4), Kind::kEmbeddingPush, nullptr, 0, DType::kFloat64),
      ShapeError);
  std::string pull_bad;
  const uint64_t n = 1000;
  pull_bad.append(reinterpret_cast<const char*>(&n), 8);
  std::string out(64, '\0');
  EXPECT_THROW(j.Call(0, pull_bad, Kind::kEmbeddingPull, out.data(), out.size()), InvalidArgument);
  // Nothing changed, and the table still serves.
  const auto after = j.Pull({1, 2}, 4);
  EXPECT_EQ(before.first, after.first);
  EXPECT_EQ(after.second, (std::vector<int64_t>{-1, -1}));
}

}  // namespace
}  // namespace pskv
