#include "kvstore/dist_server.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/byte_io.h"
#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "protocol/payload.h"
#include "pskv/error.h"

namespace pskv {

using dist::Kind;

namespace {
// A shard's queue bound (see dist_server.h).
constexpr size_t kMaxQueued = 256;
constexpr uint64_t kMaxQueuedBytes = uint64_t{256} << 20;

// `data` as an NDArray, copied only if it is not aligned for its dtype.
NDArray View(const char* data, uint64_t bytes, DType t) {
  const int64_t n = static_cast<int64_t>(bytes / DTypeSize(t));
  if (reinterpret_cast<uintptr_t>(data) % DTypeSize(t) == 0)
    return NDArray::Wrap(const_cast<char*>(data), {n}, t);
  NDArray a({n}, t);
  std::memcpy(a.raw(), data, bytes);
  return a;
}
}  // namespace

DistServer::DistServer(Node* node)
    : node_(node),
      server_(
          node, [this](KVRequest&& r, KVServer* s) { Handle(std::move(r), s); },
          [this](int sender, int head, const std::string& body) {
            return Command(sender, head, body);
          }),
      reducer_(node->options().bigarray_bound, node->options().reduction_threads),
      serial_(INT64_MAX, 1) {
  StartShards();
  if (node_->options().stall_warning.count() > 0)
    inspector_ = std::thread([this] { InspectLoop(); });
}

DistServer::~DistServer() {
  {
    std::lock_guard<std::mutex> lk(inspect_mu_);
    stop_ = true;
  }
  inspect_cv_.notify_all();
  if (inspector_.joinable()) inspector_.join();
  for (auto& sh : shards_) {
    {
      std::lock_guard<std::mutex> lk(sh->mu);
      sh->stop = true;
    }
    sh->cv.notify_all();
    sh->space_cv.notify_all();
  }
  for (auto& sh : shards_)
    if (sh->thread.joinable()) sh->thread.join();
}

void DistServer::StartShards() {
  int n = node_->options().server_threads;
  if (n <= 0) n = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  for (int i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
  if (n == 1) return;  // one thread: the receive thread itself (see Handle)
  for (auto& sh : shards_) sh->thread = std::thread([this, p = sh.get()] { ShardLoop(p); });
}

void DistServer::ShardLoop(Shard* sh) {
  std::unique_lock<std::mutex> lk(sh->mu);
  for (;;) {
    sh->cv.wait(lk, [&] { return sh->stop || !sh->tasks.empty(); });
    if (sh->stop) return;  // requests still queued are dropped: the job is ending
    KVRequest req = std::move(sh->tasks.front());
    sh->tasks.pop_front();
    sh->queued_bytes -= req.msg.h.vals_len;
    sh->space_cv.notify_one();
    sh->busy = true;
    lk.unlock();
    try {
      Process(std::move(req), &server_);
    } catch (const std::exception& e) {
      PSKV_ERROR(node_->Tag() << ": request handler threw: " << e.what());
    }
    lk.lock();
    sh->busy = false;
    if (sh->tasks.empty()) sh->idle_cv.notify_all();
  }
}

size_t DistServer::ShardOf(int64_t wire_key) const {
  // Consecutive keys (and stores) on different shards.
  const uint64_t k = static_cast<uint64_t>(wire_key);
  return static_cast<size_t>(((k & 0xffffffff) + (k >> 32) * 7919) % shards_.size());
}

template <typename F>
auto DistServer::Exclusive(F&& fn) {
  std::lock_guard<std::mutex> excl(excl_mu_);
  for (auto& sh : shards_) {
    std::unique_lock<std::mutex> lk(sh->mu);
    sh->idle_cv.wait(lk, [&] { return sh->stop || (sh->tasks.empty() && !sh->busy); });
  }
  return fn();
}

DistServer::KeyState* DistServer::FindKey(int64_t wire_key) {
  auto& keys = shards_[ShardOf(wire_key)]->keys;
  auto it = keys.find(wire_key);
  return it == keys.end() ? nullptr : &it->second;
}

template <typename F>
void DistServer::ForEachKey(F&& fn) {
  std::map<int64_t, KeyState*> all;
  for (auto& sh : shards_)
    for (auto& [k, st] : sh->keys) all.emplace(k, &st);
  for (auto& [k, st] : all) fn(k, *st);
}

std::string DistServer::WorkerName(int id) const {
  return node_->NodeName(id);
}

void DistServer::Detach(KeyState& st) {
  if (st.token.use_count() > 1) {
    st.value = st.value.Clone();
    st.token = std::make_shared<int>(0);
  }
}

Optimizer* DistServer::OptimizerOf(int64_t wire_key) const {
  auto it = optimizers_.find(dist::StoreOf(wire_key));
  return it == optimizers_.end() ? nullptr : it->second.get();
}

void DistServer::Reply(KVServer* srv, const KVRequest& req,
                       const std::vector<std::pair<int64_t, KeyState*>>& keys) {
  std::vector<std::pair<int64_t, ReplyOwner>> values;
  for (auto& [k, st] : keys) values.emplace_back(k, ReplyOwner{st->value, st->token});
  ReplyValues(srv, req, std::move(values));
}

void DistServer::ReplyValues(KVServer* srv, const KVRequest& req,
                             std::vector<std::pair<int64_t, ReplyOwner>> keys) {
  // [observe] the reply step (timeline, counters; bytes sent to the worker)
  uint64_t obs_bytes = 0;
  if (obs::Enabled() && req.pull)
    for (auto& k : keys) obs_bytes += k.second.value.nbytes();
  // (per-peer bytes are counted by the KV layer, for every request)
  obs::StepScope obs_step("reply", keys.size() == 1 ? dist::KeyOf(keys[0].first) : -1, obs_bytes);
  if (!req.pull || keys.empty()) {
    srv->Respond(req);
    return;
  }
  std::vector<uint64_t> ks(keys.size()), lens(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ks[i] = dist::PsKey(keys[i].first, node_->rank(), node_->num_servers());
    lens[i] = keys[i].second.value.nbytes();
  }
  Frame f;
  if (keys.size() == 1) {  // the reply points at the value
    auto owner = std::make_shared<ReplyOwner>(std::move(keys[0].second));
    f.data = static_cast<const char*>(owner->value.raw());
    f.size = owner->value.nbytes();
    f.owner = std::move(owner);
  } else {  // several keys: the pieces of one frame point at their values
    std::vector<Frame::Piece> pieces(keys.size());
    for (size_t i = 0; i < keys.size(); ++i)
      pieces[i] = {static_cast<const char*>(keys[i].second.value.raw()), lens[i]};
    f = Frame::Gather(
        std::move(pieces),
        std::make_shared<std::vector<std::pair<int64_t, ReplyOwner>>>(std::move(keys)));
  }
  srv->Respond(req, ks, std::move(f), lens);
}

// One key of a sync request is done: `st` holds its new value, or null when its
// round failed. The last key answers the request (one reply for all its keys).
void DistServer::Finish(const Waiter& w, KeyState* st, ErrorKind kind, const std::string& why) {
  RoundReq& r = *w.r;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    if (st) {
      if (r.req.pull) r.done[w.index] = {r.keys[w.index], ReplyOwner{st->value, st->token}};
    } else if (!r.failed) {
      r.failed = true;
      r.kind = kind;
      r.why = why;
    }
    if (--r.left > 0) return;
  }
  try {
    if (r.failed)
      server_.RespondError(r.req, r.kind, r.why);
    else
      ReplyValues(&server_, r.req, std::move(r.done));
  } catch (const std::exception& e) {
    PSKV_WARN(node_->Tag() << ": " << e.what());
  }
  r.done.clear();  // releases the values' tokens (what the answer did not take)
}

void DistServer::FailRound(KeyState& st, ErrorKind kind, const std::string& why) {
  std::vector<Waiter> waiting = std::move(st.waiting);
  st.waiting.clear();
  for (auto& w : waiting) Finish(w, nullptr, kind, why);
  st.pushed.clear();
  st.merged = 0;
}

std::string DistServer::MissingWorkers(const KeyState& st) const {
  std::string out;
  for (int id : node_->WorkerIds())
    if (!st.pushed.count(id)) out += (out.empty() ? "" : ", ") + WorkerName(id);
  return out;
}

// Adds one push's value bytes for `st` into st.merge (`first`: overwrite instead).
void DistServer::Merge(KeyState& st, const Waiter& w, bool first) {
  const KVRequest& req = w.r->req;
  const Message& m = req.msg;
  const uint64_t off = w.r->offs[w.index], len = w.r->lens[w.index];
  if (dist::CmdKind(req.cmd) == Kind::kCompressed) {
    if (st.merge.empty()) st.merge = NDArray({st.value.size()}, DType::kFloat32);
    if (first) st.merge.Fill(0);
    std::string scratch;
    const char* data = m.Contiguous(off, len, &scratch);
    compressor_->DequantizeAdd(reinterpret_cast<const uint8_t*>(data), st.merge.data<float>(),
                               st.value.size());
    return;
  }
  const bool mp = OptimizerOf(st.wire_key) && OptimizerOf(st.wire_key)->config().multi_precision &&
                  IsLowPrecision(st.value.dtype());
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
    NDArray in = View(pc.p, pc.bytes, st.value.dtype());
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
    ++st.rounds;
    return;
  }
  Detach(st);
  if (opt) {
    opt->Update(dist::OptimizerKey(key), st.merge, &st.value);
  } else {
    // No optimizer: the sum becomes the value (in parallel when big).
    if (st.merge.dtype() == st.value.dtype())
      reducer_.Copy(st.merge, &st.value);
    else
      st.value.CopyFrom(st.merge);
  }
  ++st.rounds;
}

