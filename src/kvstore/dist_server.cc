#include "kvstore/dist_server.h"

#include <algorithm>
#include <cstring>

#include "common/byte_io.h"
#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "protocol/payload.h"
#include "pskv/error.h"

namespace pskv {

using dist::Kind;

namespace {
// Keeps a value's memory (and the key's reply token) alive while a reply is sent.
struct ReplyOwner {
  NDArray value;
  std::shared_ptr<int> token;
};

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
      reducer_(node->options().bigarray_bound, node->options().reduction_threads) {
  if (node_->options().stall_warning.count() > 0)
    inspector_ = std::thread([this] { InspectLoop(); });
}

DistServer::~DistServer() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  inspect_cv_.notify_all();
  if (inspector_.joinable()) inspector_.join();
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
  // [observe] the reply step (timeline, counters; bytes sent to the worker)
  uint64_t obs_bytes = 0;
  if (obs::Enabled() && req.pull)
    for (auto& k : keys) obs_bytes += k.second->value.nbytes();
  // (per-peer bytes are counted by the KV layer, for every request)
  obs::StepScope obs_step("reply", keys.size() == 1 ? dist::KeyOf(keys[0].first) : -1, obs_bytes);
  if (!req.pull || keys.empty()) {
    srv->Respond(req);
    return;
  }
  std::vector<uint64_t> ks, lens;
  if (keys.size() == 1) {  // zero copy: the reply points at the value
    KeyState* st = keys[0].second;
    auto owner = std::make_shared<ReplyOwner>(ReplyOwner{st->value, st->token});
    Frame f;
    f.data = static_cast<const char*>(st->value.raw());
    f.size = st->value.nbytes();
    f.owner = owner;
    srv->Respond(req, {dist::PsKey(keys[0].first, node_->rank(), node_->num_servers())},
                 std::move(f), {st->value.nbytes()});
    return;
  }
  std::string out;
  for (auto& [k, st] : keys) {
    ks.push_back(dist::PsKey(k, node_->rank(), node_->num_servers()));
    lens.push_back(st->value.nbytes());
    out.append(static_cast<const char*>(st->value.raw()), st->value.nbytes());
  }
  srv->Respond(req, ks, Frame::FromString(std::move(out)), lens);
}

void DistServer::FailRound(KeyState& st, ErrorKind kind, const std::string& why) {
  for (auto& r : st.waiting) {
    try {
      server_.RespondError(r, kind, why);
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": " << e.what());
    }
  }
  st.waiting.clear();
  st.pushed.clear();
  st.merged = 0;
}

std::string DistServer::MissingWorkers(const KeyState& st) const {
  std::string out;
  for (int id : node_->WorkerIds())
    if (!st.pushed.count(id)) out += (out.empty() ? "" : ", ") + WorkerName(id);
  return out;
}

// Adds one request's value bytes for `st` into st.merge (`first`: overwrite instead).
void DistServer::Merge(KeyState& st, const KVRequest& req, bool first) {
  const Message& m = req.msg;
  const uint64_t off = 0, len = m.h.vals_len;  // sync pushes carry one key
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
  // Chunk by chunk, straight from the receive buffers.
  m.ForEachPiece(off, len, [&](const char* p, uint64_t bytes, uint64_t at) {
    NDArray in = View(p, bytes, st.value.dtype());
    NDArray part = st.merge.Slice1D(static_cast<int64_t>(at / es), in.size());
    if (first) {
      part.CopyFrom(in);
    } else if (mdt == in.dtype()) {
      reducer_.AddTo(in, &part);
    } else {
      reducer_.AddTo(in.AsType(mdt), &part);
    }
  });
}

void DistServer::ApplyRound(int64_t key, KeyState& st) {
  Detach(st);
  if (Optimizer* opt = OptimizerOf(key)) {
    opt->Update(dist::KeyOf(key), st.merge, &st.value);
  } else {
    st.value.CopyFrom(st.merge);  // no optimizer: the sum becomes the value
  }
  ++st.rounds;
}

