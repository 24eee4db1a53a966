// DistServer: copying a range's changes to its replicas, and applying them there
// (dist_server.h, "Replicated servers"; docs/fault-tolerance.md).
#include <cstring>
#include <functional>

#include "common/byte_io.h"
#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/dist_server.h"

namespace pskv {

using dist::Kind;
namespace wire = dist::replication_wire;

std::vector<int> DistServer::ReplicaTargets(const KVRequest& req) const {
  // Only a worker's request is copied on: what a primary sends is applied, not sent
  // on again.
  if (!replicator_ || !IsWorkerId(req.sender)) return {};
  return replicator_->Targets(RangeIndex());
}

void DistServer::Replicate(int64_t key, KeyState& st, const std::vector<int>& to, ReplyOwner sum,
                           int64_t round, std::vector<Round::Entry> done) {
  // A one-key push-pull whose worker named the round's only replica as its answerer
  // (a copy on the worker's host, ps/kv_app.h) is answered there, once it applied the
  // round, instead of from here: with one replica, every copy holds the round then.
  // Only with PSKV_REPLICAS=1: with more, `to` may be one copy because another left,
  // and that copy may hold the round already (a promoted replica's retried round).
  std::vector<Round::Entry> delegated;
  if (to.size() == 1 && node_->options().replicas == 1) {
    for (size_t i = 0; i < done.size();) {
      const RoundReq& r = *done[i].push.r;
      if (r.req.pull && r.keys.size() == 1 && r.answerer == to[0] && !r.answer_here) {
        delegated.push_back(std::move(done[i]));
        done.erase(done.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
  }
  wire::Round body;
  body.version = replicator_->version();
  body.round = round;
  for (const auto* pushes : {&done, &delegated})
    for (auto& x : *pushes)
      body.counts.push_back(
          {x.sender, x.push.r->counts.empty() ? 0 : x.push.r->counts[x.push.index]});
  for (auto& x : delegated)  // what the replica answers: Delegated
    body.answers.push_back(
        {x.sender, x.push.r->req.timestamp, x.push.r->req.priority, x.push.r->req.cmd});
  Message m;
  m.h.flags = kPush;
  m.h.head = dist::MakeCmd(Kind::kReplicate, sum.value.dtype());
  m.h.num_keys = 1;
  m.h.vals_len = sum.value.nbytes();
  m.keys = U64Frame({dist::PsKey(key, RangeIndex(), node_->num_servers())});
  m.lens = U64Frame({sum.value.nbytes()});
  auto owner = std::make_shared<ReplyOwner>(std::move(sum));
  m.vals = Frame::Of(owner->value.raw(), owner->value.nbytes(), owner);
  m.body = wire::EncodeRound(body);
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
    if (!left->empty() && !e && replicator_->Holds(RangeIndex(), answerer)) left->clear();
    pushes->insert(pushes->end(), std::make_move_iterator(left->begin()),
                   std::make_move_iterator(left->end()));
    if (sent_us)
      obs::Span("replicate", "replicate", std::to_string(dist::KeyOf(key)), sum_bytes, sent_us,
                obs::NowUs());
    if (!e) {
      node_->fail_points().RoundReplicated(RangeIndex());
      for (auto& x : *pushes) {
        ReplyOwner answer = *value;  // each push's answer holds its own reference
        FinishWith(x.push, &answer, nullptr);
      }
      return;
    }
    Failure failure{ErrorKind::kIO, "replication failed"};
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      failure = {KindOf(ex), std::string("replication failed: ") + ex.what()};
    }
    for (auto& x : *pushes) FinishWith(x.push, nullptr, &failure);
  };
  std::function<void()> send = [this, to, m = std::move(m), answer = std::move(answer)]() mutable {
    replicator_->Send(to, std::move(m), std::move(answer));
  };
  if (!node_->fail_points().HoldReplicatedRound(
          RangeIndex(), round, [this] { return replicator_->version(); }, send))
    send();
}

void DistServer::ApplyReplica(const KVRequest& req) {
  const Message& m = req.msg;
  auto fail = [&](const std::string& why) {
    server_->RespondError(req, ErrorKind::kInvalid, "replication: " + why);
  };
  int64_t key = 0;
  if (!IsServerId(req.sender) || m.num_keys() != 1 || !Range().WireKeyOf(m.key_ptr()[0], &key))
    return fail("malformed request");
  KeyState* st = FindKey(key);
  if (!st) return fail("key " + std::to_string(dist::KeyOf(key)) + " is not held here");
  const int dt = dist::CmdDType(req.cmd);
  if (!IsValidDType(dt) || m.len_ptr()[0] % DTypeSize(static_cast<DType>(dt)) ||
      static_cast<int64_t>(m.len_ptr()[0] / DTypeSize(static_cast<DType>(dt))) != st->value.size())
    return fail("a sum of another size");
  uint64_t version = 0;
  int64_t round = 0;
  std::vector<std::pair<int, uint64_t>> counts;
  std::vector<Delegated> answers;  // the primary's workers this copy answers (Replicate)
  try {
    wire::Round body = wire::ParseRound(m.body);
    version = body.version;
    round = body.round;
    for (const wire::PushCount& c : body.counts) {
      if (!IsJobWorker(c.worker))
        return fail("a push count of node id " + std::to_string(c.worker) +
                    ", which is not a worker of this job");
      counts.emplace_back(c.worker, c.count);
    }
    for (const wire::DelegatedAnswer& a : body.answers) {
      if (!IsJobWorker(a.worker))
        return fail("an answer to node id " + std::to_string(a.worker) +
                    ", which is not a worker of this job");
      answers.push_back({a.worker, a.timestamp, a.priority, a.cmd});
    }
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  // Only the range's primary replicates it, per this node's range table (a round that
  // claims a newer table waited for it: ReplicaHost::FromServer). A server the job
  // went on without never gets here (Node drops what it sends).
  (void)version;
  const auto [primary, known] = node_->RangePrimary(RangeIndex());
  if (req.sender != primary)
    return fail("a round of key range " + std::to_string(RangeIndex()) + " from " +
                node_->NodeName(req.sender) + ", which is not its primary in range table v" +
                std::to_string(known));
  // Rounds arrive in order: the primary sends round r + 1 only after this replica
  // acknowledged round r. A round already held is acknowledged again (a new primary
  // re-sending it), never applied twice.
  if (round < st->round.round()) {
    server_->Respond(req);
    // Answers left to this copy for the round it applied last are given from its state
    // (the key's value is that round's until its next round runs here).
    if (round + 1 == st->round.round()) AnswerDelegated(key, *st, answers, nullptr);
    return;
  }
  if (round > st->round.round())
    return fail("round " + std::to_string(round) + " of key " + std::to_string(dist::KeyOf(key)) +
                " before round " + std::to_string(st->round.round()));
  // Acknowledged on receipt, applied right after (docs/fault-tolerance.md,
  // "Steady-state cost"): from here the round is safe on this replica — its sum is in
  // this request's buffers, and its update runs next on the key's shard, before any
  // later request of the key (a promotion's retried pushes, the next round, a states
  // snapshot) — so the primary's answer does not wait for the update. The update is
  // the primary's (same sum, same code, same bits); should it fail here all the same,
  // the round stays open and the primary's next round of the key is refused with
  // "round r + 1 before round r", failing its pushes instead of diverging silently.
  server_->Respond(req);
  if (!answers.empty())
    node_->fail_points().DelegatedRoundAcknowledged(RangeIndex(), answers.size());
  const uint64_t bytes = m.len_ptr()[0];
  obs::StepScope obs_apply("replica", dist::KeyOf(key), bytes);  // [observe]
  std::string scratch;
  const bool by_optimizer = OptimizerOf(key) != nullptr;
  if (by_optimizer) {  // the update only reads the sum: a view of the receive buffer
    st->merge = ValueView(m.Contiguous(0, bytes, &scratch), bytes, static_cast<DType>(dt));
  } else {  // the sum becomes the value (ApplyRound takes its buffer): a copy of its own
    st->merge = NDArray({st->value.size()}, static_cast<DType>(dt));
    m.CopyVals(0, bytes, static_cast<char*>(st->merge.raw()));
  }
  try {
    ApplyRound(key, *st);
  } catch (const std::exception& e) {
    st->merge = NDArray();
    PSKV_ERROR(node_->Tag() << ": key range " << RangeIndex() << ": replicated round " << round
                            << " of key " << dist::KeyOf(key) << " failed to apply: " << e.what());
    const Failure failure{KindOf(e), std::string("update failed on a replica: ") + e.what()};
    AnswerDelegated(key, *st, answers, &failure);
    return;
  }
  if (by_optimizer) st->merge = NDArray();  // no view of the request outlives it
  st->round.Advance();
  for (auto& [id, count] : counts)
    if (count) st->applied_push[id] = count;
  AnswerDelegated(key, *st, answers, nullptr);
  // With two replicas or more this copy may be promoted while another missed this
  // round: kept for ResendLastRounds (the request's buffers, no copy of the sum).
  if (node_->options().replicas >= 2) st->last_round = std::make_shared<const Message>(m);
}

void DistServer::AnswerDelegated(int64_t key, KeyState& st, const std::vector<Delegated>& answers,
                                 const Failure* failure) {
  for (const Delegated& d : answers) {
    KVRequest req;
    req.sender = d.worker;
    req.timestamp = d.timestamp;
    req.cmd = d.cmd;
    req.priority = d.priority;
    req.push = req.pull = true;
    try {
      if (failure) {
        server_->RespondError(req, failure->kind, failure->message);
      } else {
        ReplyValues(req, {{key, ReplyOwner{st.value, st.token}}});
        answered_for_primary_.fetch_add(1, std::memory_order_relaxed);
      }
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": " << e.what());
    }
  }
}

void DistServer::ForwardInit(const KVRequest& req, const std::vector<int>& to) {
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
  auto answer = std::make_shared<KVRequest>();
  answer->sender = req.sender;
  answer->timestamp = req.timestamp;
  answer->cmd = req.cmd;
  answer->priority = req.priority;
  answer->push = req.push;
  answer->pull = req.pull;
  answer->received_us = req.received_us;
  replicator_->Send(to, std::move(m), [this, answer, init](std::exception_ptr e) {
    try {
      if (!e && init) node_->fail_points().InitForwarded(RangeIndex());
      if (!e) return server_->Respond(*answer);
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        server_->RespondError(*answer, KindOf(ex), std::string("replication failed: ") + ex.what());
      }
    } catch (const std::exception& ex) {
      PSKV_WARN(node_->Tag() << ": " << ex.what());
    }
  });
}

}  // namespace pskv