void DistServer::Handle(KVRequest&& req, KVServer* srv) {
  if (shards_.size() == 1) {
    // One thread: handle it here, like an exclusive section (no hand-off, no wake-up).
    std::lock_guard<std::mutex> excl(excl_mu_);
    return Process(std::move(req), srv);
  }
  const Message& m = req.msg;
  if (dist::CmdKind(req.cmd) != Kind::kStates && m.num_keys() > 0) {
    // The shard of every key (an out-of-range key fails validation in Process).
    const uint64_t base = KVWorker::ServerRange(node_->rank(), node_->num_servers()).first;
    size_t shard = SIZE_MAX;
    bool one = true;
    for (uint32_t i = 0; i < m.num_keys() && one; ++i) {
      const uint64_t ps_key = m.key_ptr()[i];
      const size_t s = ps_key < base ? 0 : ShardOf(static_cast<int64_t>(ps_key - base));
      one = shard == SIZE_MAX || s == shard;
      shard = s;
    }
    if (one) {
      std::lock_guard<std::mutex> excl(excl_mu_);
      Shard& sh = *shards_[shard];
      {
        // Back-pressure: wait for room (shards always progress: no handler waits).
        std::unique_lock<std::mutex> lk(sh.mu);
        sh.space_cv.wait(lk, [&] {
          return sh.stop || sh.tasks.empty() ||
                 (sh.tasks.size() < kMaxQueued && sh.queued_bytes < kMaxQueuedBytes);
        });
        sh.queued_bytes += req.msg.h.vals_len;
        sh.tasks.push_back(std::move(req));
      }
      sh.cv.notify_one();
      return;
    }
  }
  Exclusive([&] { Process(std::move(req), srv); });
}

