// KVStoreDist: the worker side of dist_sync / dist_async (+ _device variants).
//
// Per key: values are reduced locally (CPU, also for *_device on this CPU-only
// build), then sent to the servers holding the key's slices; pulls land in the
// first output and are copied to the others. Every key's operations run in order
// on the engine; different keys overlap, higher priority first.
//
// Blocking: every wait for the servers goes through KVWorker::Await (shared
// completion state, timeout, stall reports, cancellation of the request on timeout),
// or through the engine for scheduled operations (WaitImpl adds the stall reports).
// After a timeout or a dead peer the store is broken: closing it aborts at once
// instead of waiting for the final barrier.
//
// Strict rounds (PSKV_STRICT_ROUNDS=1, dist_sync): each key's calls on this worker
// must form rounds "push (or push-pull), then pulls"; checked at the call, under mu_.
//
// Fusion (PSKV_FUSION_KEY_BYTES, PSKV_FUSION_BYTES): within one Push, Pull or
// PushPull call, the small keys (held whole by one server, dense) of the same server
// and dtype travel together: one engine operation over those keys (so each key's
// order with its other operations is kept) sends one message of up to
// PSKV_FUSION_BYTES, its values gathered from the keys' arrays (no packing copy); the
// server handles each key as if it had come alone and answers the message once all
// its keys' rounds completed (dist_server.h), gathering the answer from the stored
// values; the answer is copied out per key. Nothing waits for later calls:
// fusion adds no delay (calls issued one key at a time are not fused).
#include "kvstore/kvstore_dist.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "common/byte_io.h"
#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/compression.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/dist_server.h"
#include "kvstore/engine.h"
#include "kvstore/kvstore_common.h"
#include "kvstore/reduce.h"
#include "protocol/payload.h"
#include "ps/kv_app.h"
#include "pskv/error.h"
#include "sparse/sparse_ops.h"

namespace pskv {

namespace {

using dist::Kind;

// One node per worker process, shared by every dist store the process creates
// (MXNet allowed several stores per process, e.g. one per Trainer of a GAN). The
// stores get ids 0, 1, ... in creation order — every worker must create them in
// the same order — and their keys travel in separate namespaces (dist::WireKey).
// The last store to close ends the node.
//
// A process may also hold several worker *nodes* of one job (tests and benchmarks
// run a whole job as threads): stores are grouped by (scheduler address, rank hint),
// so stores created with different rank hints (DMLC_TASK_ID) are different workers.
// Starting a node (registration) and ending it (the final barrier) wait for the other
// nodes of the job, so neither runs under g_shared_mu: with two worker nodes in one
// process, the second could otherwise never register, or never reach the final
// barrier the first one waits in.
struct SharedNode {
  Options options;
  std::mutex mu;              // engines
  std::set<Engine*> engines;  // poisoned when a peer fails
  bool async = false;
  int next_store = 0;   // under g_shared_mu
  std::mutex start_mu;  // start_done, start_error, started
  bool start_done = false;
  std::exception_ptr start_error;
  std::unique_ptr<Node> node;  // destroyed before the members above
  std::unique_ptr<KVWorker> worker;
  bool started = false;  // Start() succeeded: the node must say goodbye
  bool aborted = false;  // a store aborted the node (after a failure): no goodbye

  ~SharedNode() {
    if (!started || aborted) return;
    if (node->failure()) {
      node->Abort("the job had failed");
      return;
    }
    try {
      // Tell the servers no more pushes come from here (so a sync round that waits
      // for this worker fails with a message instead of hanging), then the final
      // barrier over all nodes ("this worker is done": it waits for the others).
      worker->Command(dist::kWorkerDone, "", options.op_timeout);
      node->Finalize(options.op_timeout);
    } catch (const std::exception& e) {
      PSKV_ERROR("closing the dist store failed: " << e.what());
      node->Abort(e.what());
    }
  }
};

std::mutex g_shared_mu;
// (scheduler address, rank hint) -> the worker node of those stores; expired entries
// are dropped at the next lookup (the map holds at most the nodes alive at once).
std::map<std::string, std::weak_ptr<SharedNode>> g_shared;

std::string SharedNodeKey(const Options& o) {
  return o.root_uri + ":" + std::to_string(o.root_port) + "#" + std::to_string(o.rank_hint);
}

class KVStoreDist final : public KVStore {
 public:
  KVStoreDist(std::string type, Options options)
      : KVStore(std::move(type), std::move(options)),
        async_(type_.find("async") != std::string::npos),
        reducer_(options_.bigarray_bound, options_.reduction_threads) {
    engine_.SetWaitSpin(std::chrono::microseconds(options_.spin_us));
    {
      std::lock_guard<std::mutex> lk(g_shared_mu);
      for (auto it = g_shared.begin(); it != g_shared.end();)
        it = it->second.expired() ? g_shared.erase(it) : std::next(it);
      auto& slot = g_shared[SharedNodeKey(options_)];
      shared_ = slot.lock();
      if (!shared_) {
        auto sn = std::make_shared<SharedNode>();
        sn->options = options_;
        sn->async = async_;
        sn->node = std::make_unique<Node>(options_);
        sn->worker = std::make_unique<KVWorker>(sn->node.get());
        SharedNode* raw = sn.get();
        sn->node->AddFailureHandler([raw](std::exception_ptr e) {
          std::lock_guard<std::mutex> lk(raw->mu);
          for (Engine* en : raw->engines) en->Poison(e);
        });
        shared_ = sn;
        slot = sn;
      } else if (shared_->async != async_) {
        throw UsageError("the dist stores of one process must all be sync or all async ('" + type_ +
                         "' after a " + (shared_->async ? "async" : "sync") + " store)");
      }
      store_id_ = shared_->next_store++;
      if (store_id_ >= dist::kMaxStores) throw UsageError("too many dist stores in one process");
    }
    {
      // Registration waits for the whole job: outside g_shared_mu (see SharedNode).
      std::lock_guard<std::mutex> lk(shared_->start_mu);
      if (!shared_->start_done) {
        shared_->start_done = true;
        try {
          shared_->node->Start();
          shared_->started = true;
          SetLogName(shared_->node->Tag());
        } catch (...) {
          shared_->start_error = std::current_exception();
        }
      }
      if (shared_->start_error) std::rethrow_exception(shared_->start_error);
    }
    node_ = shared_->node.get();
    worker_ = shared_->worker.get();
    if (node_->rank() == 0 && store_id_ == 0)
      worker_->Command(dist::kSetMode, payload::EncodeMode(!async_), options_.op_timeout);
    node_->Barrier(kWorkerGroup, options_.op_timeout);
    // Last, so a constructor that threw leaves no engine behind in shared_.
    std::lock_guard<std::mutex> lk(shared_->mu);
    shared_->engines.insert(&engine_);
    if (auto failed = node_->failure()) engine_.Poison(failed);
  }

