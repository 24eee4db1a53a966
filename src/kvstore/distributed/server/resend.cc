// ReplicaApply: a promoted replica sends the last changes it applied as a replica to
// the range's other copies (replica_apply.h, ResendLastRounds; docs/fault-tolerance.md,
// "Promotion on the servers").
//
// With two replicas or more, the dead primary may have sent its last changes of a key
// to this node only. What may be missing elsewhere, per key:
//  * a dense or row_sparse sync round: the last one (the primary sends round r + 1
//    only once every replica acknowledged round r);
//  * dist_async pushes: the last num_workers copies (a copy is answered to its worker
//    only once every replica acknowledged it, and a worker has at most one push of a
//    key unanswered, so at most num_workers of a key's copies can be missing).
//  * a dynamic embedding table's part: its last change (sync) or its last num_workers
//    (async), kept by EmbeddingServer (TakeLastChanges), for the same reasons.
// They are sent again in waves: a wave holds no two messages of one key, and a wave
// goes once the one before it was acknowledged, so every copy gets a key's changes in
// their order whatever the transport reorders. A copy that holds a change
// acknowledges it without applying it again.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/replica_apply.h"
#include "kvstore/distributed/wire/replication_wire.h"

namespace pskv {

namespace {

// A replicated change again, under this node's range-table version, pointing at the
// kept request's buffers; a dense round without the answers its primary left to the
// copy that got it (given there). A kept change was parsed when it was applied.
Message Again(const std::shared_ptr<const Message>& last, uint64_t version) {
  const Message& in = *last;
  Message m;
  m.h.flags = kPush;
  m.h.head = in.h.head;
  m.h.num_keys = in.h.num_keys;
  m.h.vals_len = in.h.vals_len;
  m.keys = in.keys;
  m.lens = in.lens;
  std::vector<Frame::Piece> pieces;
  for (const auto& c : in.chunks) pieces.push_back({c.data, c.size});
  if (!pieces.empty()) m.vals = Frame::Gather(std::move(pieces), last);
  m.body = dist::CmdKind(in.h.head) == dist::Kind::kReplicate
               ? dist::replication_wire::RoundAgain(in.body, version)
               : dist::replication_wire::WithVersion(in.body, version);
  return m;
}

// Sends waves of messages to `to`, each once the one before was acknowledged by all
// (or failed), then runs `done`.
struct Waves : std::enable_shared_from_this<Waves> {
  Node* node = nullptr;
  Replicator* replicator = nullptr;
  int range = 0;
  std::vector<int> to;
  std::vector<std::vector<Message>> waves;
  std::function<void()> done;
  std::mutex mu;
  size_t next = 0, left = 0;

  void SendNext() {
    if (next == waves.size() || node->failure()) return done();
    std::vector<Message> wave = std::move(waves[next++]);
    {
      std::lock_guard<std::mutex> lk(mu);
      left = wave.size() + 1;  // + 1: until every message of the wave was handed on
    }
    auto self = shared_from_this();
    for (Message& m : wave) {
      replicator->Send(to, std::move(m), [self](std::exception_ptr e) {
        if (e) {
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& ex) {
            PSKV_WARN(self->node->Tag() << ": key range " << self->range
                                        << ": sending a last change again: " << ex.what());
          }
        }
        self->Answered();
      });
    }
    Answered();
  }
  void Answered() {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (--left > 0) return;
    }
    SendNext();
  }
};

}  // namespace

size_t ReplicaApply::ResendLastRounds(
    std::function<void()> done, std::vector<std::vector<std::shared_ptr<const Message>>> more) {
  const std::vector<int> to = replicator_->Targets(range_.index());
  const uint64_t version = replicator_->version();
  size_t keys = 0;
  std::vector<Message> rounds;  // sync rounds: one per key, one wave
  // Async copies by the order this node applied them; each one's wave is one more than
  // the wave of the key's copy before it (for every key it holds).
  struct Copy {
    std::shared_ptr<const Message> m;
    size_t wave = 0;
    std::vector<uint64_t> before;  // the copies applied before it of its keys
  };
  std::map<uint64_t, Copy> copies;
  pool_->Exclusive([&] {
    std::map<int64_t, Kept> all;  // in key order
    for (auto& shard : kept_) {
      all.merge(shard);
      shard.clear();
    }
    for (auto& [key, k] : all) {
      const std::shared_ptr<const Message>& last = k.last_round;
      const auto& kept = k.async_copies;
      if (last) rounds.push_back(Again(last, version));
      if (last || !kept.empty()) ++keys;
      for (size_t i = 0; i < kept.size(); ++i) {
        Copy& c = copies[kept[i].first];
        c.m = kept[i].second;
        if (i > 0) c.before.push_back(kept[i - 1].first);
      }
    }
    for (auto& last : store_->sparse().TakeLastRounds()) {
      rounds.push_back(Again(last, version));
      ++keys;
    }
  });
  auto w = std::make_shared<Waves>();
  w->node = node_;
  w->replicator = replicator_;
  w->range = range_.index();
  w->to = to;
  w->done = std::move(done);
  if (!to.empty()) {
    if (!rounds.empty()) w->waves.push_back(std::move(rounds));
    for (auto& [index, c] : copies) {  // ascending: every copy's `before` has its wave
      for (uint64_t b : c.before) c.wave = std::max(c.wave, copies[b].wave + 1);
      if (w->waves.size() <= c.wave) w->waves.resize(c.wave + 1);
      w->waves[c.wave].push_back(Again(c.m, version));
    }
    for (const auto& seq : more) {  // a sequence's i-th change in wave i: in order
      if (w->waves.size() < seq.size()) w->waves.resize(seq.size());
      for (size_t i = 0; i < seq.size(); ++i) w->waves[i].push_back(Again(seq[i], version));
    }
  }
  keys += more.size();
  w->SendNext();
  return to.empty() ? 0 : keys;
}

}  // namespace pskv