// Adds push `w` to the open round of `key`; completes the round when every worker
// pushed. On the key's shard (or exclusively).
void DistServer::JoinRound(int64_t key, KeyState& st, Waiter w, Clock::time_point now) {
  const int sender = w.r->req.sender;
  if (st.pushed.empty()) {
    st.opened = now;
    st.next_report = node_->options().stall_warning;
  }
  st.pushed.insert(sender);
  st.waiting.push_back(std::move(w));
  std::vector<Waiter> waiting;
  try {
    obs::StepScope obs_merge("merge", dist::KeyOf(key),  // [observe]
                             st.waiting.back().r->lens[st.waiting.back().index]);
    if (node_->options().sum_in_arrival_order) {
      Merge(st, st.waiting.back(), st.pushed.size() == 1);
    } else {
      // Rank order, as early as possible: add every push whose lower ranks are all
      // in (so pushes arriving in rank order are added on arrival, as before).
      for (bool found = true; found && st.merged < node_->num_workers();) {
        found = false;
        for (auto& x : st.waiting)
          if (RankOfId(x.r->req.sender) == st.merged) {
            Merge(st, x, st.merged == 0);
            ++st.merged;
            found = true;
            break;
          }
      }
    }
    if (static_cast<int>(st.pushed.size()) < node_->num_workers())
      return;  // answered when the round completes
    waiting.swap(st.waiting);
    st.pushed.clear();
    st.merged = 0;
    obs::StepScope obs_step("update", dist::KeyOf(key), st.value.nbytes());  // [observe]
    ApplyRound(key, st);
  } catch (const std::exception& e) {
    if (!waiting.empty()) st.waiting = std::move(waiting);
    FailRound(st, KindOf(e), std::string("update failed: ") + e.what());
    return;
  }
  for (auto& x : waiting) Finish(x, &st, ErrorKind::kGeneric, {});
  waiting.clear();
  if (st.waiting.empty()) st.waiting.swap(waiting);  // its capacity serves the next round
}

