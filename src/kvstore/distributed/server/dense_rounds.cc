// DistServer: the sync rounds of dense keys (merge, apply, answer).
#include <cstring>

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/dist_server.h"

namespace pskv {

using dist::Kind;

void DistServer::JoinRounds(KVRequest&& req, const std::vector<Item>& items) {
  // Answered once all its keys' rounds completed (one key, or several: a fused
  // message of independent pushes).
  if (items.empty())
    return server_->RespondError(req, ErrorKind::kInvalid, "a sync push without keys");
  LeftBarrier(req.sender);  // a push from a worker means it left any barrier it was in
  auto r = std::make_shared<RoundReq>();
  r->req = std::move(req);
  r->left = items.size();
  r->keys.reserve(items.size());
  r->offs.reserve(items.size());
  r->lens.reserve(items.size());
  for (auto& it : items) {
    r->keys.push_back(it.key);
    r->offs.push_back(it.off);
    r->lens.push_back(it.len);
  }
  if (r->req.pull) r->done.resize(items.size());
  if (replicator_ && !r->req.msg.body.empty()) {  // push counts (replicated only)
    PushBody body = PushBody::Parse(r->req.msg.body, items.size());
    r->counts = std::move(body.counts);
    r->answerer = body.answerer;
  }
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < items.size(); ++i)
    JoinRound(items[i].key, *items[i].st, Waiter{r, i}, now);
}

// Adds push `w` to the open round of `key`; completes the round when every worker
// pushed. On the key's shard (or exclusively).
void DistServer::JoinRound(int64_t key, KeyState& st, Waiter w, Clock::time_point now) {
  const int sender = w.r->req.sender;
  const uint64_t bytes = w.r->lens[w.index];
  const int workers = node_->num_workers();
  if (!w.r->counts.empty()) {
    // A push this key already holds (retried after a failover: its primary replicated
    // the round but died before answering): answered from the value, not applied.
    auto it = st.applied_push.find(sender);
    if (it != st.applied_push.end() && w.r->counts[w.index] <= it->second) {
      answered_from_state_.fetch_add(1, std::memory_order_relaxed);
      return Finish(w, &st, nullptr);
    }
  }
  st.round.Join(sender, std::move(w), now);
  std::vector<Round::Entry> done;
  std::vector<int> replicas;
  try {
    obs::StepScope obs_merge("merge", dist::KeyOf(key), bytes);  // [observe]
    st.round.Merge(node_->options().sum_in_arrival_order ? SumOrder::kArrival : SumOrder::kRank,
                   workers, [&](const Waiter& x, bool first) { Merge(st, x, first); });
    if (!st.round.complete(workers)) return;  // answered when the round completes
    done = st.round.Take();
    obs::StepScope obs_step("update", dist::KeyOf(key), st.value.nbytes());  // [observe]
    replicas = ReplicaTargets(done.front().push.r->req);
    // Without an optimizer and in the value's dtype the sum becomes the value
    // (ApplyRound takes st.merge's buffer); else the update only reads st.merge.
    const bool sum_becomes_value = !OptimizerOf(key) && st.merge.dtype() == st.value.dtype();
    const int64_t round = st.round.round();
    ApplyRound(key, st);
    st.round.Advance();
    for (auto& x : done)
      if (!x.push.r->counts.empty()) st.applied_push[x.sender] = x.push.r->counts[x.push.index];
    if (!replicas.empty()) {
      // The sum goes to the replicas without a copy, its buffer held by the message
      // through a token (the value's, or the merge buffer's: Merge starts the next
      // round in a new buffer while a message still holds it).
      ReplyOwner sum =
          sum_becomes_value ? ReplyOwner{st.value, st.token} : ReplyOwner{st.merge, st.merge_token};
      return Replicate(key, st, replicas, std::move(sum), round, std::move(done));
    }
  } catch (const std::exception& e) {
    const Failure failure{KindOf(e), std::string("update failed: ") + e.what()};
    FailRound(done.empty() ? st.round.Take() : std::move(done), failure);
    return;
  }
  for (auto& x : done) Finish(x.push, &st, nullptr);
  st.round.Recycle(std::move(done));  // its capacity serves the next round
}

bool DistServer::RetryOfWaitingPush(const KVRequest& req) {
  const Message& m = req.msg;
  int64_t key = 0;
  if (m.num_keys() != 1 || !Range().WireKeyOf(m.key_ptr()[0], &key)) return false;
  const PushBody body = PushBody::Parse(m.body, 1);
  KeyState* st = body.counts.empty() ? nullptr : FindKey(key);
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

void DistServer::FailRound(std::vector<Round::Entry> pushes, const Failure& failure) {
  for (auto& x : pushes) Finish(x.push, nullptr, &failure);
}

// One key of a sync request is done: `st` holds its new value, or null when its
// round failed. The last key answers the request (one reply for all its keys).
void DistServer::Finish(const Waiter& w, KeyState* st, const Failure* failure) {
  if (!st) return FinishWith(w, nullptr, failure);
  if (!w.r->req.pull) {  // nothing to answer with: no reference to take
    ReplyOwner none;
    return FinishWith(w, &none, nullptr);
  }
  ReplyOwner value{st->value, st->token};
  FinishWith(w, &value, failure);
}

void DistServer::FinishWith(const Waiter& w, ReplyOwner* value, const Failure* failure) {
  RoundReq& r = *w.r;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    if (value) {
      if (r.req.pull) r.done[w.index] = {r.keys[w.index], std::move(*value)};
    } else if (!r.failure) {
      r.failure = *failure;
    }
    if (--r.left > 0) return;
  }
  try {
    if (r.failure)
      server_->RespondError(r.req, r.failure->kind, r.failure->message);
    else
      ReplyValues(r.req, std::move(r.done));
  } catch (const std::exception& e) {
    PSKV_WARN(node_->Tag() << ": " << e.what());
  }
  r.done.clear();  // releases the values' tokens (what the answer did not take)
}