  ~KVStoreDist() override {
    if (!broken_) {
      try {
        engine_.Wait(nullptr, options_.op_timeout);
      } catch (const std::exception& e) {
        PSKV_WARN("operations failed before the store was closed: " << e.what());
        MarkBrokenIf(std::current_exception());
      }
    }
    if (node_->failure() || broken_) {
      // After a failure nothing can complete: return at once, and tell the scheduler
      // why so the other nodes fail now (with this reason) instead of at their timeouts.
      // The node is shared by the process's stores: all of them are broken now.
      std::string reason;
      {
        std::lock_guard<std::mutex> lk(broken_mu_);
        reason = broken_reason_.empty() ? "the job had failed" : broken_reason_;
      }
      node_->Abort(reason);
      engine_.Shutdown(std::chrono::milliseconds(0));
      std::lock_guard<std::mutex> g(g_shared_mu);
      shared_->aborted = true;
    } else {
      engine_.Shutdown(std::chrono::seconds(1));
    }
    {
      std::lock_guard<std::mutex> lk(shared_->mu);
      shared_->engines.erase(&engine_);
    }
    // The last store of the node says goodbye and ends it: the final barrier waits for
    // the other nodes, so not under g_shared_mu (see SharedNode).
    shared_.reset();
  }

  int Rank() const override { return node_->rank(); }
  int NumWorkers() const override { return node_->num_workers(); }
  void Barrier() override { WorkerBarrier(); }

  void SetOptimizer(const OptimizerConfig& config) override {
    config.Validate();
    if (node_->rank() == 0)
      Command(dist::StoreCommand(dist::kSetOptimizer, store_id_), payload::EncodeOptimizer(config));
    has_server_optimizer_ = true;
    WorkerBarrier();
  }

  void SetGradientCompression(const CompressionConfig& config) override {
    config.Validate();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!keys_.empty())
        throw UsageError("SetGradientCompression must be called before the first Init");
    }
    if (node_->rank() == 0) Command(dist::kSetCompression, payload::EncodeCompression(config));
    compressor_ = config.active() ? std::make_unique<GradientCompressor>(config) : nullptr;
    WorkerBarrier();
  }

  // Optimizer states move as chunked data (any size), only to and from rank 0,
  // which writes and reads the file; on other ranks both calls only WaitAll. Neither
  // is collective: in sync mode no round can complete while rank 0 is inside the
  // call, so the states saved or loaded are those between two rounds.
  // File: "PSKVDST2", u32 servers, u64 size per server, then each server's states.
  // dump_optimizer: each server's blob is marked so that loading adopts the saved
  // optimizer configuration too (MXNet's save_optimizer_states(dump_optimizer=True)).
  // Store s's states travel under its key 0 (WireKey(s, 0)) and commands carry s.
  void SaveOptimizerStates(const std::string& fname, bool dump_optimizer) override {
    WaitAll();
    if (!has_server_optimizer_)
      throw UsageError("no optimizer is set on the servers (call SetOptimizer first)");
    if (node_->rank() != 0) return;  // rank 0 writes the file
    const int S = node_->num_servers();
    auto sizes = Command(dist::StoreCommand(dist::kStatesSize, store_id_), "");
    std::vector<uint64_t> keys, lens;
    uint64_t total = 0;
    for (int r = 0; r < S; ++r) {
      keys.push_back(dist::PsKey(dist::WireKey(store_id_, 0), r, S));
      lens.push_back(payload::DecodeStatesSize(sizes[static_cast<size_t>(r)]));
      total += lens.back();
    }
    auto buf = std::shared_ptr<char[]>(new char[total ? total : 1]);
    auto done = std::make_shared<Completion>();
    // The callback holds the buffer: a reply arriving after a timeout writes into live
    // memory (and a cancelled request receives nothing at all).
    auto ts = worker_->Pull(keys, buf.get(), lens, dist::MakeCmd(Kind::kStates, DType::kUInt8),
                            [done, buf](std::exception_ptr e) { done->Set(e); });
    Await(ts, done, "saving optimizer states");
    if (dump_optimizer) {
      uint64_t off = 0;
      for (auto l : lens) {  // the mark is in the blob's first 8 bytes
        std::string head(buf.get() + off, std::min<uint64_t>(l, 8));
        MarkStatesDumped(&head);
        std::memcpy(buf.get() + off, head.data(), head.size());
        off += l;
      }
    }
    std::ofstream f(fname, std::ios::binary | std::ios::trunc);
    f.write("PSKVDST2", 8);
    const uint32_t n = static_cast<uint32_t>(S);
    f.write(reinterpret_cast<const char*>(&n), 4);
    for (auto l : lens) f.write(reinterpret_cast<const char*>(&l), 8);
    f.write(buf.get(), static_cast<std::streamsize>(total));
    f.close();
    if (!f) throw IOError("cannot write optimizer states to '" + fname + "'");
  }

  void LoadOptimizerStates(const std::string& fname) override {
    WaitAll();
    if (node_->rank() != 0) return;  // rank 0 alone loads (see SaveOptimizerStates)
    if (!has_server_optimizer_)
      throw UsageError("no optimizer is set on the servers (call SetOptimizer first)");
    std::ifstream f(fname, std::ios::binary | std::ios::ate);
    if (!f) throw IOError("cannot open optimizer states file '" + fname + "'");
    const auto file_size = static_cast<uint64_t>(f.tellg());
    f.seekg(0);
    auto data = std::make_shared<std::string>(file_size, '\0');
    if (!f.read(data->data(), static_cast<std::streamsize>(file_size)))
      throw IOError("cannot read optimizer states file '" + fname + "'");
    const int S = node_->num_servers();
    std::vector<uint64_t> lens;
    uint64_t at = 0;
    auto bad = [&](const std::string& why) {
      return IOError("'" + fname + "' is not a pskv dist optimizer-states file: " + why);
    };
    if (file_size < 12) throw bad("too short");
    if (data->compare(0, 8, "PSKVDST2") == 0) {
      uint32_t n;
      std::memcpy(&n, data->data() + 8, 4);
      at = 12;
      if (static_cast<int>(n) != S)
        throw UsageError("the optimizer states were saved from " + std::to_string(n) +
                         " servers but this job has " + std::to_string(S) +
                         "; restore with the same number of servers");
      if (file_size < at + 8ull * n) throw bad("truncated");
      uint64_t sum = 0;
      for (uint32_t i = 0; i < n; ++i) {
        uint64_t l;
        std::memcpy(&l, data->data() + at + 8ull * i, 8);
        if (l > file_size) throw bad("bad size");
        lens.push_back(l);
        sum += l;
      }
      at += 8ull * n;
      if (sum != file_size - at) throw bad("sizes do not add up");
    } else if (data->compare(0, 8, "PSKVDST1") == 0) {
      // Format 1 (u32 count, then u32-length strings): repacked without the lengths.
      ByteReader r(data->data() + 8, file_size - 8, "optimizer states");
      uint32_t n = r.Get<uint32_t>();
      if (static_cast<int>(n) != S)
        throw UsageError("the optimizer states were saved from " + std::to_string(n) +
                         " servers but this job has " + std::to_string(S) +
                         "; restore with the same number of servers");
      auto packed = std::make_shared<std::string>();
      for (uint32_t i = 0; i < n; ++i) {
        std::string b = r.GetString(UINT32_MAX);
        lens.push_back(b.size());
        packed->append(b);
      }
      data = packed;
      at = 0;
    } else {
      throw bad("bad magic");
    }
    std::vector<uint64_t> keys;
    for (int r = 0; r < S; ++r) keys.push_back(dist::PsKey(dist::WireKey(store_id_, 0), r, S));
    Frame vals;
    vals.data = data->data() + at;
    vals.size = data->size() - at;
    vals.owner = data;
    auto done = std::make_shared<Completion>();
    auto ts = worker_->Push(keys, vals, lens, dist::MakeCmd(Kind::kStates, DType::kUInt8),
                            Completion::Callback(done));
    Await(ts, done, "loading optimizer states");
  }