void DistServer::Process(KVRequest&& req, KVServer* srv) {
  if (int d = node_->options().test_reply_delay_ms)
    std::this_thread::sleep_for(std::chrono::milliseconds(d));
  const Message& m = req.msg;
  const int me = node_->rank(), S = node_->num_servers();
  const uint64_t base = KVWorker::ServerRange(me, S).first;
  const Kind kind = dist::CmdKind(req.cmd);
  const int dt = dist::CmdDType(req.cmd);
  auto fail = [&](ErrorKind k, const std::string& msg) { srv->RespondError(req, k, msg); };
  if (kind == Kind::kStates) return HandleStates(std::move(req), srv);  // exclusive (Handle)
  if (kind == Kind::kSparseInit || kind == Kind::kSparsePush || kind == Kind::kSparsePull)
    return HandleSparse(std::move(req), srv);  // one key: on its shard (Handle)
  if (!IsValidDType(dt) ||
      (kind != Kind::kDense && kind != Kind::kInit && kind != Kind::kCompressed))
    return fail(ErrorKind::kInvalid,
                "malformed data request (cmd " + std::to_string(req.cmd) + ")");
  const DType dtype = static_cast<DType>(dt);
  const std::string me_name = node_->Tag();

  // Pass 1: validate every key; nothing is changed until the whole request is valid.
  struct Item {
    int64_t key;  // a wire key: store id and key
    uint64_t off, len;
    KeyState* st;  // null for an init
  };
  std::vector<Item> items;
  items.reserve(m.num_keys());
  // The keys of a request ascend: a shard's next key is usually the successor of the
  // one found there before (a fused message of consecutive keys): no tree search.
  std::vector<KeyState*> last(shards_.size(), nullptr);
  auto find = [&](int64_t key) -> KeyState* {
    KeyState*& prev = last[ShardOf(key)];
    KeyState* st = prev && prev->next && prev->next->wire_key == key ? prev->next : FindKey(key);
    if (st) {
      prev = st;
      if (st->next)  // the next key's state, likely needed: all its cache lines
        for (size_t b = 0; b < sizeof(KeyState); b += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(st->next) + b);
    }
    return st;
  };
  uint64_t off = 0;
  for (uint32_t i = 0; i < m.num_keys(); ++i) {
    const uint64_t ps_key = m.key_ptr()[i], len = m.len_ptr()[i];
    const uint64_t key_off = off;
    off += len;
    if (i > 0 && ps_key <= m.key_ptr()[i - 1])
      return fail(ErrorKind::kInvalid, "the keys of a request must be strictly ascending");
    const uint64_t local = ps_key - base;  // a wire key: chunk, store id and key
    if (ps_key < base || ps_key >= KVWorker::ServerRange(me, S).second ||
        (local & 0xffffffff) > static_cast<uint64_t>(INT32_MAX) ||
        dist::ChunkOf(static_cast<int64_t>(local)) >= dist::MaxChunks(S))
      return fail(ErrorKind::kInvalid,
                  "key " + std::to_string(ps_key) + " does not belong to " + me_name);
    const int64_t key = static_cast<int64_t>(local);
    if (sparse_.Holds(key))
      return fail(ErrorKind::kUsage, "key " + std::to_string(dist::KeyOf(key)) +
                                         " is row_sparse: it is pushed as row_sparse and read "
                                         "with row_sparse_pull, never as a dense array");
    KeyState* found = find(key);
    if (kind == Kind::kInit) {
      if (found) return fail(ErrorKind::kKey, "duplicate init of key " + std::to_string(key));
      if (len % DTypeSize(dtype))
        return fail(ErrorKind::kShape, "init value size is not a whole number of elements");
      items.push_back({key, key_off, len, nullptr});
      continue;
    }
    // A chunked key the workers cut differently: name the setting, not just the key.
    auto chunk_hint = [&]() -> std::string {
      const int64_t base = key & ((int64_t{1} << dist::kChunkShift) - 1);
      if (dist::ChunkOf(key) == 0 && !FindKey(dist::ChunkKey(base, 1))) return "";
      return "; key " + std::to_string(dist::KeyOf(key)) +
             " travels in wire chunks: every node of a job must use the same "
             "PSKV_WIRE_CHUNK_BYTES";
    };
    if (!found)
      return fail(ErrorKind::kKey, "key " + std::to_string(key) + " has not been inited on " +
                                       me_name + " (call Init before push or pull)" + chunk_hint());
    KeyState& st = *found;
    if (dtype != st.value.dtype())
      return fail(ErrorKind::kShape, "key " + std::to_string(key) + " holds " +
                                         DTypeName(st.value.dtype()) + " but the request carries " +
                                         DTypeName(dtype));
    if (req.push) {
      if (kind == Kind::kCompressed && !compressor_)
        return fail(ErrorKind::kUsage,
                    "a compressed push arrived but compression is not configured");
      const uint64_t want =
          kind == Kind::kCompressed
              ? static_cast<uint64_t>(compressor_->CompressedBytes(st.value.size()))
              : st.value.nbytes();
      if (len != want)
        return fail(ErrorKind::kShape, "The value size cannot be changed: key " +
                                           std::to_string(key) + " takes " + std::to_string(want) +
                                           " bytes on " + me_name + ", got " + std::to_string(len) +
                                           chunk_hint());
      if (sync_) {
        if (st.pushed.count(req.sender))
          return fail(ErrorKind::kUsage,
                      WorkerName(req.sender) + " pushed key " + std::to_string(key) +
                          " twice in one sync round (round " + std::to_string(st.rounds + 1) + ")");
        for (int d : done_workers_)
          if (!st.pushed.count(d))
            return fail(ErrorKind::kUsage,
                        "key " + std::to_string(key) + ": " + WorkerName(d) +
                            " finished the job without pushing round " +
                            std::to_string(st.rounds + 1) +
                            "; in sync mode every worker must push every key equally often (give "
                            "every worker the same number of batches)");
      } else if (!OptimizerOf(key)) {
        return fail(ErrorKind::kUsage,
                    "Updater needs to be set for async mode: call SetOptimizer "
                    "on the dist_async store before pushing");
      }
    }
    items.push_back({key, key_off, len, &st});
  }

  // Pass 2: apply.
  if (kind == Kind::kInit) {
    for (auto& it : items) {
      KeyState st;
      st.wire_key = it.key;
      st.value = NDArray({static_cast<int64_t>(it.len / DTypeSize(dtype))}, dtype);
      m.CopyVals(it.off, it.len, static_cast<char*>(st.value.raw()));
      auto& keys = shards_[ShardOf(it.key)]->keys;
      auto at = keys.emplace(it.key, std::move(st)).first;  // validated: a new key
      auto after = std::next(at);
      at->second.next = after == keys.end() ? nullptr : &after->second;
      if (at != keys.begin()) std::prev(at)->second.next = &at->second;
    }
    return Reply(srv, req, {});
  }
  std::vector<std::pair<int64_t, KeyState*>> answer;
  if (req.push && sync_) {
    // Each key joins its round; the request is answered once all of them completed
    // (one key, or several: a fused message of independent pushes).
    if (items.empty()) return fail(ErrorKind::kInvalid, "a sync push without keys");
    {  // a push from a worker means it left any barrier it was in
      std::lock_guard<std::mutex> blk(barrier_mu_);
      in_barrier_.erase(req.sender);
    }
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
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < items.size(); ++i)
      JoinRound(items[i].key, *items[i].st, Waiter{r, i}, now);
    return;
  }
  for (auto& it : items) {
    KeyState& st = *it.st;
    if (req.push) {  // async: apply at once
      Detach(st);
      NDArray grad;
      std::string scratch;
      const char* data = m.Contiguous(it.off, it.len, &scratch);
      if (kind == Kind::kCompressed) {
        grad = NDArray({st.value.size()}, DType::kFloat32);
        compressor_->Dequantize(reinterpret_cast<const uint8_t*>(data), grad.data<float>(),
                                st.value.size());
      } else {
        grad = View(data, it.len, dtype);
      }
      try {
        obs::StepScope obs_step("update", dist::KeyOf(it.key), it.len);  // [observe]
        OptimizerOf(it.key)->Update(dist::OptimizerKey(it.key), grad, &st.value);
      } catch (const std::exception& e) {
        // Sizes were validated above; an optimizer failure here is a broken state
        // (e.g. states loaded for another model) and is reported as such.
        return fail(KindOf(e), std::string("update failed: ") + e.what());
      }
      ++st.rounds;
    }
    answer.emplace_back(it.key, &st);
  }
  Reply(srv, req, answer);
}

