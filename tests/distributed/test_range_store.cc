// The server's components, each alone (docs/design.md, "The server as components"):
// a RangeStore's rounds and the events it emits, its one exit for answers, a
// ReplicaApply applying a primary's round, InitChecks — without a network: a Node that
// is never started supplies the options and the range table, and the answers are
// recorded instead of sent (Answers is the one exit, answers.h).
//
// The last test follows the recipe "add a server feature" (docs/design.md): a new
// listener of the store's events, here one that logs every closed round and answers
// its pushes itself.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/init_checks.h"
#include "kvstore/distributed/server/range_store.h"
#include "kvstore/distributed/server/replica_apply.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/distributed/wire/replication_wire.h"
#include "pskv/error.h"
#include "support/test_util.h"

namespace pskv {
namespace {

using dist::Kind;

// Answers recorded: what a worker would have received.
struct Recorded final : Answers {
  struct Answer {
    uint64_t timestamp;
    int sender;
    std::string error;          // empty: a success
    std::vector<float> values;  // a pull's values, concatenated
  };
  std::vector<Answer> all;
  void Ack(const KVRequest& req) override { all.push_back({req.timestamp, req.sender, "", {}}); }
  void Error(const KVRequest& req, const Failure& f) override {
    all.push_back({req.timestamp, req.sender, f.message.empty() ? "?" : f.message, {}});
  }
  void Values(const KVRequest& req, KeyValues values) override {
    Answer a{req.timestamp, req.sender, "", {}};
    if (req.pull)
      for (auto& [key, v] : values)
        for (int64_t i = 0; i < v.value.size(); ++i) a.values.push_back(v.value.data<float>()[i]);
    all.push_back(std::move(a));
  }
  void Blob(const KVRequest& req, uint64_t, std::shared_ptr<const std::string>) override {
    all.push_back({req.timestamp, req.sender, "", {}});
  }
};

// A request as the KV layer hands it over: float32 values of one key per entry.
KVRequest Request(int sender, Kind kind, bool push, bool pull, const std::vector<uint64_t>& keys,
                  const std::vector<std::vector<float>>& values, std::string body = {}) {
  static uint64_t ts = 0;
  KVRequest r;
  r.sender = sender;
  r.timestamp = ++ts;
  r.cmd = dist::MakeCmd(kind, DType::kFloat32);
  r.push = push;
  r.pull = pull;
  auto bytes = std::make_shared<std::vector<float>>();
  std::vector<uint64_t> lens;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::vector<float>& v = i < values.size() ? values[i] : std::vector<float>{};
    bytes->insert(bytes->end(), v.begin(), v.end());
    lens.push_back(v.size() * sizeof(float));
  }
  Message& m = r.msg;
  m.h.num_keys = static_cast<uint32_t>(keys.size());
  m.h.vals_len = bytes->size() * sizeof(float);
  m.keys = U64Frame(keys);
  m.lens = U64Frame(lens);
  if (!bytes->empty()) m.chunks.push_back(Frame::Of(bytes->data(), m.h.vals_len, bytes));
  m.body = std::move(body);
  return r;
}

// One server (rank 0 of `servers`) of a job of two workers; never started.
Options ServerOptions(int servers, int replicas) {
  Options o = test::NodeOptions(Role::kServer, 1, servers, 2);
  o.replicas = replicas;
  o.server_threads = 1;
  return o;
}

// Validates and runs a data request as DistServer::Process does.
void Process(RangeStore& store, KVRequest req) {
  std::vector<Item> items;
  if (auto bad = store.Validate(req, &items)) return store.answers().Error(req, *bad);
  if (dist::CmdKind(req.cmd) == Kind::kInit) return store.ApplyInit(req, items);
  if (req.push && store.config().sync) return store.JoinRounds(std::move(req), items);
  store.ApplyAsync(req, items);
}

// A listener that counts the events and leaves every answer to the store.
struct Counting final : RangeEvents {
  int rounds = 0, asyncs = 0, inits = 0;
  int64_t last_round = 0, last_key = -1;
  bool OnRoundClosed(RoundClosed& ev) override {
    ++rounds;
    last_round = ev.round;
    last_key = ev.key;
    return false;
  }
  bool OnAsyncApplied(AsyncApplied&) override { return ++asyncs, false; }
  bool OnInitApplied(const KVRequest&) override { return ++inits, false; }
};

class RangeStoreTest : public ::testing::Test {
 protected:
  Node node{ServerOptions(1, 0)};
  Recorded answers;
  RangeStore store{&node, RangeOf{&node, 0}, &answers, nullptr, false};
  Counting events;
  const uint64_t k0 = dist::PsKey(0, 0, 1), k1 = dist::PsKey(1, 0, 1);

