#include "kvstore/distributed/worker/store.h"
#include "pskv/store_type.h"

#include <algorithm>

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/link_pacing.h"
#include "kvstore/distributed/server_shares.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/distributed/worker/collective_init.h"
#include "kvstore/distributed/worker/device_exchange.h"
#include "kvstore/distributed/worker/fusion.h"
#include "kvstore/distributed/worker/stall.h"
#include "kvstore/distributed/worker/states_transfer.h"
#include "kvstore/kvstore_common.h"
#include "pskv/error.h"

namespace pskv::dist {

namespace {

Frame FrameOf(const NDArray& a) {
  Frame f;
  f.data = static_cast<const char*>(a.raw());
  f.size = a.nbytes();
  f.owner = std::make_shared<NDArray>(a);
  return f;
}

// Completion that copies the first output into the others.
KVWorker::Callback CopyToAll(const std::vector<NDArray>& dst, Engine::Done done) {
  return [dst, done = std::move(done)](std::exception_ptr e) {
    if (!e) {
      try {
        for (size_t i = 1; i < dst.size(); ++i) {
          NDArray o = dst[i];
          o.CopyFrom(dst[0]);
        }
      } catch (...) {
        e = std::current_exception();
      }
    }
    done(e);
  };
}

// The shares of big keys per server (server_shares.h) from the node table, which
// every worker received alike from the scheduler.
std::vector<int64_t> PlacementShares(const Options& o, const Node& node) {
  HostLayout layout;
  for (int id : node.ServerIds()) layout.server_hosts.push_back(node.HostOf(id));
  for (int id : node.WorkerIds()) layout.worker_hosts.push_back(node.HostOf(id));
  std::vector<int64_t> shares = ServerShares(o.server_weights, layout);
  if (o.verbose >= 1 && node.rank() == 0) {
    std::string s;
    for (int64_t x : shares) s += (s.empty() ? "" : ",") + std::to_string(x);
    PSKV_INFO(node.Tag() << ": big keys split over the servers "
                         << (shares.empty() ? "evenly" : "by shares " + s + " (of 1048576)")
                         << "; busiest link " << MaxLinkLoad(layout, shares)
                         << " x the key's bytes per push+pull");
  }
  return shares;
}

}  // namespace

DistWorkerStore::DistWorkerStore(std::string type, Options options,
                                 std::unique_ptr<LocalReducer> reducer)
    : KVStore(std::move(type), std::move(options)),
      async_(StoreType::Parse(type_).async),
      reducer_(std::move(reducer)),
      keys_([this](int k) { return KeyName(k); }) {
  engine_.SetWaitSpin(std::chrono::microseconds(options_.spin_us));
  lease_ = SharedNode::Join(options_, async_, type_);
  store_id_ = lease_.store_id;
  node_ = lease_.node->node();
  wire_ = WireShape::Of(options_, LinksPaced(*node_, options_), &node_->link_rates());
  link_ = std::make_unique<ServerLink>(node_, lease_.node->worker(), options_, store_id_);
  sparse_ = std::make_unique<SparseWorker>(*link_, engine_, mu_, keys_,
                                           [this](int k) { return KeyName(k); });
  devices_ =
      std::make_unique<DeviceExchange>(StoreType::Parse(type_).device, *reducer_, *link_, wire_);
  shares_ = PlacementShares(options_, *node_);
  if (store_id_ == 0) pacer_ = std::make_unique<LinkPacer>(*node_, options_);
  catching_up_ = node_->joined();
  if (node_->rank() == 0 && store_id_ == 0 && !catching_up_)
    link_->worker()->Command(kSetMode, payload::EncodeMode(!async_), options_.op_timeout);
  if (!catching_up_) node_->Barrier(kWorkerGroup, options_.op_timeout);
  // Last, so a constructor that threw leaves no engine behind in the shared node.
  lease_.node->AddEngine(&engine_);
}

DistWorkerStore::~DistWorkerStore() {
  pacer_.reset();  // its thread reads the node's connections
  if (!link_->broken()) {
    try {
      engine_.Wait(nullptr, options_.op_timeout);
    } catch (const std::exception& e) {
      PSKV_WARN("operations failed before the store was closed: " << e.what());
      link_->MarkBrokenIf(std::current_exception());
    }
  }
  if (node_->failure() || link_->broken()) {
    // After a failure nothing can complete: return at once, and tell the scheduler
    // why so the other nodes fail now (with this reason) instead of at their timeouts.
    // The node is shared by the process's stores: all of them are broken now.
    std::string reason = link_->broken_reason();
    node_->Abort(reason.empty() ? "the job had failed" : reason);
    engine_.Shutdown(std::chrono::milliseconds(0));
    lease_.node->MarkAborted();
  } else {
    engine_.Shutdown(std::chrono::seconds(1));
  }
  lease_.node->RemoveEngine(&engine_);
  // The last store of the node says goodbye and ends it (shared_node.h).
  lease_.node.reset();
}

std::pair<int, int> DistWorkerStore::EpochPartition() {
  if (!options_.elastic) {
    ++epoch_;
    return {NumWorkers(), Rank()};
  }
  // A worker that joined the running job was admitted at the release of an epoch
  // barrier (Node::Start): that release deals its first epoch.
  if (catching_up_)
    catching_up_ = false;
  else
    link_->WorkerBarrier(kEpochGroup);
  epoch_ = static_cast<int>(node_->BarriersReleased(kEpochGroup)) - 1;
  const std::vector<int> live = node_->LiveWorkersAtRelease(kEpochGroup);
  for (size_t i = 0; i < live.size(); ++i)
    if (live[i] == node_->id()) return {static_cast<int>(live.size()), static_cast<int>(i)};
  throw UsageError("EpochPartition: this worker is no longer in the job");
}

void DistWorkerStore::SetOptimizer(const OptimizerConfig& config) {
  config.Validate();
  if (catching_up_) {  // the servers have the job's optimizer
    has_server_optimizer_ = true;
    return;
  }
  if (node_->rank() == 0)
    link_->Command(StoreCommand(kSetOptimizer, store_id_), payload::EncodeOptimizer(config));
  has_server_optimizer_ = true;
  link_->WorkerBarrier();
}

void DistWorkerStore::SetGradientCompression(const CompressionConfig& config) {
  config.Validate();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!keys_.empty())
      throw UsageError("SetGradientCompression must be called before the first Init");
  }
  if (node_->rank() == 0 && !catching_up_)
    link_->Command(kSetCompression, payload::EncodeCompression(config));
  compressor_ = config.active() ? std::make_unique<GradientCompressor>(config) : nullptr;
  if (!catching_up_) link_->WorkerBarrier();
}