 protected:
  struct KeyMeta {
    Shape shape;
    DType dtype;
    int64_t size;
    std::vector<dist::Slice> slices;  // one per wire chunk (ps key), by server and offset
    NDArray merge;                    // local reduction buffer (allocated lazily)
    NDArray residual;                 // compression residual (float32)
    std::vector<uint64_t> ps_keys, lens, comp_lens;
    // Strict rounds (under mu_): pushes issued by this worker, and whether this
    // worker pulled since its last push.
    int64_t pushes = 0;
    bool pulled = true;
    // row_sparse key: rows of row_size elements, sliced by row range over `ranges`
    // (ps_keys[i] is ranges[i]'s server).
    bool sparse = false;
    int64_t rows = 0, row_size = 0;
    std::vector<dist::RowRange> ranges;
    // The next key in keys_ and its meta (under mu_; keys are never removed): a call's
    // keys ascend, so Check finds the next one without a tree search.
    int key = 0;
    KeyMeta* next = nullptr;
  };

  // Under mu_: adds a key's meta to keys_ and links it between its neighbours.
  void AddKey(int key, std::unique_ptr<KeyMeta> m) {
    m->key = key;
    auto at = keys_.emplace(key, std::move(m)).first;
    auto after = std::next(at);
    at->second->next = after == keys_.end() ? nullptr : after->second.get();
    if (at != keys_.begin()) std::prev(at)->second->next = at->second.get();
  }

  KeyMeta& Meta(int key, const char* op) {
    auto it = keys_.find(key);
    if (it == keys_.end())
      throw KeyError(std::string(op) + ": key " + KeyName(key) +
                     " has not been inited (call Init first)");
    return *it->second;
  }