  void SetUp() override {
    store.Listen(&events);
    store.config().sync = true;
    Process(store, Request(WorkerId(0), Kind::kInit, true, false, {k0, k1}, {{1, 2}, {3, 4}}));
    ASSERT_EQ(answers.all.size(), 1u);
    ASSERT_EQ(answers.all[0].error, "");
    answers.all.clear();
  }
};

TEST_F(RangeStoreTest, InitIsOneEventAndOneAnswer) {
  EXPECT_EQ(events.inits, 1);
  ASSERT_NE(store.FindKey(0), nullptr);
  EXPECT_EQ(store.FindKey(0)->value.data<float>()[1], 2.0f);
  Process(store, Request(WorkerId(1), Kind::kInit, true, false, {k0}, {{9, 9}}));
  ASSERT_EQ(answers.all.size(), 1u);
  EXPECT_NE(answers.all[0].error.find("duplicate init"), std::string::npos);
  EXPECT_EQ(events.inits, 1) << "a refused init applies nothing, so it is no event";
}

TEST_F(RangeStoreTest, RoundClosesWhenEveryWorkerPushedAndEmitsOneEvent) {
  Process(store, Request(WorkerId(1), Kind::kDense, true, true, {k0}, {{10, 20}}));
  EXPECT_EQ(events.rounds, 0);
  EXPECT_TRUE(answers.all.empty()) << "a push is answered when its round closes";
  EXPECT_EQ(store.FindKey(0)->round.num_pushed(), 1u);
  Process(store, Request(WorkerId(0), Kind::kDense, true, true, {k0}, {{1, 2}}));
  EXPECT_EQ(events.rounds, 1);
  EXPECT_EQ(events.last_round, 1);
  EXPECT_EQ(events.last_key, 0);
  ASSERT_EQ(answers.all.size(), 2u);
  for (auto& a : answers.all) {
    EXPECT_EQ(a.error, "");
    EXPECT_EQ(a.values, (std::vector<float>{11, 22})) << "no optimizer: the sum is the value";
  }
  EXPECT_EQ(store.FindKey(0)->round.round(), 2);
  EXPECT_FALSE(store.FindKey(0)->round.open());
}

TEST_F(RangeStoreTest, FusedPushIsAnsweredOnceWhenItsLastKeyClosed) {
  Process(store, Request(WorkerId(0), Kind::kDense, true, false, {k0, k1}, {{1, 1}, {1, 1}}));
  Process(store, Request(WorkerId(1), Kind::kDense, true, false, {k0}, {{1, 1}}));
  EXPECT_EQ(events.rounds, 1);
  ASSERT_EQ(answers.all.size(), 1u) << "worker 1's one-key push only";
  EXPECT_EQ(answers.all[0].sender, WorkerId(1));
  Process(store, Request(WorkerId(1), Kind::kDense, true, false, {k1}, {{1, 1}}));
  EXPECT_EQ(events.rounds, 2);
  ASSERT_EQ(answers.all.size(), 3u);
  int fused = 0;
  for (auto& a : answers.all) fused += a.sender == WorkerId(0);
  EXPECT_EQ(fused, 1) << "the fused push is answered once, after its last key's round";
}

TEST_F(RangeStoreTest, SecondPushInOneRoundAndWorkerDoneFailThroughTheOneExit) {
  Process(store, Request(WorkerId(0), Kind::kDense, true, false, {k0}, {{1, 1}}));
  Process(store, Request(WorkerId(0), Kind::kDense, true, false, {k0}, {{1, 1}}));
  ASSERT_EQ(answers.all.size(), 1u);
  EXPECT_NE(answers.all[0].error.find("twice"), std::string::npos) << answers.all[0].error;
  store.WorkerDone(WorkerId(1));
  ASSERT_EQ(answers.all.size(), 2u);
  EXPECT_NE(answers.all[1].error.find("worker"), std::string::npos) << answers.all[1].error;
  EXPECT_EQ(events.rounds, 0) << "a failed round is not a closed one";
}

// A listener that keeps the async pushes it hears of.
struct AsyncLog final : RangeEvents {
  std::vector<std::vector<int64_t>> seqs;  // per event: each key's apply sequence
  bool OnRoundClosed(RoundClosed&) override { return false; }
  bool OnAsyncApplied(AsyncApplied& ev) override {
    std::vector<int64_t> s;
    for (auto& p : ev.pushes) s.push_back(p.seq);
    seqs.push_back(std::move(s));
    return false;
  }
  bool OnInitApplied(const KVRequest&) override { return false; }
};

TEST_F(RangeStoreTest, AsyncPushIsAppliedAtOnceAndIsOneEvent) {
  AsyncLog log;
  store.Listen(&log);
  store.config().sync = false;
  OptimizerConfig sgd = OptimizerConfig::For("sgd");
  sgd.learning_rate = 1.0;
  store.config().optimizers[0] = std::make_unique<Optimizer>(sgd);
  Process(store, Request(WorkerId(0), Kind::kDense, true, true, {k0, k1}, {{1, 1}, {1, 1}}));
  Process(store, Request(WorkerId(1), Kind::kDense, true, false, {k0}, {{1, 1}}));
  EXPECT_EQ(log.seqs, (std::vector<std::vector<int64_t>>{{1, 1}, {2}}))
      << "one event per request, with each key's apply sequence";
  ASSERT_EQ(answers.all.size(), 2u) << "answered at once, without a round";
  EXPECT_EQ(answers.all[0].values, (std::vector<float>{0, 1, 2, 3}))
      << "w -= 1 * grad, answered with the keys' new values";
  EXPECT_EQ(store.FindKey(0)->value.data<float>()[0], -1.0f);
}

// The recipe "add a server feature" (docs/design.md), followed once: a listener that
// keeps a log of every closed round and answers its pushes itself, later (as
// PrimaryReplication does once the replicas acknowledged).
struct RoundLog final : RangeEvents {
  RangeStore* store = nullptr;
  std::vector<std::string> log;
  std::vector<Round::Entry> held;  // answered by Release
  bool OnRoundClosed(RoundClosed& ev) override {
    log.push_back("key " + std::to_string(ev.key) + " round " + std::to_string(ev.round) +
                  " sum[0] " + std::to_string(ev.sum.value.data<float>()[0]));
    for (auto& e : ev.pushes) held.push_back(std::move(e));
    ev.pushes.clear();
    return true;
  }
  bool OnAsyncApplied(AsyncApplied&) override { return false; }
  bool OnInitApplied(const KVRequest&) override { return false; }
  void Release() {
    for (auto& e : held) {
      KeyState* st = store->FindKey(e.push.r->keys[e.push.index]);
      ReplyOwner value{st->value, st->token};
      store->Finish(e.push, &value, nullptr);
    }
    held.clear();
  }
};

TEST_F(RangeStoreTest, RecipeAListenerThatTakesOverTheAnswers) {
  RoundLog log;
  log.store = &store;
  store.Listen(&log);
  Process(store, Request(WorkerId(0), Kind::kDense, true, true, {k0}, {{5, 5}}));
  Process(store, Request(WorkerId(1), Kind::kDense, true, true, {k0}, {{5, 5}}));
  EXPECT_EQ(log.log, (std::vector<std::string>{"key 0 round 1 sum[0] 10.000000"}));
  EXPECT_TRUE(answers.all.empty()) << "the listener took the answers over";
  log.Release();
  ASSERT_EQ(answers.all.size(), 2u);
  EXPECT_EQ(answers.all[0].values, (std::vector<float>{10, 10}));
}

// A replica's apply side alone: a round from the range's primary (range table of an
// unstarted node of 2 servers with 1 replica: server 0 leads range 0) is applied once.
TEST(ReplicaApplyAlone, AppliesARoundOnceAndOnlyFromThePrimary) {
  Node node(ServerOptions(2, 1));
  Recorded answers;
  RangeStore store(&node, RangeOf{&node, 0}, &answers, nullptr, true);
  store.config().sync = true;
  ReplicaApply replica(&node, RangeOf{&node, 0}, nullptr, &store, nullptr);
  const uint64_t k0 = dist::PsKey(0, 0, 2);
  Process(store, Request(ServerId(0), Kind::kInit, true, false, {k0}, {{1, 1, 1}}));
  ASSERT_EQ(answers.all.size(), 1u);
  answers.all.clear();

  dist::replication_wire::Round round;
  round.round = 1;
  round.counts = {{WorkerId(0), 7}, {WorkerId(1), 3}};
  const std::string body = dist::replication_wire::EncodeRound(round);
  replica.ApplyRound(Request(ServerId(0), Kind::kReplicate, true, false, {k0}, {{4, 5, 6}}, body));
  ASSERT_EQ(answers.all.size(), 1u);
  EXPECT_EQ(answers.all[0].error, "");
  KeyState* st = store.FindKey(0);
  EXPECT_EQ(std::vector<float>(st->value.data<float>(), st->value.data<float>() + 3),
            (std::vector<float>{4, 5, 6}))
      << "no optimizer: the round's sum becomes the value";
  EXPECT_EQ(st->round.round(), 2);
  EXPECT_EQ(st->applied_push.at(WorkerId(0)), 7u);

  // The same round again (a new primary re-sending it): acknowledged, not applied.
  replica.ApplyRound(Request(ServerId(0), Kind::kReplicate, true, false, {k0}, {{9, 9, 9}}, body));
  ASSERT_EQ(answers.all.size(), 2u);
  EXPECT_EQ(answers.all[1].error, "");
  EXPECT_EQ(st->value.data<float>()[0], 4.0f);
  EXPECT_EQ(st->round.round(), 2);

  // From a server that does not lead the range: refused, nothing changes.
  round.round = 2;
  replica.ApplyRound(Request(ServerId(1), Kind::kReplicate, true, false, {k0}, {{8, 8, 8}},
                             dist::replication_wire::EncodeRound(round)));
  ASSERT_EQ(answers.all.size(), 3u);
  EXPECT_NE(answers.all[2].error.find("not its primary"), std::string::npos)
      << answers.all[2].error;
  EXPECT_EQ(st->value.data<float>()[0], 4.0f);
  EXPECT_EQ(st->round.round(), 2);
}

TEST(InitChecksAlone, DisagreeingReportsFailTheCheckForEveryWorker) {
  InitChecks checks;
  auto name = [](int id) { return "worker." + std::to_string(RankOfId(id)); };
  payload::InitReport a, b;
  a.entries.push_back({5, "w", "float32", "(2,3)"});
  b.entries.push_back({5, "w", "float32", "(3,2)"});
  checks.Report(WorkerId(0), payload::EncodeInitReport(a), name);
  EXPECT_NO_THROW(checks.Check(payload::EncodeCheckInit({5})));
  checks.Report(WorkerId(1), payload::EncodeInitReport(b), name);
  try {
    checks.Check(payload::EncodeCheckInit({5}));
    FAIL() << "the disagreement is not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same shape and dtype"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(checks.Check(payload::EncodeCheckInit({6})));
}

}  // namespace
}  // namespace pskv