void DistWorkerStore::SaveOptimizerStates(const std::string& fname, bool dump_optimizer) {
  WaitAll();
  if (!has_server_optimizer_)
    throw UsageError("no optimizer is set on the servers (call SetOptimizer first)");
  if (node_->rank() != 0) return;  // rank 0 writes the file
  SaveServerStates(
      *link_, [this](int S) { return StatesLayout(S); }, fname, dump_optimizer);
}

void DistWorkerStore::LoadOptimizerStates(const std::string& fname) {
  WaitAll();
  if (node_->rank() != 0) return;  // rank 0 alone loads
  if (!has_server_optimizer_)
    throw UsageError("no optimizer is set on the servers (call SetOptimizer first)");
  LoadServerStates(
      *link_, [this](int S) { return StatesLayout(S); }, fname);
}

states::Layout DistWorkerStore::StatesLayout(int num_servers) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<const KeyMeta*> metas = keys_.All();
  if (num_servers == node_->num_servers()) return LayoutOf(metas, num_servers);
  // Another job's placement (a file of a per-server format): the same functions with
  // its number of servers, big keys split evenly (the shares of that job are unknown).
  std::vector<std::unique_ptr<KeyMeta>> placed;
  for (const KeyMeta*& m : metas) {
    auto p = std::make_unique<KeyMeta>();
    p->key = m->key;
    p->dtype = m->dtype;
    p->size = m->size;
    p->sparse = m->sparse;
    p->rows = m->rows;
    p->row_size = m->row_size;
    if (m->sparse)
      PlaceRowSparse(p.get(), store_id_, num_servers, options_.bigarray_bound);
    else
      PlaceDense(p.get(), store_id_, num_servers, options_.bigarray_bound, {},
                 options_.wire_chunk_bytes, {}, wire_.chunks_per_slice);
    m = p.get();
    placed.push_back(std::move(p));
  }
  return LayoutOf(metas, num_servers);
}

