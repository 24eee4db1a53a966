// DistServer: copying a range's async pushes to its replicas, and applying them there
// (dist_server.h, "Replicated servers"; docs/fault-tolerance.md).
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
// it is an error (a gap: a copy was lost). Like a replicated round (replica_rounds.cc), a copy
// starts with the sender's range-table version and is taken only from the range's
// primary (NotFromPrimary).
#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/dist_server.h"

namespace pskv {

using dist::Kind;
namespace wire = dist::replication_wire;

std::vector<uint64_t> DistServer::PushCounts(const KVRequest& req, size_t num_keys) {
  return PushBody::Parse(req.msg.body, num_keys).counts;
}

DistServer::InitOrigin DistServer::InitOriginOf(const KVRequest& req, size_t num_keys) const {
  InitOrigin o;
  if (!IsServerId(req.sender)) {
    o.worker = req.sender;
    o.counts = PushCounts(req, num_keys);
    return o;
  }
  // Forwarded (ForwardInit): the primary's range-table version, the worker, its counts.
  wire::ForwardedInit init;
  try {
    init = wire::ParseForwardedInit(req.msg.body, num_keys);
  } catch (const ProtocolError&) {
    return o;  // malformed: no push of a worker is recorded
  }
  if (!IsJobWorker(init.worker)) return o;  // a forged origin: likewise
  o.worker = init.worker;
  o.counts = std::move(init.counts);
  return o;
}

bool DistServer::AlreadyApplied(const KeyState& st, int sender, const std::vector<uint64_t>& counts,
                                size_t index) {
  if (counts.empty()) return false;
  auto it = st.applied_push.find(sender);
  return it != st.applied_push.end() && counts[index] <= it->second;
}

std::string DistServer::NotFromPrimary(const KVRequest& req) const {
  uint64_t version = 0;
  try {
    version = wire::ParseVersion(req.msg.body);
  } catch (const ProtocolError&) {
    return "a replicated change without its table version";
  }
  // Only the range's primary replicates it, per this node's range table: a change that
  // claims a newer table waited for it (ReplicaHost::FromServer), never taken on trust.
  (void)version;
  const auto [primary, known] = node_->RangePrimary(RangeIndex());
  if (req.sender == primary) return {};
  return "a change of key range " + std::to_string(RangeIndex()) + " from " +
         node_->NodeName(req.sender) + ", which is not its primary in range table v" +
         std::to_string(known);
}

bool DistServer::IsJobWorker(int id) const {
  return IsWorkerId(id) && RankOfId(id) < node_->num_workers();
}

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

}  // namespace

void DistServer::ReplicateAsync(const KVRequest& req, const std::vector<int>& to, AsyncCopy copy,
                                std::vector<std::pair<int64_t, ReplyOwner>> answer,
                                std::optional<Failure> failure) {
  Message m;
  m.h.flags = kPush;
  m.h.head = dist::MakeCmd(Kind::kReplicateAsync, copy.dtype);
  m.h.num_keys = static_cast<uint32_t>(copy.keys.size());
  uint64_t bytes = 0;
  for (uint64_t n : copy.lens) bytes += n;
  m.h.vals_len = bytes;
  m.keys = U64Frame(copy.keys);
  m.lens = U64Frame(copy.lens);
  auto owner = std::make_shared<CopyOwner>(CopyOwner{req.msg.chunks, std::move(copy.owned)});
  m.vals = Frame::Gather(std::move(copy.pieces), std::move(owner));
  m.body = wire::EncodeAsyncPushes(copy.pushes);
  struct Pending {
    KVRequest req;
    std::vector<std::pair<int64_t, ReplyOwner>> answer;
    std::optional<Failure> failure;
  };
  auto p = std::make_shared<Pending>(Pending{AnswerOf(req), std::move(answer), std::move(failure)});
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
        server_->RespondError(p->req, p->failure->kind, p->failure->message);
      else
        ReplyValues(p->req, std::move(p->answer));
    } catch (const std::exception& ex) {
      PSKV_WARN(node_->Tag() << ": " << ex.what());
    }
    p->answer.clear();  // releases the values' tokens
  });
}

void DistServer::ApplyAsyncReplica(const KVRequest& req) {
  const Message& m = req.msg;
  auto fail = [&](const std::string& why) {
    server_->RespondError(req, ErrorKind::kInvalid, "async replication: " + why);
  };
  const int dt = dist::CmdDType(req.cmd);
  if (!IsServerId(req.sender) || !IsValidDType(dt)) return fail("malformed request");
  const DType dtype = static_cast<DType>(dt);
  struct One {
    int64_t key;
    KeyState* st;
    uint64_t off, len;
    int64_t seq, schedule_at;
    uint64_t count;
  };
  if (std::string why = NotFromPrimary(req); !why.empty()) return fail(why);
  std::vector<One> ones;
  int sender = 0;
  // Everything is checked before any key changes.
  try {
    // The sender's range-table version was checked by NotFromPrimary.
    const wire::AsyncPushes body = wire::ParseAsyncPushes(m.body, m.num_keys());
    sender = body.worker;
    if (!IsJobWorker(sender))
      return fail("a push of node id " + std::to_string(sender) +
                  ", which is not a worker of this job");
    uint64_t off = 0;
    for (uint32_t i = 0; i < m.num_keys(); ++i) {
      One o{};
      if (!Range().WireKeyOf(m.key_ptr()[i], &o.key)) return fail("a key of another range");
      o.st = FindKey(o.key);
      if (!o.st) return fail("key " + std::to_string(dist::KeyOf(o.key)) + " is not held here");
      if (!OptimizerOf(o.key)) return fail("no optimizer is set here");
      o.off = off;
      o.len = m.len_ptr()[i];
      off += o.len;
      if (o.len != static_cast<uint64_t>(o.st->value.size()) * DTypeSize(dtype) ||
          off > m.h.vals_len)
        return fail("a gradient of another size for key " + std::to_string(dist::KeyOf(o.key)));
      o.seq = body.keys[i].seq;
      o.schedule_at = body.keys[i].schedule_at;
      o.count = body.keys[i].count;
      if (o.seq > o.st->round.round())
        return fail("push " + std::to_string(o.seq) + " of key " +
                    std::to_string(dist::KeyOf(o.key)) + " before push " +
                    std::to_string(o.st->round.round()));
      ones.push_back(o);
    }
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  // With two replicas or more this copy may be promoted while another missed this
  // push: kept for ResendLastRounds (the request's buffers, no copy of the gradients).
  const bool keep = node_->options().replicas >= 2;
  const size_t keep_last = static_cast<size_t>(std::max(node_->num_workers(), 1));
  std::shared_ptr<const Message> kept;
  const uint64_t index = keep ? ++async_applied_ : 0;
  for (One& o : ones) {
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
    Detach(st);
    std::string scratch;
    const NDArray grad = ValueView(m.Contiguous(o.off, o.len, &scratch), o.len, dtype);
    try {
      OptimizerOf(o.key)->Update(dist::OptimizerKey(o.key), grad, &st.value, &o.schedule_at);
    } catch (const std::exception& e) {
      return server_->RespondError(req, KindOf(e), std::string("update failed: ") + e.what());
    }
    st.round.Advance();
    if (o.count) st.applied_push[sender] = o.count;
    if (keep) {
      if (!kept) kept = std::make_shared<const Message>(m);
      st.async_copies.emplace_back(index, kept);
      while (st.async_copies.size() > keep_last) st.async_copies.pop_front();
    }
  }
  server_->Respond(req);
}

}  // namespace pskv