  void InitImpl(const std::vector<int>& keys, const std::vector<NDArray>& values) override {
    std::vector<std::pair<int, KeyMeta*>> created;
    {
      std::lock_guard<std::mutex> lk(mu_);
      CheckNewKeys(
          keys, values, compressor_ != nullptr, [&](int k) { return keys_.count(k) > 0; },
          [&](int k) { return KeyName(k); });
      for (size_t i = 0; i < keys.size(); ++i) {
        auto m = std::make_unique<KeyMeta>();
        m->shape = values[i].shape();
        m->dtype = values[i].dtype();
        m->size = values[i].size();
        // MXNet's placement over the servers, each server's slice cut into wire
        // chunks (dist_protocol.h): one ps key (and message) per chunk.
        const int S = node_->num_servers();
        for (auto& c : dist::ChunkSlices(
                 dist::PlaceKey(keys[i], m->size, S, options_.bigarray_bound),
                 static_cast<int64_t>(DTypeSize(m->dtype)), options_.wire_chunk_bytes, S)) {
          const dist::Slice s{c.server, c.offset, c.len};
          m->slices.push_back(s);
          m->ps_keys.push_back(
              dist::PsKey(dist::ChunkKey(dist::WireKey(store_id_, keys[i]), c.index), s.server, S));
          m->lens.push_back(static_cast<uint64_t>(s.len) * DTypeSize(m->dtype));
          if (compressor_)
            m->comp_lens.push_back(static_cast<uint64_t>(compressor_->CompressedBytes(s.len)));
        }
        if (compressor_) m->residual = NDArray({m->size}, DType::kFloat32);
        created.emplace_back(keys[i], m.get());
        AddKey(keys[i], std::move(m));
      }
    }
    // Every worker reports its keys' names, dtypes and shapes to server 0, rank 0
    // initialises the servers, all meet at the barrier, then all ask server 0 whether
    // the reports agreed: a mismatch (shape, or string-key order) is then the same
    // error on every worker instead of an error on one and a hang on the others.
    payload::InitReport report;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < keys.size(); ++i) {
      // Ids are wire keys: the stores of a process report in separate namespaces.
      const int64_t wid = dist::WireKey(store_id_, keys[i]);
      report.entries.push_back(
          {wid, KeyName(keys[i]), DTypeName(values[i].dtype()), ShapeToString(values[i].shape())});
      ids.push_back(wid);
    }
    Command(dist::kReportInit, payload::EncodeInitReport(report), {ServerId(0)});
    std::exception_ptr err;
    if (node_->rank() == 0) {
      // Rank 0's values initialise the servers; the others' are only checked.
      payload::InitReport failures;
      for (size_t i = 0; i < keys.size(); ++i) {
        KeyMeta& m = *created[i].second;
        NDArray v = values[i].Clone();
        auto frame = FrameOf(v, 0, v.nbytes());
        try {
          auto done = std::make_shared<Completion>();
          auto ts = worker_->Push(m.ps_keys, frame, m.lens, dist::MakeCmd(Kind::kInit, m.dtype),
                                  Completion::Callback(done));
          Await(ts, done, "init of key " + KeyName(keys[i]));
        } catch (const std::exception& e) {
          if (!err) err = std::current_exception();
          failures.failures.push_back({dist::WireKey(store_id_, keys[i]), e.what()});
        }
      }
      if (!failures.failures.empty() && !broken_)
        Command(dist::kReportInit, payload::EncodeInitReport(failures), {ServerId(0)});
    }
    if (broken_ && err) std::rethrow_exception(err);
    WorkerBarrier();
    Command(dist::kCheckInit, payload::EncodeCheckInit(ids), {ServerId(0)});
    if (err) std::rethrow_exception(err);
  }

  void PushImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                int priority) override {
    CheckAsyncHasOptimizer();
    const Grouped groups = Group(keys, values);
    const auto metas = Check(groups, values, "Push", "pushed value", Round::kPush);
    std::vector<char> fused(metas.size(), 0);
    IssueFused(FusionGroups(metas, &fused), metas, &groups, &values, nullptr, nullptr, priority,
               "push");
    for (size_t gi = 0; gi < metas.size(); ++gi) {
      if (fused[gi]) continue;
      const int k = groups.groups[gi].key;
      KeyMeta* m = metas[gi];
      std::vector<NDArray> vals = groups.Arrays(gi, values);
      const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
      engine_.Push(
          {k}, priority,
          [this, k, obs_t, m, vals, priority](Engine::Done done) {
            auto [frame, lens, cmd] = Prepare(*m, vals);
            done = obs::Track("push", std::to_string(k), frame.size, obs_t,
                              std::move(done));  // [observe]
            worker_->Push(m->ps_keys, frame, lens, cmd, done, priority);
          },
          StartsHere(*m, vals.size()));
    }
  }

  void PullImpl(const std::vector<int>& keys, const std::vector<NDArray>& outs,
                int priority) override {
    const Grouped groups = Group(keys, outs);
    const auto metas = Check(groups, outs, "Pull", "pull output", Round::kPull);
    std::vector<char> fused(metas.size(), 0);
    IssueFused(FusionGroups(metas, &fused), metas, nullptr, nullptr, &groups, &outs, priority,
               "pull");
    for (size_t gi = 0; gi < metas.size(); ++gi) {
      if (fused[gi]) continue;
      const int k = groups.groups[gi].key;
      KeyMeta* m = metas[gi];
      const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
      engine_.Push(
          {k}, priority,
          [this, k, obs_t, m, dst = groups.Arrays(gi, outs), priority](Engine::Done done) {
            NDArray first = dst[0];
            done = obs::Track("pull", std::to_string(k), first.nbytes(), obs_t,
                              std::move(done));  // [observe]
            worker_->Pull(m->ps_keys, static_cast<char*>(first.raw()), m->lens,
                          dist::MakeCmd(Kind::kDense, m->dtype), Broadcast(dst, std::move(done)),
                          priority);
          },
          options_.inline_start_bytes > 0);
    }
  }

  void PushPullImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                    const std::vector<int>& out_keys, const std::vector<NDArray>& outs,
                    int priority) override {
    const Grouped pushes = Group(keys, values);
    const Grouped pulls = Group(out_keys, outs);
    // The same keys on both sides (ascending in both): else name the first key pushed
    // but not pulled, or else the first pulled but not pushed.
    auto has = [](const Grouped& g, int k) {
      auto it = std::lower_bound(g.groups.begin(), g.groups.end(), k,
                                 [](const Grouped::Entry& e, int key) { return e.key < key; });
      return it != g.groups.end() && it->key == k;
    };
    if (!std::equal(
            pushes.groups.begin(), pushes.groups.end(), pulls.groups.begin(), pulls.groups.end(),
            [](const Grouped::Entry& a, const Grouped::Entry& b) { return a.key == b.key; })) {
      for (auto& e : pushes.groups)
        if (!has(pulls, e.key))
          throw InvalidArgument(
              "PushPull: key " + KeyName(e.key) +
              " is pushed but not pulled; the push and pull keys must be the same");
      for (auto& e : pulls.groups)
        if (!has(pushes, e.key))
          throw InvalidArgument(
              "PushPull: key " + KeyName(e.key) +
              " is pulled but not pushed; the push and pull keys must be the same");
    }
    CheckAsyncHasOptimizer();
    Check(pulls, outs, "PushPull", "pull output");
    const auto metas = Check(pushes, values, "PushPull", "pushed value", Round::kPushPull);
    std::vector<char> fused(metas.size(), 0);
    IssueFused(FusionGroups(metas, &fused), metas, &pushes, &values, &pulls, &outs, priority,
               "pushpull");
    for (size_t gi = 0; gi < metas.size(); ++gi) {
      if (fused[gi]) continue;
      const int k = pushes.groups[gi].key;
      KeyMeta* m = metas[gi];
      std::vector<NDArray> vals = pushes.Arrays(gi, values);
      const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
      engine_.Push(
          {k}, priority,
          [this, k, obs_t, m, vals, dst = pulls.Arrays(gi, outs), priority](Engine::Done done) {
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
            worker_->PushPull(m->ps_keys, frame, lens, static_cast<char*>(first.raw()), m->lens,
                              cmd, Broadcast(dst, std::move(done)), priority);
          },
          StartsHere(*m, vals.size()));
    }
  }

  // Waits in slices of the stall interval; each stall logs what is pending and what
  // the servers' open rounds wait for; the TimeoutError names the same.
  void WaitImpl(const std::vector<int>* keys, std::chrono::milliseconds timeout) override {
    using namespace std::chrono;
    const auto start = steady_clock::now(), deadline = start + timeout;
    milliseconds interval = options_.stall_warning;
    for (;;) {
      const auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
      const bool last = interval.count() <= 0 || left <= interval;
      if (engine_.WaitIdle(keys, last ? std::max(left, milliseconds(0)) : interval)) break;
      if (last) {
        const std::string what =
            "KVStore wait timed out after " +
            std::to_string(duration_cast<milliseconds>(timeout).count() / 1000.0) +
            " s (raise PSKV_TIMEOUT if this is expected); " +
            Stalled(true, duration_cast<seconds>(steady_clock::now() - start), keys);
        MarkBroken(what);
        throw TimeoutError(what);
      }
      Stalled(false, duration_cast<seconds>(steady_clock::now() - start), keys);
      interval *= 2;  // back-off
    }
    try {
      // Not Wait(keys, 0): another thread may have issued an operation on these keys
      // since they were idle, which a zero-timeout wait would report as a timeout.
      engine_.TakeFailure(keys);  // rethrows a recorded failure
    } catch (...) {
      MarkBrokenIf(std::current_exception());
      throw;
    }
  }

  // ---- row_sparse keys: one request per call, one key per server (sparse_server.h
  // ---- describes the values); every server holding rows gets each push, also an
  // ---- empty one (its part of a sync round).
  void InitRowSparseImpl(int key, const RowSparseNDArray& value) override {
    KeyMeta* meta;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (keys_.count(key)) throw KeyError("duplicate init of key " + KeyName(key));
      if (compressor_) throw SparseWithCompression(KeyName(key));
      auto m = std::make_unique<KeyMeta>();
      m->shape = value.shape();
      m->dtype = value.dtype();
      m->size = NumElements(value.shape());
      m->sparse = true;
      m->rows = value.num_rows();
      m->row_size = value.RowSize();
      if (m->rows == 0 || m->row_size == 0)
        throw ShapeError("Init of row_sparse key " + KeyName(key) + " with an empty shape " +
                         ShapeToString(value.shape()));
      m->ranges =
          dist::PlaceRows(key, m->rows, m->row_size, node_->num_servers(), options_.bigarray_bound);
      for (auto& r : m->ranges)
        m->ps_keys.push_back(
            dist::PsKey(dist::WireKey(store_id_, key), r.server, node_->num_servers()));
      meta = m.get();
      AddKey(key, std::move(m));
    }
    // As InitImpl: reports, rank 0 initialises, barrier, check.
    const int64_t wid = dist::WireKey(store_id_, key);
    payload::InitReport report;
    report.entries.push_back({wid, KeyName(key), DTypeName(value.dtype()) + " row_sparse",
                              ShapeToString(value.shape())});
    Command(dist::kReportInit, payload::EncodeInitReport(report), {ServerId(0)});
    std::exception_ptr err;
    if (node_->rank() == 0) {
      try {
        const NDArray dense = value.ToDense();
        const uint64_t es = DTypeSize(meta->dtype), rb = meta->row_size * es;
        std::vector<uint64_t> lens;
        uint64_t total = 0;
        for (auto& r : meta->ranges) {
          lens.push_back(16 + r.count * rb);
          total += lens.back();
        }
        auto buf = std::make_shared<std::string>(total, '\0');
        char* p = buf->data();
        for (auto& r : meta->ranges) {
          const uint64_t head[2] = {static_cast<uint64_t>(r.count),
                                    static_cast<uint64_t>(meta->row_size)};
          std::memcpy(p, head, 16);
          std::memcpy(p + 16, static_cast<const char*>(dense.raw()) + r.begin * rb, r.count * rb);
          p += 16 + r.count * rb;
        }
        Frame f;
        f.data = buf->data();
        f.size = buf->size();
        f.owner = buf;
        auto done = std::make_shared<Completion>();
        auto ts =
            worker_->Push(meta->ps_keys, f, lens, dist::MakeCmd(Kind::kSparseInit, meta->dtype),
                          Completion::Callback(done));
        Await(ts, done, "init of row_sparse key " + KeyName(key));
      } catch (const std::exception& e) {
        err = std::current_exception();
        payload::InitReport failures;
        failures.failures.push_back({wid, e.what()});
        if (!broken_)
          Command(dist::kReportInit, payload::EncodeInitReport(failures), {ServerId(0)});
      }
    }
    if (broken_ && err) std::rethrow_exception(err);
    WorkerBarrier();
    Command(dist::kCheckInit, payload::EncodeCheckInit({wid}), {ServerId(0)});
    if (err) std::rethrow_exception(err);
  }

  KeyMeta& SparseMeta(int key, const char* op) {
    KeyMeta& m = Meta(key, op);
    if (!m.sparse) throw SparseUseOfDenseKey(op, KeyName(key));
    return m;
  }

  void PushRowSparseImpl(int key, const std::vector<RowSparseNDArray>& values,
                         int priority) override {
    CheckAsyncHasOptimizer();
    KeyMeta* m;
    {
      std::lock_guard<std::mutex> lk(mu_);
      m = &SparseMeta(key, "Push of a row_sparse value");
      for (auto& v : values)
        CheckSparseMatches(v.shape(), v.dtype(), m->shape, m->dtype, "pushed row_sparse value",
                           KeyName(key));
    }
    const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
    engine_.Push({key}, priority, [this, key, m, values, obs_t, priority](Engine::Done done) {
      const RowSparseNDArray sum = sparse::Sum(values);
      const int64_t* ids = sum.indices().data<int64_t>();
      const int64_t nnz = sum.nnz();
      const uint64_t es = DTypeSize(m->dtype), rb = m->row_size * es;
      std::vector<uint64_t> lens;
      uint64_t total = 0;
      std::vector<std::pair<int64_t, int64_t>> parts;  // [first, last) of ids per range
      for (auto& r : m->ranges) {
        const int64_t a = std::lower_bound(ids, ids + nnz, r.begin) - ids;
        const int64_t b = std::lower_bound(ids, ids + nnz, r.begin + r.count) - ids;
        parts.emplace_back(a, b);
        lens.push_back(16 + (b - a) * (8 + rb));
        total += lens.back();
      }
      auto buf = std::make_shared<std::string>(total, '\0');
      char* p = buf->data();
      for (size_t i = 0; i < m->ranges.size(); ++i) {
        const auto [a, b] = parts[i];
        const uint64_t head[2] = {static_cast<uint64_t>(b - a), static_cast<uint64_t>(m->row_size)};
        std::memcpy(p, head, 16);
        p += 16;
        for (int64_t j = a; j < b; ++j, p += 8) {
          const int64_t local = ids[j] - m->ranges[i].begin;
          std::memcpy(p, &local, 8);
        }
        std::memcpy(p, static_cast<const char*>(sum.data().raw()) + a * rb, (b - a) * rb);
        p += (b - a) * rb;
      }
      Frame f;
      f.data = buf->data();
      f.size = buf->size();
      f.owner = buf;
      done = obs::Track("push", std::to_string(key), f.size, obs_t, std::move(done));  // [observe]
      worker_->Push(m->ps_keys, f, lens, dist::MakeCmd(Kind::kSparsePush, m->dtype), done,
                    priority);
    });
  }

  void RowSparsePullImpl(int key, const std::vector<RowSparseNDArray>& outs,
                         const std::vector<NDArray>& row_ids, int priority) override {
    KeyMeta* m;
    std::vector<NDArray> ids;
    {
      std::lock_guard<std::mutex> lk(mu_);
      m = &SparseMeta(key, "RowSparsePull");
      for (size_t i = 0; i < outs.size(); ++i) {
        CheckSparseMatches(outs[i].shape(), outs[i].dtype(), m->shape, m->dtype,
                           "row_sparse_pull output", KeyName(key));
        ids.push_back(CanonicalRowIds(row_ids[i], m->rows));
      }
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
      engine_.Push(
          {key}, priority,
          [this, key, m, out = outs[i], want = ids[i], obs_t, priority](Engine::Done done) {
            const int64_t* id = want.data<int64_t>();
            const int64_t nnz = want.size();
            const uint64_t rb = m->row_size * DTypeSize(m->dtype);
            Shape rs = m->shape;
            rs[0] = nnz;
            NDArray rows(rs, m->dtype);
            std::vector<uint64_t> keys, lens, out_lens;
            std::string req;
            for (size_t r = 0; r < m->ranges.size(); ++r) {
              const auto& rg = m->ranges[r];
              const int64_t a = std::lower_bound(id, id + nnz, rg.begin) - id;
              const int64_t b = std::lower_bound(id, id + nnz, rg.begin + rg.count) - id;
              if (a == b) continue;  // this server holds none of the rows
              keys.push_back(m->ps_keys[r]);
              const uint64_t n = static_cast<uint64_t>(b - a);
              req.append(reinterpret_cast<const char*>(&n), 8);
              for (int64_t j = a; j < b; ++j) {
                const int64_t local = id[j] - rg.begin;
                req.append(reinterpret_cast<const char*>(&local), 8);
              }
              lens.push_back(8 + n * 8);
              out_lens.push_back(n * rb);
            }
            KVWorker::Callback finish = [out, want, rows, done](std::exception_ptr e) {
              if (!e) {
                try {
                  RowSparseNDArray o = out;
                  o.Assign(RowSparseNDArray::FromRows(o.shape(), want, rows));
                } catch (...) {
                  e = std::current_exception();
                }
              }
              done(e);
            };
            if (keys.empty()) return finish(nullptr);                        // no rows asked for
            auto track = obs::Track("row_sparse_pull", std::to_string(key),  // [observe]
                                    rows.nbytes(), obs_t, std::move(finish));
            worker_->PushPull(
                keys, Frame::FromString(std::move(req)), lens, static_cast<char*>(rows.raw()),
                out_lens, dist::MakeCmd(Kind::kSparsePull, m->dtype), std::move(track), priority);
          });
    }
  }

  void SetUpdaterImpl(Updater) override {
    throw UsageError(
        "a custom updater cannot run on the servers of a dist store; use SetOptimizer "
        "(the servers run it), or PushPull the gradients and update locally");
  }

 private:
  void CheckAsyncHasOptimizer() const {
    if (async_ && !has_server_optimizer_)
      throw UsageError(
          "dist_async needs an optimizer on the servers: call SetOptimizer before "
          "pushing (in async mode every push is applied at once)");
  }

  enum class Round { kNone, kPush, kPull, kPushPull };

  // A call's arrays by key, without copying them (GroupByKey's order and checks): keys
  // ascending, each key's arrays as indices into the call's vector, in the order given.
  struct Grouped {
    struct Entry {
      int key;
      size_t first, count;  // idx[first, first + count)
    };
    std::vector<Entry> groups;
    std::vector<size_t> idx;

    const NDArray& At(size_t g, size_t j, const std::vector<NDArray>& arrays) const {
      return arrays[idx[groups[g].first + j]];
    }
    // Group g's arrays (copies of the handles).
    std::vector<NDArray> Arrays(size_t g, const std::vector<NDArray>& arrays) const {
      std::vector<NDArray> out;
      out.reserve(groups[g].count);
      for (size_t j = 0; j < groups[g].count; ++j) out.push_back(At(g, j, arrays));
      return out;
    }
  };
  static Grouped Group(const std::vector<int>& keys, const std::vector<NDArray>& arrays) {
    for (size_t i = 0; i < keys.size(); ++i)
      if (arrays[i].empty() && arrays[i].size() == 0 && arrays[i].shape().empty())
        throw InvalidArgument("empty NDArray passed for key " + std::to_string(keys[i]));
    Grouped g;
    g.idx.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) g.idx[i] = i;
    if (!std::is_sorted(keys.begin(), keys.end()))
      std::stable_sort(g.idx.begin(), g.idx.end(),
                       [&](size_t a, size_t b) { return keys[a] < keys[b]; });
    for (size_t j = 0; j < g.idx.size();) {
      size_t e = j + 1;
      while (e < g.idx.size() && keys[g.idx[e]] == keys[g.idx[j]]) ++e;
      g.groups.push_back({keys[g.idx[j]], j, e - j});
      j = e;
    }
    return g;
  }

  // Looks up and checks the keys of a call (their metas, by group); with strict rounds
  // (dist_sync) also checks and records the round structure. All checks pass before
  // anything is recorded.
  std::vector<KeyMeta*> Check(const Grouped& groups, const std::vector<NDArray>& arrays,
                              const char* op, const char* what, Round round = Round::kNone) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<KeyMeta*> metas;
    metas.reserve(groups.groups.size());
    KeyMeta* prev = nullptr;
    for (size_t g = 0; g < groups.groups.size(); ++g) {
      const int k = groups.groups[g].key;
      // Keys ascend: often the successor of the previous one.
      KeyMeta& m = prev && prev->next && prev->next->key == k ? *prev->next : Meta(k, op);
      prev = &m;
      if (m.next) __builtin_prefetch(m.next);
      if (m.sparse) throw DenseUseOfSparseKey(op, KeyName(k));
      for (size_t j = 0; j < groups.groups[g].count; ++j) {
        const NDArray& a = groups.At(g, j, arrays);
        if (a.dtype() != m.dtype || a.shape() != m.shape)
          CheckMatches(a, m.shape, m.dtype, what, KeyName(k));
      }
      metas.push_back(&m);
    }
    if (!options_.strict_rounds || async_ || round == Round::kNone) return metas;
    std::vector<std::pair<int, KeyMeta*>> out;
    for (size_t g = 0; g < metas.size(); ++g) out.emplace_back(groups.groups[g].key, metas[g]);
    for (auto& [k, m] : out) {
      const std::string rule =
          " (PSKV_STRICT_ROUNDS=1: in dist_sync each round of a key is one push or push-pull "
          "by every worker, then pulls of that round's value; pulls before the key's first "
          "push are free)";
      if (round == Round::kPull && m->pushes > 0 && m->pulled)
        throw UsageError("Pull of key " + KeyName(k) + " in round " +
                         std::to_string(m->pushes + 1) + ": this worker has not pushed key " +
                         KeyName(k) + " in round " + std::to_string(m->pushes + 1) +
                         " (it already pulled round " + std::to_string(m->pushes) +
                         "); the other workers' pushes of this round would be mixed with the "
                         "next round's" +
                         rule);
      if (round != Round::kPull && m->pushes > 0 && !m->pulled)
        throw UsageError(std::string(op) + " of key " + KeyName(k) + " in round " +
                         std::to_string(m->pushes) +
                         ": second push in one round (this worker "
                         "pushed key " +
                         KeyName(k) + " in round " + std::to_string(m->pushes) +
                         " and has not pulled it since)" + rule);
    }
    for (auto& [k, m] : out) {
      if (round == Round::kPull) {
        m->pulled = true;
      } else {
        ++m->pushes;
        m->pulled = round == Round::kPushPull;
      }
    }
    return metas;
  }

  static Frame FrameOf(const NDArray& a, size_t offset, size_t size) {
    Frame f;
    f.data = static_cast<const char*>(a.raw()) + offset;
    f.size = size;
    f.owner = std::make_shared<NDArray>(a);
    return f;
  }

  // Engine thread: local reduction (and compression) of one key's values.
  // Whether a push of `nvals` values of `m` may start on the calling thread (Engine):
  // only when preparing it is no work (one value, sent as it is) and small enough
  // that the transport's copy (shared memory) is cheap too.
  bool StartsHere(const KeyMeta& m, size_t nvals) const {
    return nvals == 1 && !compressor_ &&
           m.size * static_cast<int64_t>(DTypeSize(m.dtype)) <= options_.inline_start_bytes;
  }

  std::tuple<Frame, std::vector<uint64_t>, int> Prepare(KeyMeta& m,
                                                        const std::vector<NDArray>& vals) {
    NDArray merged;
    if (vals.size() == 1) {
      merged = vals[0];
    } else {
      if (m.merge.empty()) m.merge = NDArray(m.shape, m.dtype);
      reducer_.Sum(vals, &m.merge);
      merged = m.merge;
    }
    if (!compressor_)
      return {FrameOf(merged, 0, merged.nbytes()), m.lens, dist::MakeCmd(Kind::kDense, m.dtype)};
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
    return {f, m.comp_lens, dist::MakeCmd(Kind::kCompressed, m.dtype)};
  }

  // The fusion groups of a call's keys (see the header): 2+ keys each, ascending, of
  // one server and dtype, at most fusion_bytes of values; their keys go into *fused.
  // Groups are given by their index in `metas` (a call's keys, ascending); (*fused)[g]
  // is set for those fused.
  std::vector<std::vector<size_t>> FusionGroups(const std::vector<KeyMeta*>& metas,
                                                std::vector<char>* fused) const {
    std::vector<std::vector<size_t>> out;
    if (options_.fusion_key_bytes <= 0 || compressor_) return out;
    std::map<std::pair<int, int>, std::vector<size_t>> by;  // (server, dtype) -> groups
    for (size_t g = 0; g < metas.size(); ++g) {
      const KeyMeta* m = metas[g];
      if (m->slices.size() == 1 && m->lens[0] <= static_cast<uint64_t>(options_.fusion_key_bytes))
        by[{m->slices[0].server, static_cast<int>(m->dtype)}].push_back(g);
    }
    for (auto& [where, keys] : by) {
      std::vector<size_t> cur;
      uint64_t bytes = 0;
      auto flush = [&] {
        if (cur.size() >= 2) {
          for (size_t g : cur) (*fused)[g] = 1;
          out.push_back(cur);
        }
        cur.clear();
        bytes = 0;
      };
      for (size_t k : keys) {
        const uint64_t b = metas[k]->lens[0];
        if (!cur.empty() && bytes + b > static_cast<uint64_t>(options_.fusion_bytes)) flush();
        cur.push_back(k);
        bytes += b;
      }
      flush();
    }
    return out;
  }

  // One engine operation over all fusion groups of a call (`groups`: each a list of
  // group indices of the call): push (values: vg's groups of *vals), pull (into dg's
  // groups of *outs) or both. Each fusion group is one request to its server, issued
  // in turn (its values not packed: a gathered frame points at them); the answer is
  // scattered from the receive buffer straight into each key's first output. The operation
  // completes when every request has (with the first failure). One operation per call, not per
  // group: each costs its keys' bookkeeping, a wake-up of the engine's thread and a completion.
  void IssueFused(const std::vector<std::vector<size_t>>& groups,
                  const std::vector<KeyMeta*>& metas, const Grouped* vg,
                  const std::vector<NDArray>* vals, const Grouped* dg,
                  const std::vector<NDArray>* outs, int priority, const char* op) {
    if (groups.empty()) return;
    struct Part {
      int key;
      KeyMeta* m;
      uint64_t off;                               // in its fusion group's request
      size_t vals_first, nvals, dst_first, ndst;  // into Fused::vals and Fused::dst
    };
    struct Request {
      size_t first, count;  // parts[first, first + count)
      uint64_t total;       // value bytes
    };
    struct Fused {
      std::vector<Part> parts;
      std::vector<Request> reqs;
      std::vector<NDArray> vals, dst;  // held until the operation completes
      std::mutex mu;                   // guards the fields below
      size_t left = 0;                 // requests not answered yet
      std::exception_ptr error;
      Engine::Done done;
    };
    auto f = std::make_shared<Fused>();
    std::vector<int> ks;
    for (auto& members : groups) {
      Request req{f->parts.size(), members.size(), 0};
      for (size_t g : members) {
        Part p{dg ? dg->groups[g].key : vg->groups[g].key, metas[g], req.total, 0, 0, 0, 0};
        if (vals) {
          p.vals_first = f->vals.size();
          p.nvals = vg->groups[g].count;
          for (size_t j = 0; j < p.nvals; ++j) f->vals.push_back(vg->At(g, j, *vals));
        }
        if (outs) {
          p.dst_first = f->dst.size();
          p.ndst = dg->groups[g].count;
          for (size_t j = 0; j < p.ndst; ++j) f->dst.push_back(dg->At(g, j, *outs));
        }
        req.total += p.m->lens[0];
        ks.push_back(p.key);
        f->parts.push_back(p);
      }
      f->reqs.push_back(req);
    }
    const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
    const bool push = vals != nullptr, pull = outs != nullptr;
    engine_.Push(
        std::move(ks), priority, [this, f, obs_t, op, push, pull, priority](Engine::Done done) {
          if (obs::Enabled()) {  // [observe] every key as usual, and each request
            for (auto& p : f->parts)
              done = obs::Track(op, std::to_string(p.key), p.m->lens[0], obs_t, std::move(done));
            for (auto& r : f->reqs)
              done = obs::Track("fused", std::to_string(r.count) + " keys", r.total, obs_t,
                                std::move(done));
          }
          {
            std::lock_guard<std::mutex> lk(f->mu);
            f->done = std::move(done);
            f->left = f->reqs.size();
          }
          for (auto& r : f->reqs) {
            try {
              IssueFusedRequest(f, r, push, pull, priority);
            } catch (...) {
              FinishFused(f, std::current_exception());  // not issued: failed
            }
          }
        });
  }

  // One request of a fused operation (IssueFused): its keys' values gathered, its answer
  // scattered into their first outputs (then copied into their other outputs).
  template <typename Fused, typename Request>
  void IssueFusedRequest(const std::shared_ptr<Fused>& f, const Request& r, bool push, bool pull,
                         int priority) {
    const auto* parts = f->parts.data() + r.first;
    const size_t n = r.count;
    std::vector<uint64_t> ps_keys(n), lens(n);
    for (size_t i = 0; i < n; ++i) {
      ps_keys[i] = parts[i].m->ps_keys[0];
      lens[i] = parts[i].m->lens[0];
    }
    const int cmd = dist::MakeCmd(Kind::kDense, parts[0].m->dtype);
    Frame frame;
    if (push) {
      // A gathered frame (transport.h): one piece per key, where its value is. The
      // values are held by `f` until the transport has sent them, as a single key's
      // frame holds its array (FrameOf); the caller does not modify a pushed array
      // before the operation completed, and the server answers (completing it) only
      // after it received the whole message.
      std::vector<Frame::Piece> pieces(n);
      std::vector<std::shared_ptr<const void>> reduced;  // owners of reduced values
      for (size_t i = 0; i < n; ++i) {
        const auto& p = parts[i];
        // One value is sent as it is (a fused key is whole on one server, so its bytes
        // are the key's); several are reduced first (into the key's merge buffer, not
        // reused before this operation completed: the engine runs one per key).
        if (p.nvals == 1) {
          pieces[i] = {static_cast<const char*>(f->vals[p.vals_first].raw()), p.m->lens[0]};
        } else {
          const std::vector<NDArray> v(f->vals.begin() + static_cast<long>(p.vals_first),
                                       f->vals.begin() + static_cast<long>(p.vals_first + p.nvals));
          Frame pf = std::get<0>(Prepare(*p.m, v));
          pieces[i] = {pf.data, pf.size};
          reduced.push_back(std::move(pf.owner));
        }
      }
      std::shared_ptr<const void> owner = f;
      if (!reduced.empty())
        owner = std::make_shared<
            std::pair<std::shared_ptr<Fused>, std::vector<std::shared_ptr<const void>>>>(
            f, std::move(reduced));
      frame = Frame::Gather(std::move(pieces), std::move(owner));
    }
    if (!pull) {
      worker_->Push(
          ps_keys, frame, lens, cmd, [f](std::exception_ptr e) { FinishFused(f, e); }, priority);
      return;
    }
    std::vector<char*> dst(n);
    bool more = false;  // a key with several outputs
    for (size_t i = 0; i < n; ++i) {
      dst[i] = static_cast<char*>(f->dst[parts[i].dst_first].raw());
      more = more || parts[i].ndst > 1;
    }
    auto cb = [f, first = r.first, n, more](std::exception_ptr e) {
      if (!e && more) {
        try {  // the first output into the others
          for (size_t i = first; i < first + n; ++i) {
            const auto& p = f->parts[i];
            for (size_t j = 1; j < p.ndst; ++j) {
              NDArray o = f->dst[p.dst_first + j];
              o.CopyFrom(f->dst[p.dst_first]);
            }
          }
        } catch (...) {
          e = std::current_exception();
        }
      }
      FinishFused(f, e);
    };
    if (push)
      worker_->PushPull(ps_keys, frame, lens, std::move(dst), lens, cmd, std::move(cb), priority);
    else
      worker_->Pull(ps_keys, std::move(dst), lens, cmd, std::move(cb), priority);
  }

  // A request of a fused operation is done; the last one completes the operation.
  template <typename Fused>
  static void FinishFused(const std::shared_ptr<Fused>& f, std::exception_ptr e) {
    Engine::Done done;
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lk(f->mu);
      if (e && !f->error) f->error = e;
      if (--f->left > 0) return;
      done = std::move(f->done);
      error = f->error;
    }
    if (done) done(error);
  }

  // Completion that copies the first output into the others.
  static KVWorker::Callback Broadcast(const std::vector<NDArray>& dst, Engine::Done done) {
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

  // A command to the servers (all, or `to`); a timeout or dead peer breaks the store.
  std::vector<std::string> Command(int head, const std::string& body,
                                   const std::vector<int>& to = {}) {
    try {
      return worker_->Command(head, body, options_.op_timeout, to);
    } catch (...) {
      MarkBrokenIf(std::current_exception());
      throw;
    }
  }

  // The KV layer's wait for one request (see KVWorker::Await); marks the store
  // broken on a timeout.
  void Await(uint64_t ts, const std::shared_ptr<Completion>& done, const std::string& what) {
    try {
      worker_->Await(ts, done, options_.op_timeout, options_.stall_warning, what);
    } catch (...) {
      MarkBrokenIf(std::current_exception());
      throw;
    }
  }

  // A barrier of the workers, announced to the servers so a sync round that waits
  // for this worker's push while it is here is reported as a deadlock (not a hang).
  void WorkerBarrier() {
    Command(dist::kBarrierState, payload::EncodeBarrierState(true));
    try {
      node_->Barrier(kWorkerGroup, options_.op_timeout);
    } catch (...) {
      MarkBrokenIf(std::current_exception());
      throw;
    }
    Command(dist::kBarrierState, payload::EncodeBarrierState(false));
  }

  // Logs (or, `final`, returns) what this worker waits for: its pending requests and
  // the servers' open sync rounds. Returns "" when logging. Throws TimeoutError when a
  // server reports a round of a key this wait covers (`keys`, null = all) as waiting
  // for a worker that is in Barrier(): this worker is blocked on it, so that barrier
  // can never complete.
  std::string Stalled(bool final, std::chrono::seconds waited, const std::vector<int>* keys) {
    std::string text, deadlock;
    for (auto& l : worker_->DescribePending(std::chrono::milliseconds(0))) text += l + "; ";
    try {
      auto status = worker_->Command(
          dist::kRoundStatus, "",
          std::min<std::chrono::milliseconds>(options_.op_timeout, std::chrono::seconds(10)));
      for (auto& body : status) {
        const payload::RoundStatus s = payload::DecodeRoundStatus(body);
        for (auto& d : s.deadlocks) {
          // Only rounds of the keys this wait covers (this worker is blocked on them).
          const bool covered =
              !keys || (dist::StoreOf(d.key) == store_id_ &&
                        std::find(keys->begin(), keys->end(), dist::KeyOf(d.key)) != keys->end());
          if (covered && deadlock.empty()) deadlock = d.message;
        }
        for (auto& line : s.lines) text += line + "; ";
      }
    } catch (const std::exception& e) {
      text += std::string("(no round status from the servers: ") + e.what() + ")";
    }
    if (!deadlock.empty()) {
      const std::string what = node_->Tag() + " waited " + std::to_string(waited.count()) +
                               " s in Wait: deadlock: " + deadlock;
      PSKV_ERROR(what);
      MarkBroken(what);
      throw TimeoutError(what);
    }
    if (final) return text.empty() ? "nothing pending on the servers" : "pending: " + text;
    PSKV_WARN("waited " << waited.count() << " s: " << (text.empty() ? "(nothing pending)" : text));
    return {};
  }

  void MarkBroken(const std::string& why) {
    std::lock_guard<std::mutex> lk(broken_mu_);
    if (!broken_) broken_reason_ = why;
    broken_ = true;
  }
  // Timeouts and dead peers break the store; usage errors do not.
  void MarkBrokenIf(std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const TimeoutError& t) {
      MarkBroken(t.what());
    } catch (const NodeFailure& f) {
      MarkBroken(f.what());
    } catch (...) {
    }
  }

  const bool async_;
  std::mutex broken_mu_;  // guards broken_reason_ (calls may come from several threads)
  std::atomic<bool> broken_{false};
  std::string broken_reason_;
  bool has_server_optimizer_ = false;
  Reducer reducer_;
  std::unique_ptr<GradientCompressor> compressor_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<KeyMeta>> keys_;
  std::shared_ptr<SharedNode> shared_;
  int store_id_ = 0;
  Node* node_ = nullptr;  // shared_'s
  KVWorker* worker_ = nullptr;
  Engine engine_;
};

}  // namespace