void DistServer::Merge(KeyState& st, const Waiter& w, bool first) {
  const KVRequest& req = w.r->req;
  const Message& m = req.msg;
  const uint64_t off = w.r->offs[w.index], len = w.r->lens[w.index];
  if (first && st.merge_token.use_count() > 1) {  // a replication message still sends it
    st.merge = NDArray();
    st.merge_token = std::make_shared<int>(0);
  }
  if (dist::CmdKind(req.cmd) == Kind::kCompressed) {
    if (st.merge.empty()) st.merge = NDArray({st.value.size()}, DType::kFloat32);
    if (first) st.merge.Fill(0);
    std::string scratch;
    const char* data = m.Contiguous(off, len, &scratch);
    compressor_->DequantizeAdd(reinterpret_cast<const uint8_t*>(data), st.merge.data<float>(),
                               st.value.size());
    return;
  }
  const Optimizer* opt = OptimizerOf(st.wire_key);
  const bool mp = opt && opt->config().multi_precision && IsLowPrecision(st.value.dtype());
  const DType mdt = mp ? DType::kFloat32 : st.value.dtype();
  if (st.merge.empty() || st.merge.dtype() != mdt) st.merge = NDArray({st.value.size()}, mdt);
  const size_t es = DTypeSize(st.value.dtype());
  if (first && mdt == st.value.dtype() && st.value.size() < reducer_.bigarray_bound()) {
    // The first push of a round is copied as it is (the small keys of a fused message:
    // no per-key arrays, no piece list; big values are copied in parallel below).
    char* dst = static_cast<char*>(st.merge.raw());
    m.ForEachPiece(off, len, [&](const char* p, uint64_t bytes, uint64_t at) {
      std::memcpy(dst + at, p, bytes);
    });
    return;
  }
  // Chunk by chunk, straight from the receive buffers; the chunks of a big value in
  // parallel on the reducer's pool (each chunk is below the bound, so a chunk-wise
  // merge alone would never use it), their additions by the pool-less serial_.
  struct Piece {
    const char* p;
    uint64_t bytes, at;
  };
  std::vector<Piece> pieces;
  m.ForEachPiece(off, len, [&](const char* p, uint64_t bytes, uint64_t at) {
    pieces.push_back({p, bytes, at});
  });
  auto merge = [&](const Piece& pc, Reducer& r) {
    NDArray in = ValueView(pc.p, pc.bytes, st.value.dtype());
    NDArray part = st.merge.Slice1D(static_cast<int64_t>(pc.at / es), in.size());
    if (first) {
      part.CopyFrom(in);
    } else if (mdt == in.dtype()) {
      r.AddTo(in, &part);
    } else {
      r.AddTo(in.AsType(mdt), &part);
    }
  };
  if (pieces.size() < 2 || st.value.size() < reducer_.bigarray_bound()) {
    for (auto& pc : pieces) merge(pc, reducer_);
    return;
  }
  std::mutex err_mu;
  std::exception_ptr err;
  reducer_.ParallelFor(static_cast<int64_t>(pieces.size()), [&](int64_t b, int64_t e) {
    try {
      for (int64_t i = b; i < e; ++i) merge(pieces[static_cast<size_t>(i)], serial_);
    } catch (...) {
      std::lock_guard<std::mutex> lk(err_mu);
      if (!err) err = std::current_exception();
    }
  });
  if (err) std::rethrow_exception(err);
}

// The round's sum (st.merge) updates the value.
void DistServer::ApplyRound(int64_t key, KeyState& st) {
  Optimizer* opt = OptimizerOf(key);
  if (!opt && st.merge.dtype() == st.value.dtype()) {
    // No optimizer: the sum becomes the value by taking its buffer (no copy); the
    // old value's buffer becomes the next round's merge buffer, unless replies still
    // being sent hold it (then they keep it and a new one is made when needed).
    // Both are 1-D arrays of the value's size: a swap of handles.
    std::swap(st.value, st.merge);
    if (st.token.use_count() > 1) {
      st.token = std::make_shared<int>(0);
      st.merge = NDArray();
    }
    return;
  }
  Detach(st);
  if (opt) {
    opt->Update(dist::OptimizerKey(key), st.merge, &st.value);
  } else if (st.merge.dtype() == st.value.dtype()) {
    reducer_.Copy(st.merge, &st.value);  // in parallel when big
  } else {
    st.value.CopyFrom(st.merge);
  }
}

}  // namespace pskv
