// ReplicaApply: a replica applies the changes its range's primary copies to it
// (replica_apply.h; docs/fault-tolerance.md).
//
// Async pushes (ApplyAsync; the primary's side: PrimaryReplication::OnAsyncApplied).
//
// What is copied is each push as the primary applied it: the gradient (dequantized
// if it was compressed), the key's apply sequence (how many pushes the key held
// before, + 1) and the optimizer-wide update count the primary's rate came from
// (Optimizer::Update's `schedule_at`). A replica applies a key's pushes in sequence
// order with the same Optimizer::Update, the same gradient and the same rate, so its
// value and optimizer state are the primary's, bit for bit, whatever order its
// shards interleave different keys in. The alternative, copying each key's new value
// and optimizer state, would send (1 + the optimizer's slots) times the bytes (three
// times for Adam) for the same result.
//
// Ordering: one key's pushes are applied on the primary by one shard thread (or an
// exclusive section), which sends their copies in that order over one connection;
// the replica handles one key's requests in arrival order (dist_server.h,
// "Threads"). A copy whose sequence the replica already passed is acknowledged, not
// applied (a new primary sending what the replica holds), unless its push (worker,
// push count) is not held here (this copy was ahead of a promoted one); one ahead of
// it is an error (a gap: a copy was lost). Like a replicated round (ApplyRound), a copy
// starts with the sender's range-table version and is taken only from the range's
// primary (NotFromPrimary).
#include "kvstore/distributed/server/replica_apply.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/replication_wire.h"

