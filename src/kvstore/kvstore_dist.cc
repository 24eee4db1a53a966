// KVStoreDist: the worker side of dist_sync / dist_async (+ _device variants).
//
// Per key: values are reduced locally (CPU, also for *_device on this CPU-only
// build), then sent to the servers holding the key's slices; pulls land in the
// first output and are copied to the others. Every key's operations run in order
// on the engine; different keys overlap, higher priority first.
#include "kvstore/kvstore_dist.h"

#include <cstring>
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
#include "ps/kv_app.h"
#include "pskv/error.h"

namespace pskv {

namespace {

using dist::Kind;

// One node per worker process, shared by every dist store the process creates
// (trainer branch: MXNet allowed several stores per process, e.g. one per Trainer
// of a GAN). The stores get ids 0, 1, ... in creation order — every worker must
// create them in the same order — and their keys travel in separate namespaces
// (dist::WireKey). The last store to close ends the node.
struct SharedNode {
  Options options;
  std::mutex mu;              // engines
  std::set<Engine*> engines;  // poisoned when a peer fails
  bool async = false;
  int next_store = 0;          // under g_shared_mu
  std::unique_ptr<Node> node;  // destroyed before the members above
  std::unique_ptr<KVWorker> worker;
  bool started = false;  // Start() succeeded: the node must say goodbye

  ~SharedNode() {
    if (!started) return;
    if (node->failure()) {
      node->Abort("the job had failed");
      return;
    }
    try {
      // Tell the servers no more pushes come from here (so a sync round that waits
      // for this worker fails with a message instead of hanging), then the final
      // barrier over all nodes.
      worker->Command(dist::kWorkerDone, "", options.op_timeout);
      node->Finalize(options.op_timeout);
    } catch (const std::exception& e) {
      PSKV_ERROR("closing the dist store failed: " << e.what());
      node->Abort(e.what());
    }
  }
};

std::mutex g_shared_mu;
std::weak_ptr<SharedNode> g_shared;

class KVStoreDist final : public KVStore {
 public:
  KVStoreDist(std::string type, Options options)
      : KVStore(std::move(type), std::move(options)),
        async_(type_.find("async") != std::string::npos),
        reducer_(options_.bigarray_bound, options_.reduction_threads) {
    {
      std::lock_guard<std::mutex> lk(g_shared_mu);
      shared_ = g_shared.lock();
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
        sn->node->Start();
        sn->started = true;
        SetLogName(sn->node->Tag());
        shared_ = sn;
        g_shared = sn;
      } else if (shared_->async != async_) {
        throw UsageError("the dist stores of one process must all be sync or all async ('" + type_ +
                         "' after a " + (shared_->async ? "async" : "sync") + " store)");
      }
      store_id_ = shared_->next_store++;
      if (store_id_ >= dist::kMaxStores) throw UsageError("too many dist stores in one process");
    }
    node_ = shared_->node.get();
    worker_ = shared_->worker.get();
    if (node_->rank() == 0 && store_id_ == 0)
      worker_->Command(dist::kSetMode, async_ ? "async" : "sync", options_.op_timeout);
    node_->Barrier(kWorkerGroup, options_.op_timeout);
    // Last, so a constructor that threw leaves no engine behind in shared_.
    std::lock_guard<std::mutex> lk(shared_->mu);
    shared_->engines.insert(&engine_);
    if (auto failed = node_->failure()) engine_.Poison(failed);
  }

  ~KVStoreDist() override {
    try {
      engine_.Wait(nullptr, options_.op_timeout);
    } catch (const std::exception& e) {
      PSKV_WARN("operations failed before the store was closed: " << e.what());
    }
    engine_.Shutdown(std::chrono::seconds(1));
    {
      std::lock_guard<std::mutex> lk(shared_->mu);
      shared_->engines.erase(&engine_);
    }
    std::lock_guard<std::mutex> lk(g_shared_mu);
    shared_.reset();  // the last store of the process ends the node
  }

  int Rank() const override { return node_->rank(); }
  int NumWorkers() const override { return node_->num_workers(); }
  void Barrier() override { node_->Barrier(kWorkerGroup, options_.op_timeout); }

  void SetOptimizer(const OptimizerConfig& config) override {
    config.Validate();
    if (node_->rank() == 0)
      worker_->Command(dist::StoreCommand(dist::kSetOptimizer, store_id_), config.Serialize(),
                       options_.op_timeout);
    has_server_optimizer_ = true;
    node_->Barrier(kWorkerGroup, options_.op_timeout);
  }