// A row_sparse request: one key (this server's rows of it), handled by sparse_.
void DistServer::HandleSparse(KVRequest&& req, KVServer* srv) {
  const Message& m = req.msg;
  const uint64_t base = KVWorker::ServerRange(node_->rank(), node_->num_servers()).first;
  const uint64_t local = m.num_keys() == 1 ? m.key_ptr()[0] - base : 0;
  if (!IsValidDType(dist::CmdDType(req.cmd)) || m.num_keys() != 1 || m.key_ptr()[0] < base ||
      (local & 0xffffffff) > static_cast<uint64_t>(INT32_MAX) ||
      (local >> 32) >= static_cast<uint64_t>(dist::kMaxStores))
    return srv->RespondError(req, ErrorKind::kInvalid, "malformed row_sparse request");
  const int64_t key = static_cast<int64_t>(local);
  if (FindKey(key))  // on the key's shard (a one-key request) or exclusively
    return srv->RespondError(
        req, ErrorKind::kUsage,
        "key " + std::to_string(dist::KeyOf(key)) +
            " is dense (storage type default): a row_sparse request for it mixes storage "
            "types, which MXNet's rule forbids");
  SparseServer::Context ctx;
  ctx.sync = sync_;
  ctx.optimizer = OptimizerOf(key);
  ctx.num_workers = node_->num_workers();
  ctx.done_workers = done_workers_;
  ctx.worker_name = [this](int id) { return WorkerName(id); };
  ctx.rank_of = [](int id) { return RankOfId(id); };
  if (req.push && sync_) {  // it left any barrier it was in
    std::lock_guard<std::mutex> blk(barrier_mu_);
    in_barrier_.erase(req.sender);
  }
  sparse_.Handle(key, std::move(req), srv, ctx);
}