std::optional<int> RunServerRoleIfAsked(const Options& options) {
  if (!options.role_set || options.role == Role::kWorker) return std::nullopt;
  options.ValidateForDistributed();
  return RunServerOrScheduler(options);
}

std::optional<int> RunServerRoleIfAsked() {
  return RunServerRoleIfAsked(Options::FromEnv());
}

std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type, const Options& options) {
  if (!options.role_set)
    throw ConfigError("kvstore type '" + type +
                      "' needs DMLC_ROLE (scheduler, server or worker) and "
                      "the other DMLC_* variables; start the job with pskv-launch");
  if (options.role != Role::kWorker)
    throw UsageError("KVStore::Create('" + type +
                     "') in a process with DMLC_ROLE=" + RoleName(options.role) +
                     ": servers and the scheduler do not create stores. Start them with "
                     "pskv-server (pskv-launch does), or begin main with `if (auto rc = "
                     "pskv::RunServerRoleIfAsked()) return *rc;`");
  options.ValidateForDistributed();
  if (!options.log_levels.empty()) SetLogLevels(options.log_levels);  // [observe] PSKV_LOG_LEVEL
  obs::Configure(options, "worker");  // [observe] PSKV_TIMELINE, PSKV_METRICS_PORT
  return std::make_unique<KVStoreDist>(type, options);
}

}  // namespace pskv