void DistWorkerStore::InitImpl(const std::vector<int>& keys, const std::vector<NDArray>& values) {
  std::vector<KeyMeta*> created;
  {
    std::lock_guard<std::mutex> lk(mu_);
    CheckNewKeys(
        keys, values, compressor_ != nullptr, [&](int k) { return keys_.Has(k); },
        [&](int k) { return KeyName(k); });
    std::function<int64_t(int64_t)> comp_bytes;
    if (compressor_) comp_bytes = [this](int64_t n) { return compressor_->CompressedBytes(n); };
    for (size_t i = 0; i < keys.size(); ++i) {
      auto m = std::make_unique<KeyMeta>();
      m->key = keys[i];
      m->shape = values[i].shape();
      m->dtype = values[i].dtype();
      m->size = values[i].size();
      PlaceDense(m.get(), store_id_, node_->num_servers(), options_.bigarray_bound, shares_,
                 options_.wire_chunk_bytes, comp_bytes, wire_.chunks_per_slice);
      if (compressor_) m->residual = NDArray({m->size}, DType::kFloat32);
      created.push_back(keys_.Add(std::move(m)));
    }
  }
  // Joined a running job: the servers hold these keys (a Pull reads their values).
  if (catching_up_) return;
  payload::InitReport report;
  for (size_t i = 0; i < keys.size(); ++i)
    // Ids are wire keys: the stores of a process report in separate namespaces.
    report.entries.push_back({WireKey(store_id_, keys[i]), KeyName(keys[i]),
                              DTypeName(values[i].dtype()), ShapeToString(values[i].shape())});
  CollectiveInit(*link_, report, [&](size_t i) {
    const KeyMeta& m = *created[i];
    // A copy taken now, on the host (the servers hold every key on the CPU).
    const Frame frame =
        FrameOf(values[i].device().is_cuda() ? values[i].To(Device::CPU()) : values[i].Clone());
    auto done = std::make_shared<Completion>();
    auto ts = link_->worker()->Push(m.ps_keys, frame, m.lens, MakeCmd(Kind::kInit, m.dtype),
                                    Completion::Callback(done));
    link_->Await(ts, done, "init of key " + KeyName(keys[i]));
  });
}

void DistWorkerStore::PushImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                               int priority) {
  CheckAsyncHasOptimizer();
  const Grouped groups = Group(keys, values);
  const RoundRules::Step step = RoundRules::Step::kPush;
  const auto metas = LookUp(groups, values, "Push", "pushed value", &step);
  const bool on_devices = AnyOnDevice(values);
  if (on_devices) devices_->Prepare(metas, groups, values, true);
  std::vector<char> fused(metas.size(), 0);
  // Fusion gathers host memory: not for a call with values on devices.
  IssueFused(
      FusionGroups(metas, compressor_ || on_devices ? 0 : options_.fusion_key_bytes,
                   options_.fusion_bytes, &fused),
      {&metas, &groups, &values, nullptr, nullptr, priority, "push"}, &engine_, link_->worker(),
      [this](KeyMeta& m, const std::vector<NDArray>& v) { return std::get<0>(Prepare(m, v)); });
  for (size_t gi = 0; gi < metas.size(); ++gi) {
    if (fused[gi]) continue;
    const int k = groups.groups[gi].key;
    KeyMeta* m = metas[gi];
    std::vector<NDArray> vals = groups.Arrays(gi, values);
    const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
    if (devices_->ReducesOnDevice(vals, compressor_ != nullptr)) {
      engine_.Push({k}, priority, [this, k, obs_t, m, vals, priority](Engine::Done done) {
        done = obs::Track("push", std::to_string(k), m->size * DTypeSize(m->dtype), obs_t,
                          std::move(done));  // [observe]
        devices_->PushPull(*m, vals, {}, priority, std::move(done));
      });
      continue;
    }
    engine_.Push(
        {k}, priority,
        [this, k, obs_t, m, vals, priority](Engine::Done done) {
          auto [frame, lens, cmd] = Prepare(*m, vals);
          done = obs::Track("push", std::to_string(k), frame.size, obs_t,
                            std::move(done));  // [observe]
          link_->worker()->Push(m->ps_keys, frame, lens, cmd, done, priority, wire_.push_ahead,
                                wire_.MessageBytes());
        },
        StartsHere(*m, vals));
  }
}