// Optimizer states as data: a pull returns the snapshot taken by kStatesSize (and
// drops it), a push loads states after checking them against the stored weights.
void DistServer::HandleStates(KVRequest&& req, KVServer* srv) {
  const Message& m = req.msg;
  auto fail = [&](ErrorKind k, const std::string& msg) { srv->RespondError(req, k, msg); };
  // The request's key is the store's key 0 (WireKey(store, 0)): it names the store.
  const uint64_t base = KVWorker::ServerRange(node_->rank(), node_->num_servers()).first;
  if (m.num_keys() != 1 || m.key_ptr()[0] < base || ((m.key_ptr()[0] - base) & 0xffffffff) != 0 ||
      ((m.key_ptr()[0] - base) >> 32) >= static_cast<uint64_t>(dist::kMaxStores))
    return fail(ErrorKind::kInvalid, "malformed optimizer-states request");
  const uint64_t ps_key = m.key_ptr()[0];
  const int store = dist::StoreOf(static_cast<int64_t>(ps_key - base));
  Optimizer* optimizer = OptimizerOf(dist::WireKey(store, 0));
  if (!optimizer)
    return fail(ErrorKind::kUsage, "no optimizer is set on the servers (call SetOptimizer first)");
  if (req.pull) {
    if (states_store_ != store)
      return fail(ErrorKind::kUsage, "optimizer states requested for another store's snapshot");
    auto snap = std::move(states_snapshot_);
    states_snapshot_.reset();
    if (!snap) return fail(ErrorKind::kUsage, "optimizer states requested without a snapshot");
    Frame f;
    f.data = snap->data();
    f.size = snap->size();
    f.owner = snap;
    return srv->Respond(req, {ps_key}, std::move(f), {snap->size()});
  }
  std::string blob(m.h.vals_len, '\0');
  m.CopyVals(0, m.h.vals_len, blob.data());
  try {
    optimizer->LoadStates(blob, [this, store](int64_t key) -> std::pair<int64_t, bool> {
      // key, or (chunk << 32) | key for a wire chunk (dist::OptimizerKey)
      const int64_t k = key & 0xffffffff;
      const uint64_t chunk = static_cast<uint64_t>(key) >> 32;
      if (key < 0 || k > INT32_MAX || chunk >= dist::MaxChunks(node_->num_servers()))
        return {-1, false};
      const int64_t wk = dist::ChunkKey(dist::WireKey(store, static_cast<int>(k)), chunk);
      const KeyState* st = FindKey(wk);
      if (!st) return sparse_.WeightInfo(wk);  // a row_sparse key, or none
      return {st->value.size(), IsLowPrecision(st->value.dtype())};
    });
  } catch (const std::exception& e) {
    return fail(KindOf(e), node_->Tag() + ": cannot load the optimizer states: " + e.what() +
                               " (states saved with another PSKV_WIRE_CHUNK_BYTES do not fit: "
                               "load them with the value they were saved with)");
  }
  srv->Respond(req);
}

