// RangeStore: the sync rounds of dense keys (join, merge, close, apply). What happens
// when a round closes is JoinRound's second half: the sum updates the value, the push
// counts are recorded, the listener hears OnRoundClosed, and the pushes are answered.
#include <cstring>

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/range_store.h"

namespace pskv {

using dist::Kind;

void RangeStore::JoinRounds(KVRequest&& req, const std::vector<Item>& items) {
  // Answered once all its keys' rounds completed (one key, or several: a fused
  // message of independent pushes).
  if (items.empty()) return answers_->Error(req, {ErrorKind::kInvalid, "a sync push without keys"});
  if (barriers_)
    barriers_->Left(req.sender);  // a push from a worker means it left any barrier it was in
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
  if (replicated_ && !r->req.msg.body.empty()) {  // push counts (replicated only)
    PushBody body = PushBody::Parse(r->req.msg.body, items.size());
    r->counts = std::move(body.counts);
    r->answerer = body.answerer;
  }
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < items.size(); ++i)
    JoinRound(items[i].key, *items[i].st, Waiter{r, i}, now);
}

// Adds push `w` to the open round of `key`; closes the round when every worker
// pushed (elastic: every worker still in the job). On the key's shard (or exclusively).
void RangeStore::JoinRound(int64_t key, KeyState& st, Waiter w, Clock::time_point now) {
  const int sender = w.r->req.sender;
  const uint64_t bytes = w.r->lens[w.index];
  // A push this key already holds (retried after a failover: its primary replicated
  // the round but died before answering): answered from the value, not applied.
  if (AlreadyApplied(st.applied_push, sender, w.r->counts, w.index)) {
    answered_from_state_.fetch_add(1, std::memory_order_relaxed);
    return FinishWithValue(w, st);
  }
  st.round.Join(sender, std::move(w), now);
  try {
    obs::StepScope obs_merge("merge", dist::KeyOf(key), bytes);  // [observe]
    MergeReady(st, node_->options().sum_in_arrival_order ? SumOrder::kArrival : SumOrder::kRank);
  } catch (const std::exception& e) {
    return FailRound(st.round.Take(), {KindOf(e), std::string("update failed: ") + e.what()});
  }
  if (RoundComplete(st.round)) CloseRound(key, st);  // else answered when it completes
}

void RangeStore::MergeReady(KeyState& st, SumOrder order) {
  st.round.Merge(
      order, node_->num_workers(), [&](const Waiter& x, bool first) { Merge(st, x, first); },
      [this](int rank) { return left_workers_.count(WorkerId(rank)) > 0; });
}

bool RangeStore::RoundComplete(const Round& round) const {
  const int workers = node_->num_workers();
  if (left_workers_.empty()) return round.complete(workers);
  if (!round.open()) return false;
  for (int r = 0; r < workers; ++r) {
    const int id = WorkerId(r);
    if (!round.pushed(id) && !left_workers_.count(id)) return false;
  }
  return true;
}

// The round closes: its sum updates the value, the push counts are recorded, the
// listener hears OnRoundClosed, and the pushes are answered.
void RangeStore::CloseRound(int64_t key, KeyState& st) {
  std::vector<Round::Entry> done;
  try {
    done = st.round.Take();
    obs::StepScope obs_step("update", dist::KeyOf(key), st.value.nbytes());  // [observe]
    ScaleSum(st, done.size());
    // Without an optimizer and in the value's dtype the sum becomes the value
    // (ApplyRound takes st.merge's buffer); else the update only reads st.merge.
    const bool sum_becomes_value =
        !config_.OptimizerOf(key) && st.merge.dtype() == st.value.dtype();
    const int64_t round = st.round.round();
    ApplyRound(key, st);
    st.round.Advance();
    for (auto& x : done)
      if (!x.push.r->counts.empty()) st.applied_push[x.sender] = x.push.r->counts[x.push.index];
    if (events_) {
      // The sum, without a copy, its buffer held through a token (the value's, or the
      // merge buffer's: Merge starts the next round in a new buffer while it is held).
      RoundClosed ev{
          key, st,
          sum_becomes_value ? ReplyOwner{st.value, st.token} : ReplyOwner{st.merge, st.merge_token},
          round, done};
      if (events_->OnRoundClosed(ev)) return;
    }
  } catch (const std::exception& e) {
    const Failure failure{KindOf(e), std::string("update failed: ") + e.what()};
    FailRound(done.empty() ? st.round.Take() : std::move(done), failure);
    return;
  }
  for (auto& x : done) FinishWithValue(x.push, st);
  st.round.Recycle(std::move(done));  // its capacity serves the next round
}

// Elastic workers: a round summed `contributors` pushes of num_workers; the sum is
// scaled by num_workers / contributors, so that it stands for num_workers pushes of
// the contributors' mean (rescale_grad keeps meaning 1 / the global batch of
// num_workers workers: the update is the mean gradient of the samples that reached it).
void RangeStore::ScaleSum(KeyState& st, size_t contributors) {
  const int workers = node_->num_workers();
  if (!node_->options().elastic || contributors == 0 || static_cast<int>(contributors) >= workers)
    return;
  short_rounds_.fetch_add(1, std::memory_order_relaxed);
  const double factor = static_cast<double>(workers) / static_cast<double>(contributors);
  NDArray& m = st.merge;
  if (m.dtype() == DType::kFloat32) {
    const float f = static_cast<float>(factor);
    float* p = m.data<float>();
    for (int64_t i = 0; i < m.size(); ++i) p[i] *= f;
  } else if (m.dtype() == DType::kFloat64) {
    double* p = m.data<double>();
    for (int64_t i = 0; i < m.size(); ++i) p[i] *= factor;
  } else {  // low precision and integers: through float64
    NDArray d = m.AsType(DType::kFloat64);
    double* p = d.data<double>();
    for (int64_t i = 0; i < d.size(); ++i) p[i] *= factor;
    m.CopyFrom(d);
  }
}

// Elastic workers: worker `id` left the job (exclusive section). Rounds waiting only
// for it close now with the pushes that arrived (its own, if it pushed before it died).
void RangeStore::WorkerLeft(int id) {
  if (!left_workers_.insert(id).second) return;
  const bool rank_order = !node_->options().sum_in_arrival_order;
  ForEachKey([&](int64_t key, KeyState& st) {
    if (!st.round.open()) return;
    if (rank_order) {
      try {
        MergeReady(st, SumOrder::kRank);  // past the ranks that left without pushing
      } catch (const std::exception& e) {
        return FailRound(st.round.Take(), {KindOf(e), std::string("update failed: ") + e.what()});
      }
    }
    if (RoundComplete(st.round)) CloseRound(key, st);
  });
}

void RangeStore::WorkerJoined(int id) {
  left_workers_.erase(id);
  ForEachKey([&](int64_t, KeyState& st) { st.applied_push.erase(id); });
}

void RangeStore::Merge(KeyState& st, const Waiter& w, bool first) {
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
    config_.compressor->DequantizeAdd(reinterpret_cast<const uint8_t*>(data),
                                      st.merge.data<float>(), st.value.size());
    return;
  }
  const Optimizer* opt = config_.OptimizerOf(st.wire_key);
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
void RangeStore::ApplyRound(int64_t key, KeyState& st) {
  Optimizer* opt = config_.OptimizerOf(key);
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
