// DistServer: dispatch, data requests (validate, then apply) and replies.
#include "kvstore/distributed/server/dist_server.h"

#include <cstring>
#include <thread>

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"
#include "pskv/error.h"

namespace pskv {

using dist::Kind;

NDArray ValueView(const char* data, uint64_t bytes, DType t) {
  const int64_t n = static_cast<int64_t>(bytes / DTypeSize(t));
  if (reinterpret_cast<uintptr_t>(data) % DTypeSize(t) == 0)
    return NDArray::Wrap(const_cast<char*>(data), {n}, t);
  NDArray a({n}, t);
  std::memcpy(a.raw(), data, bytes);
  return a;
}

namespace {
bool IsSparse(Kind k) {
  return k == Kind::kSparseInit || k == Kind::kSparsePush || k == Kind::kSparsePull ||
         k == Kind::kReplicateSparse;
}

// The request path: `process`, or, when a test asks for late replies
// (FailPoints::ReplyDelay, ps/fail_points.h), `process` after that long a sleep.
// Chosen once, so that no request of a production server looks at the fail point.
std::function<void(KVRequest&&)> WithReplyDelay(std::chrono::milliseconds delay,
                                                std::function<void(KVRequest&&)> process) {
  if (delay.count() <= 0) return process;
  return [delay, process = std::move(process)](KVRequest&& r) {
    std::this_thread::sleep_for(delay);
    process(std::move(r));
  };
}
}  // namespace

DistServer::DistServer(Node* node) : DistServer(node, nullptr, -1, nullptr) {}

DistServer::DistServer(Node* node, KVServer* server, int range, Replicator* replicator)
    : node_(node),
      own_server_(server ? nullptr
                         : std::make_unique<KVServer>(
                               node, [this](KVRequest&& r, KVServer*) { Handle(std::move(r)); },
                               [this](int sender, int head, const std::string& body) {
                                 return Command(sender, head, body);
                               })),
      server_(server ? server : own_server_.get()),
      range_(range),
      replicator_(replicator),
      reducer_(node->options().bigarray_bound, node->options().reduction_threads),
      serial_(INT64_MAX, 1),
      process_(WithReplyDelay(node->fail_points().ReplyDelay(),
                              [this](KVRequest&& r) { Process(std::move(r)); })),
      keys_(static_cast<size_t>(ShardPoolSize(node->options().server_threads))),
      pool_(static_cast<int>(keys_.size()), {}, [this](size_t, KVRequest&& r) {
        try {
          process_(std::move(r));
        } catch (const std::exception& e) {
          PSKV_ERROR(node_->Tag() << ": request handler threw: " << e.what());
        }
      }) {
  if (node_->options().stall_warning.count() > 0)
    inspector_ = std::thread([this] { InspectLoop(); });
}

DistServer::~DistServer() {
  if (const uint64_t n = answered_for_primary_.load())
    PSKV_WARN(node_->Tag() << ": key range " << RangeIndex() << ": answered " << n
                           << " push-pull(s) of workers on this host for the range's primary");
  if (const uint64_t n = answered_from_state_.load())
    PSKV_WARN(node_->Tag() << ": key range " << RangeIndex() << ": answered " << n
                           << " retried push(es) from the state without applying them again "
                              "(their rounds were replicated before their primary died)");
  if (const uint64_t n = retried_inits_.load())
    PSKV_WARN(node_->Tag() << ": key range " << RangeIndex() << ": " << n
                           << " retried init(s) answered from state (the keys were initialised "
                              "before their primary died)");
  {
    std::lock_guard<std::mutex> lk(inspect_mu_);
    stop_ = true;
  }
  inspect_cv_.notify_all();
  if (inspector_.joinable()) inspector_.join();
  node_->fail_points().Quiesce();  // a round a test held back (HoldReplicatedRound)
  pool_.Stop();                    // requests still queued are dropped: the job is ending
}

size_t DistServer::ShardOf(int64_t wire_key) const {
  // Consecutive keys (and stores) on different shards.
  const uint64_t k = static_cast<uint64_t>(wire_key);
  return static_cast<size_t>(((k & 0xffffffff) + (k >> 32) * 7919) % keys_.size());
}

DistServer::KeyState* DistServer::FindKey(int64_t wire_key) {
  auto& keys = keys_[ShardOf(wire_key)];
  auto it = keys.find(wire_key);
  return it == keys.end() ? nullptr : &it->second;
}

void DistServer::ForEachKey(const std::function<void(int64_t, KeyState&)>& fn) {
  std::map<int64_t, KeyState*> all;
  for (auto& keys : keys_)
    for (auto& [k, st] : keys) all.emplace(k, &st);
  for (auto& [k, st] : all) fn(k, *st);
}

std::string DistServer::WorkerName(int id) const {
  return node_->NodeName(id);
}

void DistServer::LeftBarrier(int id) {
  std::lock_guard<std::mutex> blk(barrier_mu_);
  in_barrier_.erase(id);
}

void DistServer::Detach(KeyState& st) {
  if (st.token.use_count() > 1) {
    st.value = st.value.Clone();
    st.token = std::make_shared<int>(0);
  }
}

std::pair<int64_t, bool> DistServer::StatesKeyWeight(int store, int64_t key) {
  const int64_t k = key & 0xffffffff;
  const uint64_t chunk = static_cast<uint64_t>(key) >> 32;
  if (key < 0 || k > INT32_MAX || chunk >= dist::MaxChunks(node_->num_servers()))
    return {-1, false};
  const int64_t wk = dist::ChunkKey(dist::WireKey(store, static_cast<int>(k)), chunk);
  const KeyState* st = FindKey(wk);
  if (!st) return sparse_.WeightInfo(wk);  // a row_sparse key, or none
  return {st->value.size(), IsLowPrecision(st->value.dtype())};
}

Optimizer* DistServer::OptimizerOf(int64_t wire_key) const {
  auto it = optimizers_.find(dist::StoreOf(wire_key));
  return it == optimizers_.end() ? nullptr : it->second.get();
}

void DistServer::Handle(KVRequest&& req) {
  // A spare's copy of the range being installed (range_install.cc).
  if (replicator_ && (copy_in_ || dist::CmdKind(req.cmd) == Kind::kRangeCopy) && TakenByCopy(req))
    return;
  const Message& m = req.msg;
  if (pool_.size() > 1 && dist::CmdKind(req.cmd) != Kind::kStates && m.num_keys() > 0) {
    // The shard of every key (an out-of-range key fails validation in Process).
    const KeyRange range = Range();
    size_t shard = ShardOf(range.DispatchKey(m.key_ptr()[0]));
    bool one = true;
    for (uint32_t i = 1; i < m.num_keys() && one; ++i)
      one = ShardOf(range.DispatchKey(m.key_ptr()[i])) == shard;
    if (one) {
      const uint64_t bytes = m.h.vals_len;
      return pool_.Submit(shard, std::move(req), bytes);
    }
  }
  if (pool_.size() == 1) return pool_.Submit(0, std::move(req), 0);
  pool_.Exclusive([&] { process_(std::move(req)); });
}

void DistServer::Process(KVRequest&& req) {
  const Kind kind = dist::CmdKind(req.cmd);
  if (kind == Kind::kStates) return HandleStates(std::move(req));  // exclusive (Handle)
  if (kind == Kind::kReplicate) return ApplyReplica(req);          // one key: on its shard
  if (kind == Kind::kReplicateAsync) return ApplyAsyncReplica(req);
  if (IsSparse(kind)) {
    if (replicator_ && !sync_ && kind == Kind::kSparsePush)  // only sync rounds are copied
      return server_->RespondError(req, ErrorKind::kUsage,
                                   NotReplicated("row_sparse pushes in dist_async"));
    return HandleSparse(std::move(req));  // one key: on its shard
  }
  if (replicator_ && sync_ && req.push && req.pull && RetryOfWaitingPush(req)) return;
  std::vector<Item> items;
  if (auto bad = Validate(req, &items)) return server_->RespondError(req, bad->kind, bad->message);
  if (kind == Kind::kInit) return ApplyInit(req, items);
  if (req.push && sync_) return JoinRounds(std::move(req), items);
  ApplyAsync(req, items);
}

void DistServer::ApplyInit(const KVRequest& req, const std::vector<Item>& items) {
  const DType dtype = static_cast<DType>(dist::CmdDType(req.cmd));
  const InitOrigin origin = replicator_ ? InitOriginOf(req, items.size()) : InitOrigin{};
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
  if (auto to = ReplicaTargets(req); !to.empty()) return ForwardInit(req, to);
  Reply(req, {});
}

// A pull, or an async push (applied at once). Replicated: the pushes applied are
// copied to the range's replicas (replica_async.cc) and the request is answered once
// they acknowledged them; a push the key already holds (a retry after a failover)
// is answered from the value, not applied again.
void DistServer::ApplyAsync(const KVRequest& req, const std::vector<Item>& items) {
  const Message& m = req.msg;
  const bool compressed = dist::CmdKind(req.cmd) == Kind::kCompressed;
  const std::vector<uint64_t> counts =
      req.push ? PushCounts(req, items.size()) : std::vector<uint64_t>{};
  const std::vector<int> to = req.push ? ReplicaTargets(req) : std::vector<int>{};
  AsyncCopy copy;
  if (!to.empty()) {
    copy.dtype = compressed ? DType::kFloat32 : static_cast<DType>(dist::CmdDType(req.cmd));
    copy.pushes.version = replicator_->version();
    copy.pushes.worker = req.sender;
  }
  std::vector<std::pair<int64_t, ReplyOwner>> answer;
  std::optional<Failure> failure;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    KeyState& st = *it.st;
    if (req.push && !AlreadyApplied(st, req.sender, counts, i)) {
      Detach(st);
      NDArray grad;
      std::string scratch;
      const char* data = m.Contiguous(it.off, it.len, &scratch);
      if (compressed) {
        grad = NDArray({st.value.size()}, DType::kFloat32);
        compressor_->Dequantize(reinterpret_cast<const uint8_t*>(data), grad.data<float>(),
                                st.value.size());
      } else {
        grad = ValueView(data, it.len, st.value.dtype());
      }
      int64_t schedule_at = 0;  // the update count the rate came from (for the replicas)
      try {
        obs::StepScope obs_step("update", dist::KeyOf(it.key), it.len);  // [observe]
        OptimizerOf(it.key)->Update(dist::OptimizerKey(it.key), grad, &st.value, &schedule_at);
      } catch (const std::exception& e) {
        // Sizes were validated; an optimizer failure here is a broken state (e.g.
        // states loaded for another model) and is reported as such.
        failure = Failure{KindOf(e), std::string("update failed: ") + e.what()};
        break;
      }
      const int64_t seq = st.round.round();
      st.round.Advance();
      if (!counts.empty()) st.applied_push[req.sender] = counts[i];
      if (!to.empty()) {
        copy.keys.push_back(dist::PsKey(it.key, RangeIndex(), node_->num_servers()));
        copy.lens.push_back(grad.nbytes());
        copy.pushes.keys.push_back({seq, schedule_at, counts.empty() ? 0 : counts[i]});
        if (compressed) {
          copy.pieces.push_back({static_cast<const char*>(grad.raw()), grad.nbytes()});
          copy.owned.push_back(std::move(grad));
        } else {  // the request's own bytes (ReplicateAsync keeps its buffers)
          m.ForEachPiece(it.off, it.len, [&](const char* p, uint64_t bytes, uint64_t) {
            copy.pieces.push_back({p, bytes});
          });
        }
      }
    }
    if (req.pull) answer.emplace_back(it.key, ReplyOwner{st.value, st.token});
  }
  if (!copy.keys.empty())
    return ReplicateAsync(req, to, std::move(copy), std::move(answer), std::move(failure));
  if (failure) return server_->RespondError(req, failure->kind, failure->message);
  ReplyValues(req, std::move(answer));
}