std::string DistServer::ReportInit(int sender, const std::string& body) {
  payload::InitReport report = payload::DecodeInitReport(body);
  // Rank 0 could not initialise these keys.
  for (auto& f : report.failures) init_conflicts_.emplace(f.id, std::move(f.message));
  for (auto& e : report.entries) {
    const int64_t id = e.id;
    InitRecord rec{std::move(e.name), std::move(e.dtype), std::move(e.shape), sender};
    auto [it, fresh] = init_reports_.emplace(id, rec);
    if (fresh || init_conflicts_.count(id)) continue;
    const InitRecord& a = it->second;
    if (a.name != rec.name) {
      init_conflicts_[id] =
          "string keys were initialised in a different order: " + WorkerName(sender) + " gave id " +
          std::to_string(id) + " to " + rec.name + " but " + WorkerName(a.worker) + " gave it to " +
          a.name + "; every worker must init string keys in the same order";
    } else if (a.dtype != rec.dtype || a.shape != rec.shape) {
      init_conflicts_[id] = "key " + a.name + " was initialised with shape " + rec.shape + " " +
                            rec.dtype + " by " + WorkerName(sender) + " but with shape " + a.shape +
                            " " + a.dtype + " by " + WorkerName(a.worker) +
                            "; every worker must init a key with the same shape and dtype";
    }
  }
  return {};
}

std::string DistServer::Command(int sender, int head, const std::string& body) {
  return Exclusive([&] { return CommandLocked(sender, head, body); });
}

// In an exclusive section.
std::string DistServer::CommandLocked(int sender, int head, const std::string& body) {
  const int store = head >> 8;  // the worker-side store a command concerns
  head &= 0xff;
  // That store's optimizer (named as the former member, which keeps this code small).
  std::unique_ptr<Optimizer>& optimizer_ = optimizers_[store];
  switch (head) {
    case dist::kSetMode:
      sync_ = payload::DecodeMode(body);
      return {};
    case dist::kSetOptimizer:
      optimizer_ = std::make_unique<Optimizer>(payload::DecodeOptimizer(body));
      if (node_->options().verbose >= 1)
        PSKV_INFO(node_->Tag() << ": optimizer " << optimizer_->config().type);
      return {};
    case dist::kSetCompression: {
      const CompressionConfig c = payload::DecodeCompression(body);
      bool any = false;
      ForEachKey([&](int64_t, KeyState&) { any = true; });
      if (any) throw UsageError("SetGradientCompression must be called before the first Init");
      compressor_ = c.active() ? std::make_unique<GradientCompressor>(c) : nullptr;
      return {};
    }
    case dist::kWorkerDone:
      done_workers_.insert(sender);
      {
        std::lock_guard<std::mutex> blk(barrier_mu_);
        in_barrier_.erase(sender);
      }
      sparse_.WorkerDone(sender, &server_, [this](int id) { return WorkerName(id); });
      ForEachKey([&](int64_t key, KeyState& st) {
        if (!st.waiting.empty() && !st.pushed.count(sender))
          FailRound(st, ErrorKind::kUsage,
                    "key " + std::to_string(key) + ": " + WorkerName(sender) +
                        " finished the job without pushing round " + std::to_string(st.rounds + 1) +
                        " while other workers did; in sync mode every worker must push every key "
                        "equally often (give every worker the same number of batches)");
      });
      return {};
    case dist::kStatesSize:
      if (!optimizer_)
        throw UsageError("no optimizer is set on the servers (call SetOptimizer first)");
      states_snapshot_ = std::make_shared<const std::string>(optimizer_->SaveStates());
      states_store_ = store;
      return payload::EncodeStatesSize(states_snapshot_->size());
    case dist::kReportInit:
      return ReportInit(sender, body);
    case dist::kCheckInit: {
      for (int64_t id : payload::DecodeCheckInit(body)) {
        auto it = init_conflicts_.find(id);
        if (it == init_conflicts_.end()) continue;
        if (it->second.find("different order") != std::string::npos) throw KeyError(it->second);
        if (it->second.find("with shape") != std::string::npos) throw ShapeError(it->second);
        throw KeyError(it->second);
      }
      return {};
    }
    case dist::kBarrierState: {
      std::lock_guard<std::mutex> blk(barrier_mu_);
      if (payload::DecodeBarrierState(body))
        in_barrier_[sender] = Clock::now();
      else
        in_barrier_.erase(sender);
      return {};
    }
    case dist::kRoundStatus: {
      // Lines describing open rounds; for a round the asking worker has pushed (it
      // waits for it) and that waits for a worker in Barrier(), a line
      // deadlock entry (key, message).
      payload::RoundStatus out;
      int n = 0;
      const auto now = Clock::now();
      std::lock_guard<std::mutex> blk(barrier_mu_);
      ForEachKey([&](int64_t key, KeyState& st) {
        if (st.waiting.empty()) return;
        const std::string round =
            "key " + std::to_string(key) + " round " + std::to_string(st.rounds + 1);
        if (st.pushed.count(sender))
          for (auto& [w, since] : in_barrier_)
            if (!st.pushed.count(w))
              out.deadlocks.push_back(
                  {key,
                   round + " (on " + node_->Tag() + "): " + WorkerName(sender) +
                       " waits for this sync round, which needs a push from " + WorkerName(w) +
                       "; but " + WorkerName(w) + " has been in Barrier() for " +
                       std::to_string(
                           std::chrono::duration_cast<std::chrono::seconds>(now - since).count()) +
                       " s, and that barrier waits for " + WorkerName(sender) +
                       ". Push every key on every worker before a Barrier (or WaitAll on every "
                       "worker before it)"});
        if (++n > 16) return;  // a report, not a dump
        out.lines.push_back(
            round + " on " + node_->Tag() + ": waiting for " + MissingWorkers(st) + " for " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::seconds>(now - st.opened).count()) +
            " s");
      });
      return payload::EncodeRoundStatus(out);
    }
    case dist::kHasOptimizer:
      return payload::EncodeHasOptimizer(optimizer_ != nullptr);
    default:
      throw InvalidArgument("unknown command " + std::to_string(head));
  }
}

