// PrimaryReplication: a replicated range's changes copied to its replicas, answered
// once they acknowledged them (primary_replication.h; docs/fault-tolerance.md).
#include "kvstore/distributed/server/primary_replication.h"

#include <functional>
#include <memory>

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/replication_wire.h"

namespace pskv {

using dist::Kind;
namespace wire = dist::replication_wire;

namespace {

// The parts of a request that its answer needs (not its values).
KVRequest AnswerOf(const KVRequest& req) {
  KVRequest a;
  a.sender = req.sender;
  a.timestamp = req.timestamp;
  a.cmd = req.cmd;
  a.priority = req.priority;
  a.push = req.push;
  a.pull = req.pull;
  a.received_us = req.received_us;
  return a;
}

// What a copy's pieces point into: the request's receive buffers, gradients made here.
struct CopyOwner {
  std::vector<Frame> chunks;
  std::vector<NDArray> owned;
};

// A one-key push-pull whose worker named the round's only replica as its answerer
// (a copy on the worker's host, ps/kv_app.h) is answered there, once it applied the
// round, instead of from here: with one replica, every copy holds the round then.
// Only with PSKV_REPLICAS=1: with more, `to` may be one copy because another left,
// and that copy may hold the round already (a promoted replica's retried round).
// Moves those pushes out of `done` and returns them.
std::vector<Round::Entry> Delegate(std::vector<Round::Entry>* done, const std::vector<int>& to,
                                   int replicas) {
  std::vector<Round::Entry> delegated;
  if (to.size() != 1 || replicas != 1) return delegated;
  for (size_t i = 0; i < done->size();) {
    const RoundReq& r = *(*done)[i].push.r;
    if (r.req.pull && r.keys.size() == 1 && r.answerer == to[0] && !r.answer_here) {
      delegated.push_back(std::move((*done)[i]));
      done->erase(done->begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
  return delegated;
}

// kReplicate: round `round` of ps key `ps_key` (its sum, held by `sum`'s token while
// the message needs it), the pushes' counts and the answers left to the replica.
Message RoundMessage(uint64_t ps_key, ReplyOwner sum, uint64_t version, int64_t round,
                     const std::vector<Round::Entry>& done,
                     const std::vector<Round::Entry>& delegated) {
  wire::Round body;
  body.version = version;
  body.round = round;
  for (const auto* pushes : {&done, &delegated})
    for (auto& x : *pushes)
      body.counts.push_back(
          {x.sender, x.push.r->counts.empty() ? 0 : x.push.r->counts[x.push.index]});
  for (auto& x : delegated)  // what the replica answers: ReplicaApply's Delegated
    body.answers.push_back(
        {x.sender, x.push.r->req.timestamp, x.push.r->req.priority, x.push.r->req.cmd});
  Message m;
  m.h.flags = kPush;
  m.h.head = dist::MakeCmd(Kind::kReplicate, sum.value.dtype());
  m.h.num_keys = 1;
  m.h.vals_len = sum.value.nbytes();
  m.keys = U64Frame({ps_key});
  m.lens = U64Frame({sum.value.nbytes()});
  auto owner = std::make_shared<ReplyOwner>(std::move(sum));
  m.vals = Frame::Of(owner->value.raw(), owner->value.nbytes(), owner);
  m.body = wire::EncodeRound(body);
  return m;
}

}  // namespace

std::vector<int> PrimaryReplication::Targets(const KVRequest& req) const {
  // Only a worker's request is copied on: what a primary sends is applied, not sent
  // on again.
  if (!IsWorkerId(req.sender)) return {};
  return replicator_->Targets(range_.index());
}

bool PrimaryReplication::OnInitApplied(const KVRequest& req) {
  const std::vector<int> to = Targets(req);
  if (to.empty()) return false;
  Forward(req, to);
  return true;
}

// The round's sum goes to the replicas without a copy (ev.sum's token holds it).
bool PrimaryReplication::OnRoundClosed(RoundClosed& ev) {
  const std::vector<int> to = Targets(ev.pushes.front().push.r->req);
  if (to.empty()) return false;
  const int64_t key = ev.key, round = ev.round;
  KeyState& st = ev.st;
  std::vector<Round::Entry> done = std::move(ev.pushes);
  ReplyOwner sum = std::move(ev.sum);
  std::vector<Round::Entry> delegated = Delegate(&done, to, node_->options().replicas);
  Message m = RoundMessage(range_.PsKey(key), std::move(sum), replicator_->version(), round, done,
                           delegated);
  // Answered with the value the round produced (held here: the key's shard may
  // update it again only after these pushes were answered).
  auto value = std::make_shared<ReplyOwner>(ReplyOwner{st.value, st.token});
  auto pushes = std::make_shared<std::vector<Round::Entry>>(std::move(done));
  auto left = std::make_shared<std::vector<Round::Entry>>(std::move(delegated));
  const int answerer = to.front();
  // [observe] the round trip to the replicas that the round's answers wait for
  const uint64_t sent_us = obs::Enabled() ? obs::NowUs() : 0;
  const uint64_t sum_bytes = m.h.vals_len;
  Replicator::Done answer = [this, key, value, pushes, left, answerer, sent_us,
                             sum_bytes](std::exception_ptr e) {
    // The answers left to the replica are answered here after all when it left the
    // range (removed before or after acknowledging: its answers may never have gone
    // out, and the worker accepts the first answer only) or failed the round.
    if (!left->empty() && !e && replicator_->Holds(range_.index(), answerer)) left->clear();
    pushes->insert(pushes->end(), std::make_move_iterator(left->begin()),
                   std::make_move_iterator(left->end()));
    if (sent_us)
      obs::Span("replicate", "replicate", std::to_string(dist::KeyOf(key)), sum_bytes, sent_us,
                obs::NowUs());
    if (!e) {
      node_->fail_points().RoundReplicated(range_.index());
      for (auto& x : *pushes) {
        ReplyOwner answer = *value;  // each push's answer holds its own reference
        store_->Finish(x.push, &answer, nullptr);
      }
      return;
    }
    Failure failure{ErrorKind::kIO, "replication failed"};
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      failure = {KindOf(ex), std::string("replication failed: ") + ex.what()};
    }
    for (auto& x : *pushes) store_->Finish(x.push, nullptr, &failure);
  };
  std::function<void()> send = [this, to, m = std::move(m), answer = std::move(answer)]() mutable {
    replicator_->Send(to, std::move(m), std::move(answer));
  };
  if (!node_->fail_points().HoldReplicatedRound(
          range_.index(), round, [this] { return replicator_->version(); }, send))
    send();
  return true;
}

bool PrimaryReplication::RetryOfWaitingPush(const KVRequest& req) {
  const Message& m = req.msg;
  int64_t key = 0;
  if (m.num_keys() != 1 || !range_.keys().WireKeyOf(m.key_ptr()[0], &key)) return false;
  const PushBody body = PushBody::Parse(m.body, 1);
  KeyState* st = body.counts.empty() ? nullptr : store_->FindKey(key);
  if (!st || !st->round.pushed(req.sender)) return false;
  for (const auto& e : st->round.pushes()) {
    RoundReq& r = *e.push.r;
    if (e.sender != req.sender || r.req.timestamp != req.timestamp || r.counts.empty() ||
        r.counts[e.push.index] != body.counts[0])
      continue;
    r.answer_here = true;  // one key: only this shard touches it until the round completes
    return true;
  }
  return false;
}

void PrimaryReplication::Forward(const KVRequest& req, const std::vector<int>& to) {
  const Message& in = req.msg;
  Message m;
  m.h.flags = kPush;
  m.h.head = req.cmd;
  m.h.num_keys = in.h.num_keys;
  m.h.vals_len = in.h.vals_len;
  m.keys = in.keys;
  m.lens = in.lens;
  const bool init = dist::CmdKind(req.cmd) != Kind::kStates;
  const uint64_t version = replicator_->version();  // first, as in every server's message
  // an init: the worker and its push counts (InitOriginOf): a retry is known by them
  m.body = init ? wire::EncodeForwardedInit(version, req.sender, in.body)
                : wire::EncodeForwardedStates(version);
  auto chunks = std::make_shared<std::vector<Frame>>(in.chunks);
  std::vector<Frame::Piece> pieces;
  for (auto& c : *chunks) pieces.push_back({c.data, c.size});
  if (!pieces.empty()) m.vals = Frame::Gather(std::move(pieces), chunks);
  auto answer = std::make_shared<KVRequest>(AnswerOf(req));
  replicator_->Send(to, std::move(m), [this, answer, init](std::exception_ptr e) {
    try {
      if (!e && init) node_->fail_points().InitForwarded(range_.index());
      if (!e) return store_->answers().Ack(*answer);
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        store_->answers().Error(*answer,
                                {KindOf(ex), std::string("replication failed: ") + ex.what()});
      }
    } catch (const std::exception& ex) {
      PSKV_WARN(node_->Tag() << ": " << ex.what());
    }
  });
}

// The pushes as the primary applied them: each gradient (the request's own bytes, or
// the one dequantized here), the key's apply sequence and the update count its rate
// came from.
bool PrimaryReplication::OnAsyncApplied(AsyncApplied& ev) {
  const KVRequest& req = ev.req;
  const std::vector<int> to = Targets(req);
  if (to.empty()) return false;
  wire::AsyncPushes pushes;
  pushes.version = replicator_->version();
  pushes.worker = req.sender;
  std::vector<uint64_t> keys, lens;
  std::vector<Frame::Piece> pieces;
  std::vector<NDArray> owned;
  uint64_t bytes = 0;
  for (AppliedPush& p : ev.pushes) {
    keys.push_back(range_.PsKey(p.key));
    lens.push_back(p.grad.nbytes());
    bytes += p.grad.nbytes();
    pushes.keys.push_back({p.seq, p.schedule_at, p.count});
    if (p.dequantized) {
      pieces.push_back({static_cast<const char*>(p.grad.raw()), p.grad.nbytes()});
      owned.push_back(std::move(p.grad));
    } else {  // the request's own bytes (the message keeps its buffers)
      req.msg.ForEachPiece(p.off, p.len, [&](const char* d, uint64_t n, uint64_t) {
        pieces.push_back({d, n});
      });
    }
  }
  Message m;
  m.h.flags = kPush;
  m.h.head = dist::MakeCmd(Kind::kReplicateAsync, ev.dtype);
  m.h.num_keys = static_cast<uint32_t>(keys.size());
  m.h.vals_len = bytes;
  m.keys = U64Frame(keys);
  m.lens = U64Frame(lens);
  auto owner = std::make_shared<CopyOwner>(CopyOwner{req.msg.chunks, std::move(owned)});
  m.vals = Frame::Gather(std::move(pieces), std::move(owner));
  m.body = wire::EncodeAsyncPushes(pushes);
  struct Pending {
    KVRequest req;
    KeyValues answer;
    std::optional<Failure> failure;
  };
  auto p = std::make_shared<Pending>(
      Pending{AnswerOf(req), std::move(ev.answer), std::move(ev.failure)});
  replicator_->Send(to, std::move(m), [this, p](std::exception_ptr e) {
    try {
      if (e && !p->failure) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          p->failure = Failure{KindOf(ex), std::string("replication failed: ") + ex.what()};
        }
      }
      if (p->failure)
        store_->answers().Error(p->req, *p->failure);
      else
        store_->answers().Values(p->req, std::move(p->answer));
    } catch (const std::exception& ex) {
      PSKV_WARN(node_->Tag() << ": " << ex.what());
    }
    p->answer.clear();  // releases the values' tokens
  });
  return true;
}

}  // namespace pskv