void DistWorkerStore::PullImpl(const std::vector<int>& keys, const std::vector<NDArray>& outs,
                               int priority) {
  const Grouped groups = Group(keys, outs);
  const RoundRules::Step step = RoundRules::Step::kPull;
  const auto metas = LookUp(groups, outs, "Pull", "pull output", &step);
  const bool on_devices = AnyOnDevice(outs);
  if (on_devices) devices_->Prepare(metas, groups, outs, false);
  std::vector<char> fused(metas.size(), 0);
  IssueFused(FusionGroups(metas, compressor_ || on_devices ? 0 : options_.fusion_key_bytes,
                          options_.fusion_bytes, &fused),
             {&metas, nullptr, nullptr, &groups, &outs, priority, "pull"}, &engine_,
             link_->worker(), nullptr);
  for (size_t gi = 0; gi < metas.size(); ++gi) {
    if (fused[gi]) continue;
    const int k = groups.groups[gi].key;
    KeyMeta* m = metas[gi];
    const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
    std::vector<NDArray> dst = groups.Arrays(gi, outs);
    if (AnyOnDevice(dst)) {
      engine_.Push({k}, priority, [this, k, obs_t, m, dst, priority](Engine::Done done) {
        done = obs::Track("pull", std::to_string(k), dst[0].nbytes(), obs_t,
                          std::move(done));  // [observe]
        devices_->Pull(*m, dst, priority, std::move(done));
      });
      continue;
    }
    engine_.Push(
        {k}, priority,
        [this, k, obs_t, m, dst = std::move(dst), priority](Engine::Done done) {
          NDArray first = dst[0];
          done = obs::Track("pull", std::to_string(k), first.nbytes(), obs_t,
                            std::move(done));  // [observe]
          link_->worker()->Pull(m->ps_keys, static_cast<char*>(first.raw()), m->lens,
                                MakeCmd(Kind::kDense, m->dtype), CopyToAll(dst, std::move(done)),
                                priority);
        },
        options_.inline_start_bytes > 0);
  }
}

void DistWorkerStore::PushPullImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                                   const std::vector<int>& out_keys,
                                   const std::vector<NDArray>& outs, int priority) {
  const Grouped pushes = Group(keys, values);
  const Grouped pulls = Group(out_keys, outs);
  // The same keys on both sides (ascending in both): else name the first key pushed
  // but not pulled, or else the first pulled but not pushed.
  if (!std::equal(
          pushes.groups.begin(), pushes.groups.end(), pulls.groups.begin(), pulls.groups.end(),
          [](const Grouped::Entry& a, const Grouped::Entry& b) { return a.key == b.key; })) {
    for (auto& e : pushes.groups)
      if (!pulls.Has(e.key))
        throw InvalidArgument("PushPull: key " + KeyName(e.key) +
                              " is pushed but not pulled; the push and pull keys must be the same");
    for (auto& e : pulls.groups)
      if (!pushes.Has(e.key))
        throw InvalidArgument("PushPull: key " + KeyName(e.key) +
                              " is pulled but not pushed; the push and pull keys must be the same");
  }
  CheckAsyncHasOptimizer();
  const auto out_metas = LookUp(pulls, outs, "PushPull", "pull output");
  const RoundRules::Step step = RoundRules::Step::kPushPull;
  const auto metas = LookUp(pushes, values, "PushPull", "pushed value", &step);
  const bool on_devices = AnyOnDevice(values) || AnyOnDevice(outs);
  if (on_devices) {
    devices_->Prepare(metas, pushes, values, true);
    devices_->Prepare(out_metas, pulls, outs, false);
  }
  std::vector<char> fused(metas.size(), 0);
  IssueFused(
      FusionGroups(metas, compressor_ || on_devices ? 0 : options_.fusion_key_bytes,
                   options_.fusion_bytes, &fused),
      {&metas, &pushes, &values, &pulls, &outs, priority, "pushpull"}, &engine_, link_->worker(),
      [this](KeyMeta& m, const std::vector<NDArray>& v) { return std::get<0>(Prepare(m, v)); });
  for (size_t gi = 0; gi < metas.size(); ++gi) {
    if (fused[gi]) continue;
    const int k = pushes.groups[gi].key;
    KeyMeta* m = metas[gi];
    std::vector<NDArray> vals = pushes.Arrays(gi, values);
    const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
    std::vector<NDArray> dst = pulls.Arrays(gi, outs);
    if (devices_->ReducesOnDevice(vals, compressor_ != nullptr) || AnyOnDevice(dst)) {
      // Values or outputs on devices: the answer lands in the key's pinned buffer.
      engine_.Push({k}, priority, [this, k, obs_t, m, vals, dst, priority](Engine::Done done) {
        done = obs::Track("pushpull", std::to_string(k), m->size * DTypeSize(m->dtype), obs_t,
                          std::move(done));  // [observe]
        if (devices_->ReducesOnDevice(vals, compressor_ != nullptr))
          devices_->PushPull(*m, vals, dst, priority, std::move(done));
        else
          devices_->PushPullPrepared(*m, Prepare(*m, vals), dst, priority, std::move(done));
      });
      continue;
    }
    engine_.Push(
        {k}, priority,
        [this, k, obs_t, m, vals, dst = std::move(dst), priority](Engine::Done done) {
          auto [frame, lens, cmd] = Prepare(*m, vals);
          done = obs::Track("pushpull", std::to_string(k), frame.size, obs_t,  // [observe]
                            std::move(done));
          // The first output may be the input itself (in-place all-reduce): then
          // `frame` points into the output and is sent without a copy. That is
          // safe because each server's part of the answer lands exactly where that
          // server's part of the request was read from (same keys, same lengths),
          // and a server answers only after it received its whole part, i.e. after
          // the transport finished reading it (TCP: copied into the kernel; shm:
          // copied into the ring). A retransmission (PS_RESEND) that reads the
          // overwritten bytes can only follow a delivered original, which the
          // server's de-duplication drops. (docs/design.md, "Copies".)
          NDArray first = dst[0];
          link_->worker()->PushPull(m->ps_keys, frame, lens, static_cast<char*>(first.raw()),
                                    m->lens, cmd, CopyToAll(dst, std::move(done)), priority,
                                    wire_.push_ahead, wire_.MessageBytes());
        },
        StartsHere(*m, vals));
  }
}