void DistServer::InspectLoop() {
  using namespace std::chrono;
  const auto tick = std::clamp<milliseconds>(node_->options().stall_warning / 4, 50ms, 1000ms);
  std::unique_lock<std::mutex> lk(inspect_mu_);
  while (!inspect_cv_.wait_for(lk, tick, [&] { return stop_; })) {
    lk.unlock();
    try {
      Exclusive([&] { Inspect(Clock::now()); });
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": stall inspector: " << e.what());
    }
    lk.lock();
  }
}

// In an exclusive section. Logs stalled rounds, with back-off, naming the workers they wait for
// (and whether those are in Barrier(); the waiting workers detect that deadlock themselves, see
// kRoundStatus, since only they know that they are blocked).
void DistServer::Inspect(Clock::time_point now) {
  using namespace std::chrono;
  std::lock_guard<std::mutex> blk(barrier_mu_);
  ForEachKey([&](int64_t key, KeyState& st) {
    if (st.waiting.empty()) return;
    const auto open = duration_cast<milliseconds>(now - st.opened);
    if (open < st.next_report) return;
    std::string barrier;
    for (auto& [w, since] : in_barrier_)
      if (!st.pushed.count(w))
        barrier += "; " + WorkerName(w) + " is in Barrier() for " +
                   std::to_string(duration_cast<seconds>(now - since).count()) + " s";
    PSKV_WARN(node_->Tag() << ": key " << key << " round " << st.rounds + 1 << ": waiting for "
                           << MissingWorkers(st) << " for " << duration_cast<seconds>(open).count()
                           << " s" << barrier);
    st.next_report = st.next_report * 2;  // back-off
  });
}

int RunServerOrScheduler(const Options& options) {
  const char* role = options.role == Role::kServer ? "server" : "scheduler";
  SetLogName(role);
  try {
    if (!options.log_levels.empty()) SetLogLevels(options.log_levels);  // [observe] PSKV_LOG_LEVEL
    obs::Configure(options, role);  // [observe] servers and the scheduler (its barriers)
    Node node(options);
    std::unique_ptr<DistServer> server;
    if (options.role == Role::kServer) server = std::make_unique<DistServer>(&node);
    node.Start();
    SetLogName(node.Tag());
    node.Finalize(std::chrono::milliseconds(0));
    return 0;
  } catch (const std::exception& e) {
    PSKV_ERROR("the job failed: " << e.what());
    return 1;
  }
}

}  // namespace pskv