// A row_sparse request: one key (this server's rows of it), handled by sparse_.
void DistServer::HandleSparse(KVRequest&& req) {
  const Message& m = req.msg;
  int64_t key = 0;
  if (!IsValidDType(dist::CmdDType(req.cmd)) || m.num_keys() != 1 ||
      !Range().WireKeyOf(m.key_ptr()[0], &key) || dist::ChunkOf(key) != 0)
    return server_->RespondError(req, ErrorKind::kInvalid, "malformed row_sparse request");
  if (FindKey(key))  // on the key's shard (a one-key request) or exclusively
    return server_->RespondError(
        req, ErrorKind::kUsage,
        "key " + std::to_string(dist::KeyOf(key)) +
            " is dense (storage type default): a row_sparse request for it mixes storage "
            "types, which MXNet's rule forbids");
  if (dist::CmdKind(req.cmd) == Kind::kReplicateSparse) {
    std::string why = IsServerId(req.sender) ? NotFromPrimary(req) : "not from a server";
    if (!why.empty())
      return server_->RespondError(req, ErrorKind::kInvalid, "row_sparse replication: " + why);
    return sparse_.ApplyCopy(
        key, std::move(req), server_, OptimizerOf(key), [this](int id) { return IsJobWorker(id); },
        node_->options().replicas >= 2);
  }
  SparseServer::Context ctx;
  const Kind kind = dist::CmdKind(req.cmd);
  std::vector<int> to;
  if (kind == Kind::kSparseInit || kind == Kind::kSparsePush) to = ReplicaTargets(req);
  if (!to.empty()) {
    ctx.replicate = [this, to](Message copy, Replicator::Done done) {
      replicator_->Send(to, std::move(copy), std::move(done));
    };
    ctx.table_version = replicator_->version();
    ctx.answer_init = [this, to](const KVRequest& init) { ForwardInit(init, to); };
  }
  if (kind == Kind::kSparseInit && replicator_) {
    const InitOrigin origin = InitOriginOf(req, 1);
    ctx.init_worker = origin.worker;
    ctx.init_count = origin.counts.empty() ? 0 : origin.counts[0];
  }
  ctx.sync = sync_;
  ctx.optimizer = OptimizerOf(key);
  ctx.num_workers = node_->num_workers();
  ctx.done_workers = &done_workers_;
  ctx.worker_name = [this](int id) { return WorkerName(id); };
  if (req.push && sync_) LeftBarrier(req.sender);
  sparse_.Handle(key, std::move(req), server_, ctx);
}

void DistServer::Reply(const KVRequest& req,
                       const std::vector<std::pair<int64_t, KeyState*>>& keys) {
  std::vector<std::pair<int64_t, ReplyOwner>> values;
  for (auto& [k, st] : keys) values.emplace_back(k, ReplyOwner{st->value, st->token});
  ReplyValues(req, std::move(values));
}

void DistServer::ReplyValues(const KVRequest& req,
                             std::vector<std::pair<int64_t, ReplyOwner>> keys) {
  // [observe] the reply step (timeline, counters; bytes sent to the worker)
  uint64_t obs_bytes = 0;
  if (obs::Enabled() && req.pull)
    for (auto& k : keys) obs_bytes += k.second.value.nbytes();
  // (per-peer bytes are counted by the KV layer, for every request)
  obs::StepScope obs_step("reply", keys.size() == 1 ? dist::KeyOf(keys[0].first) : -1, obs_bytes);
  if (!req.pull || keys.empty()) {
    server_->Respond(req);
    return;
  }
  std::vector<uint64_t> ks(keys.size()), lens(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ks[i] = dist::PsKey(keys[i].first, RangeIndex(), node_->num_servers());
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
  server_->Respond(req, ks, std::move(f), lens);
}

}  // namespace pskv
