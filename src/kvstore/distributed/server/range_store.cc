// RangeStore: a range's keys, its inits and async applies, and the answers of its
// sync pushes (range_store.h).
#include "kvstore/distributed/server/range_store.h"

#include <cstring>

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/shard_pool.h"
#include "kvstore/distributed/wire/replication_wire.h"

namespace pskv {

using dist::Kind;
namespace wire = dist::replication_wire;

NDArray ValueView(const char* data, uint64_t bytes, DType t) {
  const int64_t n = static_cast<int64_t>(bytes / DTypeSize(t));
  if (reinterpret_cast<uintptr_t>(data) % DTypeSize(t) == 0)
    return NDArray::Wrap(const_cast<char*>(data), {n}, t);
  NDArray a({n}, t);
  std::memcpy(a.raw(), data, bytes);
  return a;
}

bool IsJobWorker(int id, int num_workers) {
  return IsWorkerId(id) && RankOfId(id) < num_workers;
}

std::vector<uint64_t> PushCounts(const KVRequest& req, size_t num_keys) {
  return PushBody::Parse(req.msg.body, num_keys).counts;
}

bool AlreadyApplied(const std::map<int, uint64_t>& applied, int sender,
                    const std::vector<uint64_t>& counts, size_t index) {
  if (counts.empty()) return false;
  auto it = applied.find(sender);
  return it != applied.end() && counts[index] <= it->second;
}

InitOrigin InitOriginOf(const KVRequest& req, size_t num_keys, int num_workers) {
  InitOrigin o;
  if (!IsServerId(req.sender)) {
    o.worker = req.sender;
    o.counts = PushCounts(req, num_keys);
    return o;
  }
  // Forwarded (PrimaryReplication::Forward): the primary's range-table version, the
  // worker, its counts.
  wire::ForwardedInit init;
  try {
    init = wire::ParseForwardedInit(req.msg.body, num_keys);
  } catch (const ProtocolError&) {
    return o;  // malformed: no push of a worker is recorded
  }
  if (!IsJobWorker(init.worker, num_workers)) return o;  // a forged origin: likewise
  o.worker = init.worker;
  o.counts = std::move(init.counts);
  return o;
}

Optimizer* RangeConfig::OptimizerOf(int64_t wire_key) const {
  auto it = optimizers.find(dist::StoreOf(wire_key));
  return it == optimizers.end() ? nullptr : it->second.get();
}

RangeStore::RangeStore(const Node* node, RangeOf range, Answers* answers, BarrierBoard* barriers,
                       bool replicated)
    : node_(node),
      range_(range),
      answers_(answers),
      barriers_(barriers),
      replicated_(replicated),
      reducer_(node->options().bigarray_bound, node->options().reduction_threads),
      serial_(INT64_MAX, 1),
      keys_(static_cast<size_t>(ShardPoolSize(node->options().server_threads))) {}

RangeStore::~RangeStore() {
  if (const uint64_t n = answered_from_state_.load())
    PSKV_WARN(node_->Tag() << ": key range " << range_.index() << ": answered " << n
                           << " retried push(es) from the state without applying them again "
                              "(their rounds were replicated before their primary died)");
  if (const uint64_t n = short_rounds_.load())
    PSKV_WARN(node_->Tag() << ": key range " << range_.index() << ": " << n
                           << " sync round(s) closed with fewer pushes than workers (PSKV_ELASTIC: "
                              "workers left the job); their sums were scaled by workers / pushes");
  if (const uint64_t n = retried_inits_.load())
    PSKV_WARN(node_->Tag() << ": key range " << range_.index() << ": " << n
                           << " retried init(s) answered from state (the keys were initialised "
                              "before their primary died)");
}

bool RangeStore::empty() const {
  for (auto& keys : keys_)
    if (!keys.empty()) return false;
  return true;
}

size_t RangeStore::ShardOf(int64_t wire_key) const {
  // Consecutive keys (and stores) on different shards.
  const uint64_t k = static_cast<uint64_t>(wire_key);
  return static_cast<size_t>(((k & 0xffffffff) + (k >> 32) * 7919) % keys_.size());
}

KeyState* RangeStore::FindKey(int64_t wire_key) {
  auto& keys = keys_[ShardOf(wire_key)];
  auto it = keys.find(wire_key);
  return it == keys.end() ? nullptr : &it->second;
}

KeyState& RangeStore::AddKey(int64_t wire_key, NDArray value) {
  KeyState st;
  st.wire_key = wire_key;
  st.value = std::move(value);
  auto& keys = keys_[ShardOf(wire_key)];
  auto at = keys.emplace(wire_key, std::move(st)).first;
  auto after = std::next(at);
  at->second.next = after == keys.end() ? nullptr : &after->second;
  if (at != keys.begin()) std::prev(at)->second.next = &at->second;
  return at->second;
}

void RangeStore::ForEachKey(const std::function<void(int64_t, KeyState&)>& fn) {
  std::map<int64_t, KeyState*> all;
  for (auto& keys : keys_)
    for (auto& [k, st] : keys) all.emplace(k, &st);
  for (auto& [k, st] : all) fn(k, *st);
}

void RangeStore::Detach(KeyState& st) {
  if (st.token.use_count() > 1) {
    st.value = st.value.Clone();
    st.token = std::make_shared<int>(0);
  }
}

std::pair<int64_t, bool> RangeStore::StatesKeyWeight(int store, int64_t key) {
  const int64_t k = key & 0xffffffff;
  const uint64_t chunk = static_cast<uint64_t>(key) >> 32;
  if (key < 0 || k > INT32_MAX || chunk >= dist::MaxChunks(node_->num_servers()))
    return {-1, false};
  const int64_t wk = dist::ChunkKey(dist::WireKey(store, static_cast<int>(k)), chunk);
  const KeyState* st = FindKey(wk);
  if (!st) return sparse_.WeightInfo(wk);  // a row_sparse key, or none
  return {st->value.size(), IsLowPrecision(st->value.dtype())};
}

void RangeStore::ApplyInit(const KVRequest& req, const std::vector<Item>& items) {
  const DType dtype = static_cast<DType>(dist::CmdDType(req.cmd));
  const InitOrigin origin =
      replicated_ ? InitOriginOf(req, items.size(), node_->num_workers()) : InitOrigin{};
  uint64_t retried = 0;
  for (size_t i = 0; i < items.size(); ++i) {  // validated: new keys, or retried inits
    const Item& it = items[i];
    if (it.st) {  // held already: answered (and forwarded) as it is, not applied again
      ++retried;
      continue;
    }
    KeyState& st =
        AddKey(it.key, NDArray({static_cast<int64_t>(it.len / DTypeSize(dtype))}, dtype));
    req.msg.CopyVals(it.off, it.len, static_cast<char*>(st.value.raw()));
    if (!origin.counts.empty()) st.applied_push[origin.worker] = origin.counts[i];
  }
  if (retried && IsWorkerId(req.sender))
    retried_inits_.fetch_add(retried, std::memory_order_relaxed);
  if (events_ && events_->OnInitApplied(req)) return;
  answers_->Values(req, {});
}

// A pull, or an async push (applied at once). A push the key already holds (a retry
// after a failover) is answered from the value, not applied again. With a listener,
// the pushes applied are its event (a replicated range's primary copies them to the
// replicas and answers once they acknowledged them).
void RangeStore::ApplyAsync(const KVRequest& req, const std::vector<Item>& items) {
  const Message& m = req.msg;
  const bool compressed = dist::CmdKind(req.cmd) == Kind::kCompressed;
  const std::vector<uint64_t> counts =
      req.push ? PushCounts(req, items.size()) : std::vector<uint64_t>{};
  AsyncApplied ev{req,
                  compressed ? DType::kFloat32 : static_cast<DType>(dist::CmdDType(req.cmd)),
                  {},
                  {},
                  std::nullopt};
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    KeyState& st = *it.st;
    if (req.push && !AlreadyApplied(st.applied_push, req.sender, counts, i)) {
      Detach(st);
      NDArray grad;
      std::string scratch;
      const char* data = m.Contiguous(it.off, it.len, &scratch);
      if (compressed) {
        grad = NDArray({st.value.size()}, DType::kFloat32);
        config_.compressor->Dequantize(reinterpret_cast<const uint8_t*>(data), grad.data<float>(),
                                       st.value.size());
      } else {
        grad = ValueView(data, it.len, st.value.dtype());
      }
      int64_t schedule_at = 0;  // the update count the rate came from (for the replicas)
      try {
        obs::StepScope obs_step("update", dist::KeyOf(it.key), it.len);  // [observe]
        config_.OptimizerOf(it.key)->Update(dist::OptimizerKey(it.key), grad, &st.value,
                                            &schedule_at);
      } catch (const std::exception& e) {
        // Sizes were validated; an optimizer failure here is a broken state (e.g.
        // states loaded for another model) and is reported as such.
        ev.failure = Failure{KindOf(e), std::string("update failed: ") + e.what()};
        break;
      }
      const int64_t seq = st.round.round();
      st.round.Advance();
      const uint64_t count = counts.empty() ? 0 : counts[i];
      if (count) st.applied_push[req.sender] = count;
      if (events_)
        ev.pushes.push_back(
            {it.key, seq, schedule_at, count, std::move(grad), it.off, it.len, compressed});
    }
    if (req.pull) ev.answer.emplace_back(it.key, ReplyOwner{st.value, st.token});
  }
  if (!ev.pushes.empty() && events_->OnAsyncApplied(ev)) return;
  if (ev.failure) return answers_->Error(req, *ev.failure);
  answers_->Values(req, std::move(ev.answer));
}