  void SetGradientCompression(const CompressionConfig& config) override {
    config.Validate();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!keys_.empty())
        throw UsageError("SetGradientCompression must be called before the first Init");
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s,%.9g", config.type.c_str(),
                  static_cast<double>(config.threshold));
    if (node_->rank() == 0) worker_->Command(dist::kSetCompression, buf, options_.op_timeout);
    compressor_ = config.active() ? std::make_unique<GradientCompressor>(config) : nullptr;
    node_->Barrier(kWorkerGroup, options_.op_timeout);
  }

  void SaveOptimizerStates(const std::string& fname, bool dump_optimizer) override {
    WaitAll();
    auto blobs =
        worker_->Command(dist::StoreCommand(dist::kSaveStates, store_id_), "", options_.op_timeout);
    if (node_->rank() != 0) return;  // rank 0 writes the file
    // dump_optimizer (trainer branch): each server then adopts the saved config on load.
    if (dump_optimizer)
      for (auto& b : blobs) MarkStatesDumped(&b);
    ByteWriter w;
    w.PutBytes("PSKVDST1", 8);
    w.Put<uint32_t>(static_cast<uint32_t>(blobs.size()));
    for (auto& b : blobs) w.PutString(b);
    std::string data = w.Take();
    FILE* f = std::fopen(fname.c_str(), "wb");
    if (!f || std::fwrite(data.data(), 1, data.size(), f) != data.size()) {
      if (f) std::fclose(f);
      throw IOError("cannot write optimizer states to '" + fname + "'");
    }
    std::fclose(f);
  }

  void LoadOptimizerStates(const std::string& fname) override {
    WaitAll();
    if (node_->rank() == 0) {
      FILE* f = std::fopen(fname.c_str(), "rb");
      if (!f) throw IOError("cannot open optimizer states file '" + fname + "'");
      std::string data;
      char buf[1 << 16];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
      std::fclose(f);
      if (data.size() < 8 || data.compare(0, 8, "PSKVDST1") != 0)
        throw IOError("'" + fname + "' is not a pskv dist optimizer-states file");
      worker_->Command(dist::StoreCommand(dist::kLoadStates, store_id_), data.substr(8),
                       options_.op_timeout);
    }
    node_->Barrier(kWorkerGroup, options_.op_timeout);
  }

 protected:
  struct KeyMeta {
    Shape shape;
    DType dtype;
    int64_t size;
    std::vector<dist::Slice> slices;
    NDArray merge;     // local reduction buffer (allocated lazily)
    NDArray residual;  // compression residual (float32)
    std::vector<uint64_t> ps_keys, lens, comp_lens;
  };

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
        for (auto& s :
             dist::PlaceKey(keys[i], m->size, node_->num_servers(), options_.bigarray_bound)) {
          if (s.len == 0) continue;
          m->slices.push_back(s);
          m->ps_keys.push_back(
              dist::PsKey(dist::WireKey(store_id_, keys[i]), s.server, node_->num_servers()));
          m->lens.push_back(static_cast<uint64_t>(s.len) * DTypeSize(m->dtype));
          if (compressor_)
            m->comp_lens.push_back(static_cast<uint64_t>(compressor_->CompressedBytes(s.len)));
        }
        if (compressor_) m->residual = NDArray({m->size}, DType::kFloat32);
        created.emplace_back(keys[i], m.get());
        keys_.emplace(keys[i], std::move(m));
      }
    }
    std::exception_ptr err;
    if (node_->rank() == 0) {
      // Rank 0's values initialise the servers; the others' are only checked.
      for (size_t i = 0; i < keys.size(); ++i) {
        KeyMeta& m = *created[i].second;
        NDArray v = values[i].Clone();
        auto frame = FrameOf(v, 0, v.nbytes());
        try {
          Sync([&](KVWorker::Callback cb) {
            worker_->Push(m.ps_keys, frame, m.lens, dist::MakeCmd(Kind::kInit, m.dtype), cb);
          });
        } catch (...) {
          if (!err) err = std::current_exception();
        }
      }
    }
    if (!err) node_->Barrier(kWorkerGroup, options_.op_timeout);
    if (err) std::rethrow_exception(err);
  }

  void OnStringKeyCreated(const std::string& name, int id) override {
    // Every worker reports its id assignment; the servers compare (spec 2.2 MUST).
    worker_->Command(dist::kCheckStringKeys,
                     std::to_string(dist::WireKey(store_id_, id)) + "\t" + name,
                     options_.op_timeout);
  }

  void PushImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                int priority) override {
    CheckAsyncHasOptimizer();
    auto groups = GroupByKey(keys, values);
    auto metas = Check(groups, "Push", "pushed value");
    for (auto& [k, vals] : groups) {
      KeyMeta* m = metas.at(k);
      const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
      engine_.Push({k}, priority, [this, k, obs_t, m, vals = vals, priority](Engine::Done done) {
        auto [frame, lens, cmd] = Prepare(*m, vals);
        done = obs::Track("push", std::to_string(k), frame.size, obs_t, std::move(done));  // [observe]
        worker_->Push(m->ps_keys, frame, lens, cmd, done, priority);
      });
    }
  }

  void PullImpl(const std::vector<int>& keys, const std::vector<NDArray>& outs,
                int priority) override {
    auto groups = GroupByKey(keys, outs);
    auto metas = Check(groups, "Pull", "pull output");
    for (auto& [k, dst] : groups) {
      KeyMeta* m = metas.at(k);
      const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
      engine_.Push({k}, priority, [this, k, obs_t, m, dst = dst, priority](Engine::Done done) {
        NDArray first = dst[0];
        done = obs::Track("pull", std::to_string(k), first.nbytes(), obs_t, std::move(done));  // [observe]
        worker_->Pull(m->ps_keys, static_cast<char*>(first.raw()), m->lens,
                      dist::MakeCmd(Kind::kDense, m->dtype), Broadcast(dst, std::move(done)),
                      priority);
      });
    }
  }

  void PushPullImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                    const std::vector<int>& out_keys, const std::vector<NDArray>& outs,
                    int priority) override {
    auto pushes = GroupByKey(keys, values);
    auto pulls = GroupByKey(out_keys, outs);
    for (auto& [k, v] : pushes)
      if (!pulls.count(k))
        throw InvalidArgument("PushPull: key " + KeyName(k) +
                              " is pushed but not pulled; the push and pull keys must be the same");
    for (auto& [k, v] : pulls)
      if (!pushes.count(k))
        throw InvalidArgument("PushPull: key " + KeyName(k) +
                              " is pulled but not pushed; the push and pull keys must be the same");
    CheckAsyncHasOptimizer();
    auto metas = Check(pushes, "PushPull", "pushed value");
    Check(pulls, "PushPull", "pull output");
    for (auto& [k, vals] : pushes) {
      KeyMeta* m = metas.at(k);
      const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
      engine_.Push({k}, priority,
                   [this, k, obs_t, m, vals = vals, dst = pulls.at(k), priority](Engine::Done done) {
                     auto [frame, lens, cmd] = Prepare(*m, vals);
                     done = obs::Track("pushpull", std::to_string(k), frame.size, obs_t,  // [observe]
                                       std::move(done));
                     // The first output may be one of the inputs: the values were already read
                     // (reduced or referenced by `frame`); if the frame aliases the output,
                     // send a copy so the answer cannot overwrite bytes still being sent.
                     NDArray first = dst[0];
                     if (frame.data >= static_cast<const char*>(first.raw()) &&
                         frame.data < static_cast<const char*>(first.raw()) + first.nbytes())
                       frame = Frame::Copy(frame.data, frame.size);
                     worker_->PushPull(m->ps_keys, frame, lens, static_cast<char*>(first.raw()),
                                       m->lens, cmd, Broadcast(dst, std::move(done)), priority);
                   });
    }
  }

  void WaitImpl(const std::vector<int>* keys, std::chrono::milliseconds timeout) override {
    engine_.Wait(keys, timeout);
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

  template <typename Groups>
  std::map<int, KeyMeta*> Check(const Groups& groups, const char* op, const char* what) {
    std::lock_guard<std::mutex> lk(mu_);
    std::map<int, KeyMeta*> out;
    for (auto& [k, arrays] : groups) {
      KeyMeta& m = Meta(k, op);
      for (auto& a : arrays) CheckMatches(a, m.shape, m.dtype, what, KeyName(k));
      out[k] = &m;
    }
    return out;
  }

  static Frame FrameOf(const NDArray& a, size_t offset, size_t size) {
    Frame f;
    f.data = static_cast<const char*>(a.raw()) + offset;
    f.size = size;
    f.owner = std::make_shared<NDArray>(a);
    return f;
  }

  // Engine thread: local reduction (and compression) of one key's values.
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

  void Sync(const std::function<void(KVWorker::Callback)>& op) {
    std::mutex m;
    std::condition_variable cv;
    bool fin = false;
    std::exception_ptr err;
    op([&](std::exception_ptr e) {
      std::lock_guard<std::mutex> lk(m);
      err = e;
      fin = true;
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lk(m);
    if (!cv.wait_for(lk, options_.op_timeout, [&] { return fin; }))
      throw TimeoutError("dist KVStore: no answer from the servers within " +
                         std::to_string(options_.op_timeout.count() / 1000) + " s (PSKV_TIMEOUT)");
    if (err) std::rethrow_exception(err);
  }

  const bool async_;
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
    throw UsageError("KVStore::Create('" + type + "') in a process with DMLC_ROLE=" +
                     RoleName(options.role) +
                     ": servers and the scheduler do not create stores. Start them with "
                     "pskv-server (pskv-launch does), or begin main with `if (auto rc = "
                     "pskv::RunServerRoleIfAsked()) return *rc;`");
  options.ValidateForDistributed();
  if (!options.log_levels.empty()) SetLogLevels(options.log_levels);  // [observe] PSKV_LOG_LEVEL
  obs::Configure(options, "worker");  // [observe] PSKV_TIMELINE, PSKV_METRICS_PORT
  return std::make_unique<KVStoreDist>(type, options);
}

}  // namespace pskv