void DistServer::Handle(KVRequest&& req, KVServer* srv) {
  if (int d = node_->options().test_reply_delay_ms)
    std::this_thread::sleep_for(std::chrono::milliseconds(d));
  std::lock_guard<std::mutex> lk(mu_);
  const Message& m = req.msg;
  const int me = node_->rank(), S = node_->num_servers();
  const uint64_t base = KVWorker::ServerRange(me, S).first;
  const Kind kind = dist::CmdKind(req.cmd);
  const int dt = dist::CmdDType(req.cmd);
  auto fail = [&](ErrorKind k, const std::string& msg) { srv->RespondError(req, k, msg); };
  if (kind == Kind::kStates) return HandleStates(std::move(req), srv);
  if (kind == Kind::kSparseInit || kind == Kind::kSparsePush || kind == Kind::kSparsePull)
    return HandleSparse(std::move(req), srv);
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
  uint64_t off = 0;
  for (uint32_t i = 0; i < m.num_keys(); ++i) {
    const uint64_t ps_key = m.key_ptr()[i], len = m.len_ptr()[i];
    const uint64_t key_off = off;
    off += len;
    const uint64_t local = ps_key - base;  // a wire key: store id and key
    if (ps_key < base || (local & 0xffffffff) > static_cast<uint64_t>(INT32_MAX) ||
        (local >> 32) >= static_cast<uint64_t>(dist::kMaxStores))
      return fail(ErrorKind::kInvalid,
                  "key " + std::to_string(ps_key) + " does not belong to " + me_name);
    const int64_t key = static_cast<int64_t>(local);
    if (sparse_.Holds(key))
      return fail(ErrorKind::kUsage, "key " + std::to_string(dist::KeyOf(key)) +
                                         " is row_sparse: it is pushed as row_sparse and read "
                                         "with row_sparse_pull, never as a dense array");
    auto it = store_.find(key);
    if (kind == Kind::kInit) {
      if (it != store_.end())
        return fail(ErrorKind::kKey, "duplicate init of key " + std::to_string(key));
      if (len % DTypeSize(dtype))
        return fail(ErrorKind::kShape, "init value size is not a whole number of elements");
      items.push_back({key, key_off, len, nullptr});
      continue;
    }
    if (it == store_.end())
      return fail(ErrorKind::kKey, "key " + std::to_string(key) + " has not been inited on " +
                                       me_name + " (call Init before push or pull)");
    KeyState& st = it->second;
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
                                           " bytes on " + me_name + ", got " + std::to_string(len));
      if (sync_) {
        if (m.num_keys() != 1) return fail(ErrorKind::kInvalid, "a sync push must carry one key");
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
      store_.emplace(it.key, std::move(st));
    }
    return Reply(srv, req, {});
  }
  std::vector<std::pair<int64_t, KeyState*>> answer;
  if (req.push && sync_) {
    const int64_t key = items[0].key;
    KeyState& st = *items[0].st;
    if (st.pushed.empty()) {
      st.opened = Clock::now();
      st.next_report = node_->options().stall_warning;
    }
    st.pushed.insert(req.sender);
    // A push from a worker means it left any barrier it was in.
    in_barrier_.erase(req.sender);
    st.waiting.push_back(std::move(req));
    std::vector<KVRequest> waiting;
    try {
      obs::StepScope obs_merge("merge", dist::KeyOf(key), items[0].len);  // [observe]
      if (node_->options().sum_in_arrival_order) {
        Merge(st, st.waiting.back(), st.pushed.size() == 1);
      } else {
        // Rank order, as early as possible: add every push whose lower ranks are all
        // in (so pushes arriving in rank order are added on arrival, as before).
        for (bool found = true; found && st.merged < node_->num_workers();) {
          found = false;
          for (auto& r : st.waiting)
            if (RankOfId(r.sender) == st.merged) {
              Merge(st, r, st.merged == 0);
              ++st.merged;
              found = true;
              break;
            }
        }
      }
      if (static_cast<int>(st.pushed.size()) < node_->num_workers())
        return;  // answered when the round completes
      waiting = std::move(st.waiting);
      st.waiting.clear();
      st.pushed.clear();
      st.merged = 0;
      obs::StepScope obs_step("update", dist::KeyOf(key), st.value.nbytes());  // [observe]
      ApplyRound(key, st);
    } catch (const std::exception& e) {
      if (!waiting.empty()) st.waiting = std::move(waiting);
      FailRound(st, KindOf(e), std::string("update failed: ") + e.what());
      return;
    }
    for (auto& r : waiting) Reply(srv, r, {{key, &st}});
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
        OptimizerOf(it.key)->Update(dist::KeyOf(it.key), grad, &st.value);
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
  if (store_.count(key))
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
  if (req.push && sync_) in_barrier_.erase(req.sender);  // it left any barrier it was in
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
      auto it = key >= 0 && key <= INT32_MAX
                    ? store_.find(dist::WireKey(store, static_cast<int>(key)))
                    : store_.end();
      if (it == store_.end()) return {-1, false};
      return {it->second.value.size(), IsLowPrecision(it->second.value.dtype())};
    });
  } catch (const std::exception& e) {
    return fail(KindOf(e), node_->Tag() + ": cannot load the optimizer states: " + e.what());
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
  std::lock_guard<std::mutex> lk(mu_);
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
      if (!store_.empty())
        throw UsageError("SetGradientCompression must be called before the first Init");
      compressor_ = c.active() ? std::make_unique<GradientCompressor>(c) : nullptr;
      return {};
    }
    case dist::kWorkerDone:
      done_workers_.insert(sender);
      in_barrier_.erase(sender);
      sparse_.WorkerDone(sender, &server_, [this](int id) { return WorkerName(id); });
      for (auto& [key, st] : store_)
        if (!st.waiting.empty() && !st.pushed.count(sender))
          FailRound(st, ErrorKind::kUsage,
                    "key " + std::to_string(key) + ": " + WorkerName(sender) +
                        " finished the job without pushing round " + std::to_string(st.rounds + 1) +
                        " while other workers did; in sync mode every worker must push every key "
                        "equally often (give every worker the same number of batches)");
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
    case dist::kBarrierState:
      if (payload::DecodeBarrierState(body))
        in_barrier_[sender] = Clock::now();
      else
        in_barrier_.erase(sender);
      return {};
    case dist::kRoundStatus: {
      // Lines describing open rounds; for a round the asking worker has pushed (it
      // waits for it) and that waits for a worker in Barrier(), a line
      // deadlock entry (key, message).
      payload::RoundStatus out;
      int n = 0;
      const auto now = Clock::now();
      for (auto& [key, st] : store_) {
        if (st.waiting.empty()) continue;
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
        if (++n > 16) continue;  // a report, not a dump
        out.lines.push_back(
            round + " on " + node_->Tag() + ": waiting for " + MissingWorkers(st) + " for " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::seconds>(now - st.opened).count()) +
            " s");
      }
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
  std::unique_lock<std::mutex> lk(mu_);
  while (!inspect_cv_.wait_for(lk, tick, [&] { return stop_; })) {
    try {
      Inspect(Clock::now());
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": stall inspector: " << e.what());
    }
  }
}

// Under mu_. Logs stalled rounds, with back-off, naming the workers they wait for (and
// whether those are in Barrier(); the waiting workers detect that deadlock themselves,
// see kRoundStatus, since only they know that they are blocked).
void DistServer::Inspect(Clock::time_point now) {
  using namespace std::chrono;
  for (auto& [key, st] : store_) {
    if (st.waiting.empty()) continue;
    const auto open = duration_cast<milliseconds>(now - st.opened);
    if (open < st.next_report) continue;
    std::string barrier;
    for (auto& [w, since] : in_barrier_)
      if (!st.pushed.count(w))
        barrier += "; " + WorkerName(w) + " is in Barrier() for " +
                   std::to_string(duration_cast<seconds>(now - since).count()) + " s";
    PSKV_WARN(node_->Tag() << ": key " << key << " round " << st.rounds + 1 << ": waiting for "
                           << MissingWorkers(st) << " for " << duration_cast<seconds>(open).count()
                           << " s" << barrier);
    st.next_report = st.next_report * 2;  // back-off
  }
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