void DistWorkerStore::WaitImpl(const std::vector<int>* keys, std::chrono::milliseconds timeout) {
  WaitWithStallReports(engine_, *link_, keys, timeout);
}

void DistWorkerStore::SetUpdaterImpl(Updater) {
  throw UsageError(
      "a custom updater cannot run on the servers of a dist store; use SetOptimizer "
      "(the servers run it), or PushPull the gradients and update locally");
}

std::tuple<Frame, std::vector<uint64_t>, int> DistWorkerStore::Prepare(
    KeyMeta& m, const std::vector<NDArray>& vals) {
  const NDArray merged = AnyOnDevice(vals)  ? devices_->StagedSum(m, vals)
                         : vals.size() == 1 ? vals[0]
                                            : reducer_->Reduce(vals, &m.merge);
  if (!compressor_) return {FrameOf(merged), m.lens, MakeCmd(Kind::kDense, m.dtype)};
  // Each server slice is quantised on its own, with its part of the residual.
  uint64_t total = 0;
  for (auto l : m.comp_lens) total += l;
  auto buf = std::shared_ptr<uint8_t[]>(new uint8_t[total ? total : 1]);
  uint64_t off = 0;
  for (size_t i = 0; i < m.slices.size(); ++i) {
    const auto& s = m.slices[i];
    compressor_->Quantize(merged.data<float>() + s.offset, m.residual.data<float>() + s.offset,
                          buf.get() + off, s.len);
    off += m.comp_lens[i];
  }
  Frame f;
  f.data = reinterpret_cast<const char*>(buf.get());
  f.size = total;
  f.owner = std::shared_ptr<const void>(buf, buf.get());
  return {f, m.comp_lens, MakeCmd(Kind::kCompressed, m.dtype)};
}

void DistWorkerStore::CheckAsyncHasOptimizer() const {
  if (async_ && !has_server_optimizer_)
    throw UsageError(
        "dist_async needs an optimizer on the servers: call SetOptimizer before "
        "pushing (in async mode every push is applied at once)");
}

std::vector<KeyMeta*> DistWorkerStore::LookUp(const Grouped& groups,
                                              const std::vector<NDArray>& arrays, const char* op,
                                              const char* what, const RoundRules::Step* step) {
  std::lock_guard<std::mutex> lk(mu_);
  auto metas = keys_.Check(groups, arrays, op, what);
  if (step && options_.strict_rounds && !async_)
    RoundRules::Admit(metas, *step, op, [this](int k) { return KeyName(k); });
  return metas;
}

bool DistWorkerStore::StartsHere(const KeyMeta& m, const std::vector<NDArray>& vals) const {
  return vals.size() == 1 && !compressor_ && !vals[0].device().is_cuda() &&
         m.size * static_cast<int64_t>(DTypeSize(m.dtype)) <= options_.inline_start_bytes;
}

}  // namespace pskv::dist