namespace pskv {

using dist::Kind;
namespace wire = dist::replication_wire;

std::string NotFromPrimary(const Node& node, int range, const KVRequest& req) {
  uint64_t version = 0;
  try {
    version = wire::ParseVersion(req.msg.body);
  } catch (const ProtocolError&) {
    return "a replicated change without its table version";
  }
  // Only the range's primary replicates it, per this node's range table: a change that
  // claims a newer table waited for it (ReplicaHost::FromServer), never taken on trust.
  (void)version;
  const auto [primary, known] = node.RangePrimary(range);
  if (req.sender == primary) return {};
  return "a change of key range " + std::to_string(range) + " from " + node.NodeName(req.sender) +
         ", which is not its primary in range table v" + std::to_string(known);
}

ReplicaApply::ReplicaApply(Node* node, RangeOf range, Replicator* replicator, RangeStore* store,
                           ShardPool<KVRequest>* pool)
    : node_(node),
      range_(range),
      replicator_(replicator),
      store_(store),
      pool_(pool),
      keep_(node->options().replicas >= 2),
      kept_(store->num_shards()) {}

ReplicaApply::~ReplicaApply() {
  if (const uint64_t n = answered_for_primary_.load())
    PSKV_WARN(node_->Tag() << ": key range " << range_.index() << ": answered " << n
                           << " push-pull(s) of workers on this host for the range's primary");
}

// Dense rounds (the primary's side: PrimaryReplication::OnRoundClosed).
// Everything a kReplicate request says, checked before anything changes: "" or why
// it is refused.
std::string ReplicaApply::CheckRound(const KVRequest& req, RoundIn* in) {
  const Message& m = req.msg;
  int64_t& key = in->key;
  if (!IsServerId(req.sender) || m.num_keys() != 1 ||
      !range_.keys().WireKeyOf(m.key_ptr()[0], &key))
    return "malformed request";
  KeyState* st = in->st = store_->FindKey(key);
  if (!st) return "key " + std::to_string(dist::KeyOf(key)) + " is not held here";
  const int dt = dist::CmdDType(req.cmd);
  if (!IsValidDType(dt) || m.len_ptr()[0] % DTypeSize(static_cast<DType>(dt)) ||
      static_cast<int64_t>(m.len_ptr()[0] / DTypeSize(static_cast<DType>(dt))) != st->value.size())
    return "a sum of another size";
  uint64_t version = 0;
  try {
    wire::Round body = wire::ParseRound(m.body);
    version = body.version;
    in->round = body.round;
    for (const wire::PushCount& c : body.counts) {
      if (!IsJobWorker(c.worker, node_->num_workers()))
        return "a push count of node id " + std::to_string(c.worker) +
               ", which is not a worker of this job";
      in->counts.emplace_back(c.worker, c.count);
    }
    for (const wire::DelegatedAnswer& a : body.answers) {
      if (!IsJobWorker(a.worker, node_->num_workers()))
        return "an answer to node id " + std::to_string(a.worker) +
               ", which is not a worker of this job";
      in->answers.push_back({a.worker, a.timestamp, a.priority, a.cmd});
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  // Only the range's primary replicates it, per this node's range table (a round that
  // claims a newer table waited for it: ReplicaHost::FromServer). A server the job
  // went on without never gets here (Node drops what it sends).
  (void)version;
  const auto [primary, known] = node_->RangePrimary(range_.index());
  if (req.sender != primary)
    return "a round of key range " + std::to_string(range_.index()) + " from " +
           node_->NodeName(req.sender) + ", which is not its primary in range table v" +
           std::to_string(known);
  return {};
}

void ReplicaApply::ApplyRound(const KVRequest& req) {
  const Message& m = req.msg;
  auto fail = [&](const std::string& why) {
    store_->answers().Error(req, {ErrorKind::kInvalid, "replication: " + why});
  };
  RoundIn in;
  if (std::string why = CheckRound(req, &in); !why.empty()) return fail(why);
  const int64_t key = in.key, round = in.round;
  KeyState* st = in.st;
  const int dt = dist::CmdDType(req.cmd);
  const auto& answers = in.answers;
  // Rounds arrive in order: the primary sends round r + 1 only after this replica
  // acknowledged round r. A round already held is acknowledged again (a new primary
  // re-sending it), never applied twice.
  if (round < st->round.round()) {
    store_->answers().Ack(req);
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
  store_->answers().Ack(req);
  if (!answers.empty())
    node_->fail_points().DelegatedRoundAcknowledged(range_.index(), answers.size());
  const uint64_t bytes = m.len_ptr()[0];
  obs::StepScope obs_apply("replica", dist::KeyOf(key), bytes);  // [observe]
  std::string scratch;
  const bool by_optimizer = store_->config().OptimizerOf(key) != nullptr;
  if (by_optimizer) {  // the update only reads the sum: a view of the receive buffer
    st->merge = ValueView(m.Contiguous(0, bytes, &scratch), bytes, static_cast<DType>(dt));
  } else {  // the sum becomes the value (ApplyRound takes its buffer): a copy of its own
    st->merge = NDArray({st->value.size()}, static_cast<DType>(dt));
    m.CopyVals(0, bytes, static_cast<char*>(st->merge.raw()));
  }
  try {
    store_->ApplyRound(key, *st);
  } catch (const std::exception& e) {
    st->merge = NDArray();
    PSKV_ERROR(node_->Tag() << ": key range " << range_.index() << ": replicated round " << round
                            << " of key " << dist::KeyOf(key) << " failed to apply: " << e.what());
    const Failure failure{KindOf(e), std::string("update failed on a replica: ") + e.what()};
    AnswerDelegated(key, *st, answers, &failure);
    return;
  }
  if (by_optimizer) st->merge = NDArray();  // no view of the request outlives it
  st->round.Advance();
  for (auto& [id, count] : in.counts)
    if (count) st->applied_push[id] = count;
  AnswerDelegated(key, *st, answers, nullptr);
  // With two replicas or more this copy may be promoted while another missed this
  // round: kept for ResendLastRounds (the request's buffers, no copy of the sum).
  if (keep_) kept_[store_->ShardOf(key)][key].last_round = std::make_shared<const Message>(m);
}

void ReplicaApply::AnswerDelegated(int64_t key, KeyState& st, const std::vector<Delegated>& answers,
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
        store_->answers().Error(req, *failure);
      } else {
        store_->answers().Values(req, {{key, ReplyOwner{st.value, st.token}}});
        answered_for_primary_.fetch_add(1, std::memory_order_relaxed);
      }
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": " << e.what());
    }
  }
}

