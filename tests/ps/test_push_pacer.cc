// PushPacer alone (ps/push_pacer.h), a simulated sync round of several paced
// workers, a paced request between real nodes (threads of this process), and the
// size of a request's messages.
#include "ps/push_pacer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "ps/kv_app.h"
#include "ps/node.h"
#include "support/test_util.h"

namespace pskv {
namespace {

using namespace std::chrono_literals;

TEST(PushPacer, EachServerGetsAtMostAheadBytesUnansweredInOrder) {
  PushPacer p(200);
  // Messages 0..5 of 100 bytes, alternating servers 1 and 2.
  std::vector<bool> now;
  for (size_t i = 0; i < 6; ++i) now.push_back(p.Add(i, 1 + static_cast<int>(i % 2), 100));
  EXPECT_EQ(now, (std::vector<bool>{true, true, true, true, false, false}));
  EXPECT_EQ(p.Held(), 2u);
  EXPECT_EQ(p.Answered(1), std::vector<size_t>{5});  // server 2's next, not server 1's
  EXPECT_EQ(p.Answered(0), std::vector<size_t>{4});
  EXPECT_EQ(p.Held(), 0u);
  EXPECT_TRUE(p.Answered(99).empty());  // never sent: changes nothing
  EXPECT_TRUE(p.Answered(0).empty());   // answered twice: changes nothing
}

TEST(PushPacer, OneMessageAlwaysGoesAndNoneOvertakesAWaitingOne) {
  PushPacer p(100);
  EXPECT_TRUE(p.Add(0, 1, 500));   // bigger than the budget: goes alone
  EXPECT_FALSE(p.Add(1, 1, 300));  // waits
  EXPECT_FALSE(p.Add(2, 1, 10));   // would fit nothing anyway, and never overtakes 1
  EXPECT_EQ(p.Answered(0), std::vector<size_t>{1});
  EXPECT_EQ(p.Answered(1), std::vector<size_t>{2});
}

TEST(PushPacer, AnAnswerReleasesAsManyAsFit) {
  PushPacer p(300);
  for (size_t i = 0; i < 6; ++i) p.Add(i, 1, 100);
  EXPECT_EQ(p.Held(), 3u);
  EXPECT_EQ(p.Answered(1), std::vector<size_t>{3});
  EXPECT_EQ(p.Answered(0), std::vector<size_t>{4});
  EXPECT_EQ(p.Answered(2), std::vector<size_t>{5});
}

// An uneven split (link-balanced shares): each server's unanswered bytes are held
// in proportion to its part of the request, the biggest part getting `ahead`.
TEST(PushPacer, AnUnevenSplitPacesEachServerInProportionToItsPart) {
  // Server 1: 6 messages of 100 bytes; server 2: 2 of 100 (a third); ahead 300.
  std::vector<std::pair<int, uint64_t>> plan;
  for (int i = 0; i < 6; ++i) plan.emplace_back(1, 100);
  for (int i = 0; i < 2; ++i) plan.emplace_back(2, 100);
  PushPacer p(300, plan);
  std::vector<bool> now;
  for (size_t i = 0; i < plan.size(); ++i) now.push_back(p.Add(i, plan[i].first, plan[i].second));
  EXPECT_EQ(now, (std::vector<bool>{true, true, true, false, false, false, true, false}));
  EXPECT_EQ(p.Answered(6), std::vector<size_t>{7});
  EXPECT_EQ(p.Answered(0), std::vector<size_t>{3});
  // An even split paces every server alike, as the plain pacer does.
  PushPacer even(200, {{1, 100}, {2, 100}, {1, 100}, {2, 100}, {1, 100}, {2, 100}});
  PushPacer plain(200);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(even.Add(i, 1 + static_cast<int>(i % 2), 100),
              plain.Add(i, 1 + static_cast<int>(i % 2), 100));
  // What goes at once leaves interleaved by how far into its server's part each
  // message lies (server 1: 4 x 100 bytes, server 2: 2 x 200), not server by server.
  PushPacer mixed(1000, {{1, 100}, {1, 100}, {1, 100}, {1, 100}, {2, 200}, {2, 200}});
  EXPECT_EQ(mixed.SendOrder(), (std::vector<size_t>{0, 4, 1, 2, 5, 3}));
  EXPECT_TRUE(plain.SendOrder().empty());
  // Tiny parts still send one message at a time.
  PushPacer tiny(100, {{1, 1000000}, {2, 10}, {2, 10}});
  EXPECT_TRUE(tiny.Add(0, 1, 1000000));
  EXPECT_TRUE(tiny.Add(1, 2, 10));
  EXPECT_FALSE(tiny.Add(2, 2, 10));
}

// Workers push the pieces of one key (over `servers` servers) through their own
// pacers; a server answers piece i once every worker's piece i arrived (a sync
// round); messages in flight arrive in a random order. Every round completes (no
// deadlock), and a server never holds more than `ahead` pieces of one worker that
// are waiting for another worker: the workers stay within `ahead` of each other.
TEST(PushPacer, PacedWorkersCompleteEveryRoundAndStayWithinAheadOfEachOther) {
  constexpr int kWorkers = 4, kServers = 3, kPieces = 30;  // pieces 0..29, piece i on server i % 3
  constexpr uint64_t kAhead = 3;                           // pieces of one byte
  std::mt19937 rng(7);
  std::vector<PushPacer> pacers(kWorkers, PushPacer(kAhead));
  std::vector<std::pair<int, size_t>> wire;  // (worker, piece) sent, not arrived
  std::map<size_t, int> arrived;             // piece -> workers arrived
  std::vector<std::vector<int>> got(kServers, std::vector<int>(kWorkers, 0));
  for (int w = 0; w < kWorkers; ++w)
    for (size_t i = 0; i < kPieces; ++i)
      if (pacers[w].Add(i, static_cast<int>(i % kServers), 1)) wire.emplace_back(w, i);
  int completed = 0;
  while (!wire.empty()) {
    const size_t pick = std::uniform_int_distribution<size_t>(0, wire.size() - 1)(rng);
    auto [w, piece] = wire[pick];
    wire.erase(wire.begin() + static_cast<long>(pick));
    const int s = static_cast<int>(piece % kServers);
    ++got[s][w];
    const auto [lo, hi] = std::minmax_element(got[s].begin(), got[s].end());
    EXPECT_LE(*hi - *lo, static_cast<int>(kAhead)) << "server " << s;
    if (++arrived[piece] < kWorkers) continue;
    ++completed;  // the round of `piece` completes: every worker gets its answer
    for (int v = 0; v < kWorkers; ++v)
      for (size_t next : pacers[v].Answered(piece)) wire.emplace_back(v, next);
  }
  EXPECT_EQ(completed, kPieces);
  for (auto& p : pacers) EXPECT_EQ(p.Held(), 0u);
}

// A job of a scheduler, one server and one worker as threads, every node with
// PSKV_WIRE_CHUNK_BYTES = `chunk_bytes`: the server hands requests to `handle` while
// `beside` (if set) runs on a thread of its own until the server node stops
// (`stop` turns true); the worker runs `work`, then every node finalizes.
void RunOneServerJob(int64_t chunk_bytes, const KVServer::Handler& handle,
                     const std::function<void(KVServer&, const std::atomic<bool>& stop)>& beside,
                     const std::function<void(KVWorker&)>& work) {
  const int port = test::FreePort();
  auto opts = [&](Role r) {
    Options o = test::NodeOptions(r, port, 1, 1);
    o.wire_chunk_bytes = chunk_bytes;
    return o;
  };
  std::thread sched([&] {
    Node n(opts(Role::kScheduler));
    n.Start();
    n.Finalize(0ms);
  });
  std::thread server([&] {
    Node n(opts(Role::kServer));
    KVServer srv(&n, handle, nullptr);
    std::atomic<bool> stop{false};
    std::thread side;
    if (beside) side = std::thread([&] { beside(srv, stop); });
    n.Start();
    n.Finalize(0ms);
    stop = true;
    if (side.joinable()) side.join();
  });
  {
    Node n(opts(Role::kWorker));
    KVWorker w(&n);
    n.Start();
    work(w);
    n.Finalize(30s);
  }
  sched.join();
  server.join();
}

// A paced request between real nodes: a server that answers only once no message
// came for a while sees at most `ahead` bytes of the request unanswered at a time
// (unpaced: every message at once), and the request completes.
TEST(PushPacer, KVWorkerSendsAPacedRequestsMessagesAsAnswersArrive) {
  constexpr uint64_t kPiece = 64 << 10;  // one key per message (PSKV_WIRE_CHUNK_BYTES)
  constexpr int kKeys = 8;
  for (uint64_t ahead : {2 * kPiece, uint64_t{0}}) {
    std::mutex mu;
    std::vector<KVRequest> held;
    size_t most_held = 0, answered = 0;
    std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
    RunOneServerJob(
        static_cast<int64_t>(kPiece),
        [&](KVRequest&& r, KVServer*) {
          std::lock_guard<std::mutex> lk(mu);
          held.push_back(std::move(r));
          most_held = std::max(most_held, held.size());
          last = std::chrono::steady_clock::now();
        },
        [&](KVServer& srv, const std::atomic<bool>& stop) {
          // answers what it holds after 200 ms without arrivals
          while (!stop) {
            std::this_thread::sleep_for(10ms);
            std::lock_guard<std::mutex> lk(mu);
            if (held.empty() || std::chrono::steady_clock::now() - last < 200ms) continue;
            for (auto& r : held) srv.Respond(r);
            answered += held.size();
            held.clear();
          }
        },
        [&](KVWorker& w) {
          std::vector<uint64_t> keys, lens(kKeys, kPiece);
          for (int k = 0; k < kKeys; ++k) keys.push_back(static_cast<uint64_t>(k));
          std::vector<char> vals(kKeys * kPiece, 1);
          auto done = std::make_shared<Completion>();
          auto ts = w.Push(keys, Frame::Copy(vals.data(), vals.size()), lens, 0,
                           Completion::Callback(done), 0, ahead);
          w.Await(ts, done, 60s, 0ms, "paced push");
        });
    EXPECT_EQ(answered, static_cast<size_t>(kKeys));
    if (ahead)
      EXPECT_EQ(most_held, 2u);  // two pieces' worth, then the answers release the next
    else
      EXPECT_GT(most_held, 2u);  // unpaced: more at once (all of them, unless delayed)
  }
}

// Message size of a request (KVWorker::Push's `message_bytes`): by default a
// server's consecutive keys share messages of up to the wire chunk size; with 1,
// each key is a message of its own; with more, messages of up to that many bytes but
// of at most an 8th of the server's part (kMessagesPerPart: the answers of a sync
// round lag its pushes by a message), each at least one key.
TEST(PushPacer, KVWorkerCutsAServersKeysIntoMessagesAsAsked) {
  constexpr uint64_t kKey = 4 << 10;
  constexpr int kKeys = 32;  // a part of 128 KiB: an 8th is 16 KiB, 4 keys
  static_assert(kKeys * kKey / KVWorker::kMessagesPerPart == 4 * kKey);
  const std::vector<std::pair<uint64_t, std::vector<uint32_t>>> cases = {
      {0, {16, 16}},                         // the wire chunk size, 64 KiB
      {1, std::vector<uint32_t>(kKeys, 1)},  // a key each
      {3 * kKey, {3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2}},
      {16 * kKey, std::vector<uint32_t>(8, 4)},  // held to an 8th of the part
  };
  for (const auto& [message_bytes, expected] : cases) {
    std::mutex mu;
    std::vector<uint32_t> keys_per_message;
    RunOneServerJob(
        64 << 10,
        [&](KVRequest&& r, KVServer* s) {
          {
            std::lock_guard<std::mutex> lk(mu);
            keys_per_message.push_back(r.msg.h.num_keys);
          }
          s->Respond(r);
        },
        nullptr,
        [&](KVWorker& w) {
          std::vector<uint64_t> keys, lens(kKeys, kKey);
          for (int k = 0; k < kKeys; ++k) keys.push_back(static_cast<uint64_t>(k));
          std::vector<char> vals(kKeys * kKey, 1);
          auto done = std::make_shared<Completion>();
          auto ts = w.Push(keys, Frame::Copy(vals.data(), vals.size()), lens, 0,
                           Completion::Callback(done), 0, 0, message_bytes);
          w.Await(ts, done, 60s, 0ms, "push");
        });
    std::sort(keys_per_message.begin(), keys_per_message.end(), std::greater<>());
    EXPECT_EQ(keys_per_message, expected) << "message_bytes " << message_bytes;
  }
}

}  // namespace
}  // namespace pskv