// A worker finished: no more pushes from it. Open rounds that need its push fail.
void RangeStore::WorkerDone(int id) {
  auto name = [this](int w) { return node_->NodeName(w); };
  ForEachKey([&](int64_t key, KeyState& st) {
    if (st.round.NeedsPushFrom(id))
      FailRound(st.round.Take(),
                {ErrorKind::kUsage,
                 FinishedWithoutPushing("key " + std::to_string(key), name(id), st.round.round())});
  });
}

void RangeStore::FailRound(std::vector<Round::Entry> pushes, const Failure& failure) {
  for (auto& x : pushes) Finish(x.push, nullptr, &failure);
}

void RangeStore::FinishWithValue(const Waiter& w, KeyState& st) {
  if (!w.r->req.pull) {  // nothing to answer with: no reference to take
    ReplyOwner none;
    return Finish(w, &none, nullptr);
  }
  ReplyOwner value{st.value, st.token};
  Finish(w, &value, nullptr);
}

void RangeStore::Finish(const Waiter& w, ReplyOwner* value, const Failure* failure) {
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
      answers_->Error(r.req, *r.failure);
    else
      answers_->Values(r.req, std::move(r.done));
  } catch (const std::exception& e) {
    PSKV_WARN(node_->Tag() << ": " << e.what());
  }
  r.done.clear();  // releases the values' tokens (what the answer did not take)
}

}  // namespace pskv