// Everything a kReplicateAsync request says, checked before any key changes: "" or
// why it is refused. Fills `ones` (per key) and `sender` (the worker that pushed).
std::string ReplicaApply::CheckAsync(const KVRequest& req, DType dtype, std::vector<AsyncIn>* ones,
                                     int* sender) {
  const Message& m = req.msg;
  try {
    // The sender's range-table version was checked by NotFromPrimary.
    const wire::AsyncPushes body = wire::ParseAsyncPushes(m.body, m.num_keys());
    *sender = body.worker;
    if (!IsJobWorker(*sender, node_->num_workers()))
      return "a push of node id " + std::to_string(*sender) + ", which is not a worker of this job";
    uint64_t off = 0;
    for (uint32_t i = 0; i < m.num_keys(); ++i) {
      AsyncIn o{};
      if (!range_.keys().WireKeyOf(m.key_ptr()[i], &o.key)) return "a key of another range";
      o.st = store_->FindKey(o.key);
      if (!o.st) return "key " + std::to_string(dist::KeyOf(o.key)) + " is not held here";
      if (!store_->config().OptimizerOf(o.key)) return "no optimizer is set here";
      o.off = off;
      o.len = m.len_ptr()[i];
      off += o.len;
      if (o.len != static_cast<uint64_t>(o.st->value.size()) * DTypeSize(dtype) ||
          off > m.h.vals_len)
        return "a gradient of another size for key " + std::to_string(dist::KeyOf(o.key));
      o.seq = body.keys[i].seq;
      o.schedule_at = body.keys[i].schedule_at;
      o.count = body.keys[i].count;
      if (o.seq > o.st->round.round())
        return "push " + std::to_string(o.seq) + " of key " + std::to_string(dist::KeyOf(o.key)) +
               " before push " + std::to_string(o.st->round.round());
      ones->push_back(o);
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

void ReplicaApply::ApplyAsync(const KVRequest& req) {
  const Message& m = req.msg;
  auto fail = [&](const std::string& why) {
    store_->answers().Error(req, {ErrorKind::kInvalid, "async replication: " + why});
  };
  const int dt = dist::CmdDType(req.cmd);
  if (!IsServerId(req.sender) || !IsValidDType(dt)) return fail("malformed request");
  const DType dtype = static_cast<DType>(dt);
  if (std::string why = NotFromPrimary(*node_, range_.index(), req); !why.empty()) return fail(why);
  std::vector<AsyncIn> ones;
  int sender = 0;
  if (std::string why = CheckAsync(req, dtype, &ones, &sender); !why.empty()) return fail(why);
  // With two replicas or more this copy may be promoted while another missed this
  // push: kept for ResendLastRounds (the request's buffers, no copy of the gradients).
  const size_t keep_last = static_cast<size_t>(std::max(node_->num_workers(), 1));
  std::shared_ptr<const Message> kept;
  const uint64_t index = keep_ ? ++async_applied_ : 0;
  for (AsyncIn& o : ones) {
    KeyState& st = *o.st;
    // A sequence this copy passed: held already (a new primary sending it again), unless
    // the push is not held here: this copy was ahead of the promoted one (the dead
    // primary's last copy reached it only), and another worker's push took that
    // sequence on the new primary, which applies the retried push later. Applied now,
    // each push is held once; the sequences agree again when the retried push comes.
    if (o.seq < st.round.round()) {
      auto held = st.applied_push.find(sender);
      if (o.count == 0 || (held != st.applied_push.end() && o.count <= held->second)) continue;
    }
    store_->Detach(st);
    std::string scratch;
    const NDArray grad = ValueView(m.Contiguous(o.off, o.len, &scratch), o.len, dtype);
    try {
      store_->config().OptimizerOf(o.key)->Update(dist::OptimizerKey(o.key), grad, &st.value,
                                                  &o.schedule_at);
    } catch (const std::exception& e) {
      return store_->answers().Error(req, {KindOf(e), std::string("update failed: ") + e.what()});
    }
    st.round.Advance();
    if (o.count) st.applied_push[sender] = o.count;
    if (keep_) {
      if (!kept) kept = std::make_shared<const Message>(m);
      auto& copies = kept_[store_->ShardOf(o.key)][o.key].async_copies;
      copies.emplace_back(index, kept);
      while (copies.size() > keep_last) copies.pop_front();
    }
  }
  store_->answers().Ack(req);
}

// A row_sparse round of `key` from the primary (its sender checked here).
void ReplicaApply::ApplySparse(int64_t key, KVRequest&& req, KVServer* server) {
  std::string why =
      IsServerId(req.sender) ? NotFromPrimary(*node_, range_.index(), req) : "not from a server";
  if (!why.empty())
    return store_->answers().Error(req, {ErrorKind::kInvalid, "row_sparse replication: " + why});
  store_->sparse().ApplyCopy(
      key, std::move(req), server, store_->config().OptimizerOf(key),
      [this](int id) { return IsJobWorker(id, node_->num_workers()); }, keep_);
}

}  // namespace pskv
