#include "kvstore/dist_server.h"

#include <cstring>
#include <sstream>

#include "common/byte_io.h"
#include "common/logging.h"
#include "common/observe.h"  // [observe]
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
      reducer_(node->options().bigarray_bound, node->options().reduction_threads) {}

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
  obs::StepScope obs_step("reply", keys.size() == 1 ? dist::KeyOf(keys[0].first) : -1, obs_bytes,
                          obs::Enabled() ? WorkerName(req.sender) : std::string(), "out");
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

void DistServer::FailRound(KeyState& st, const std::string& why) {
  for (auto& r : st.waiting) {
    try {
      server_.RespondError(r, ErrorKind::kUsage, why);
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": " << e.what());
    }
  }
  st.waiting.clear();
  st.pushed.clear();
}

void DistServer::Merge(KeyState& st, const KVRequest& req, uint64_t off, uint64_t len) {
  const Message& m = req.msg;
  const bool first = st.pushed.empty();
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
  const Message& m = req.msg;
  const int me = node_->rank(), S = node_->num_servers();
  const uint64_t base = KVWorker::ServerRange(me, S).first;
  const Kind kind = dist::CmdKind(req.cmd);
  const int dt = dist::CmdDType(req.cmd);
  auto fail = [&](ErrorKind k, const std::string& msg) { srv->RespondError(req, k, msg); };
  if (!IsValidDType(dt) ||
      (kind != Kind::kDense && kind != Kind::kInit && kind != Kind::kCompressed))
    return fail(ErrorKind::kInvalid,
                "malformed data request (cmd " + std::to_string(req.cmd) + ")");
  const DType dtype = static_cast<DType>(dt);
  const std::string me_name = node_->Tag();

  std::vector<std::pair<int64_t, KeyState*>> answer;
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
    auto it = store_.find(key);
    if (kind == Kind::kInit) {
      if (it != store_.end())
        return fail(ErrorKind::kKey, "duplicate init of key " + std::to_string(key));
      if (len % DTypeSize(dtype))
        return fail(ErrorKind::kShape, "init value size is not a whole number of elements");
      KeyState st;
      st.wire_key = key;
      st.value = NDArray({static_cast<int64_t>(len / DTypeSize(dtype))}, dtype);
      m.CopyVals(key_off, len, static_cast<char*>(st.value.raw()));
      store_.emplace(key, std::move(st));
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
      const uint64_t want =
          kind == Kind::kCompressed
              ? static_cast<uint64_t>(compressor_ ? compressor_->CompressedBytes(st.value.size())
                                                  : 0)
              : st.value.nbytes();
      if (kind == Kind::kCompressed && !compressor_)
        return fail(ErrorKind::kUsage,
                    "a compressed push arrived but compression is not configured");
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
        {
          obs::StepScope obs_step("merge", dist::KeyOf(key), len,  // [observe]
                                  obs::Enabled() ? WorkerName(req.sender) : std::string(), "in");
          Merge(st, req, key_off, len);
        }
        st.pushed.insert(req.sender);
        st.waiting.push_back(std::move(req));
        if (static_cast<int>(st.pushed.size()) == node_->num_workers()) {
          try {
            obs::StepScope obs_step("update", dist::KeyOf(key), st.value.nbytes());  // [observe]
            ApplyRound(key, st);
          } catch (const std::exception& e) {
            FailRound(st, std::string("update failed: ") + e.what());
            return;
          }
          std::vector<KVRequest> waiting = std::move(st.waiting);
          st.waiting.clear();
          st.pushed.clear();
          for (auto& r : waiting) Reply(srv, r, {{key, &st}});
        }
        return;  // answered when the round completes
      }
      // async: apply at once
      Optimizer* opt = OptimizerOf(key);
      if (!opt)
        return fail(ErrorKind::kUsage,
                    "Updater needs to be set for async mode: call SetOptimizer "
                    "on the dist_async store before pushing");
      Detach(st);
      NDArray grad;
      std::string scratch;
      const char* data = m.Contiguous(key_off, len, &scratch);
      if (kind == Kind::kCompressed) {
        grad = NDArray({st.value.size()}, DType::kFloat32);
        compressor_->Dequantize(reinterpret_cast<const uint8_t*>(data), grad.data<float>(),
                                st.value.size());
      } else {
        grad = View(data, len, dtype);
      }
      try {
        obs::StepScope obs_step("update", dist::KeyOf(key), len,  // [observe]
                                obs::Enabled() ? WorkerName(req.sender) : std::string(), "in");
        opt->Update(dist::KeyOf(key), grad, &st.value);
      } catch (const std::exception& e) {
        return fail(KindOf(e), std::string("update failed: ") + e.what());
      }
      ++st.rounds;
    }
    answer.emplace_back(key, &st);
  }
  Reply(srv, req, answer);
}

std::string DistServer::Command(int sender, int head, const std::string& body) {
  const int store = head >> 8;  // the worker-side store a command concerns
  head &= 0xff;
  // That store's optimizer (named as the former member, which keeps this diff small).
  std::unique_ptr<Optimizer>& optimizer_ = optimizers_[store];
  switch (head) {
    case dist::kSetMode:
      if (body != "sync" && body != "async") throw InvalidArgument("bad mode '" + body + "'");
      sync_ = body == "sync";
      return {};
    case dist::kSetOptimizer:
      optimizer_ = std::make_unique<Optimizer>(OptimizerConfig::Deserialize(body));
      if (node_->options().verbose >= 1)
        PSKV_INFO(node_->Tag() << ": optimizer " << optimizer_->config().type);
      return {};
    case dist::kSetCompression: {
      auto comma = body.find(',');
      if (comma == std::string::npos)
        throw InvalidArgument("bad compression command '" + body + "'");
      CompressionConfig c;
      c.type = body.substr(0, comma);
      c.threshold = std::stof(body.substr(comma + 1));
      if (!store_.empty())
        throw UsageError("SetGradientCompression must be called before the first Init");
      compressor_ = c.active() ? std::make_unique<GradientCompressor>(c) : nullptr;
      return {};
    }
    case dist::kWorkerDone:
      done_workers_.insert(sender);
      for (auto& [key, st] : store_)
        if (!st.waiting.empty() && !st.pushed.count(sender))
          FailRound(st,
                    "key " + std::to_string(key) + ": " + WorkerName(sender) +
                        " finished the job without pushing round " + std::to_string(st.rounds + 1) +
                        " while other workers did; in sync mode every worker must push every key "
                        "equally often (give every worker the same number of batches)");
      return {};
    case dist::kSaveStates:
      if (!optimizer_)
        throw UsageError("no optimizer is set on the servers (call SetOptimizer first)");
      return optimizer_->SaveStates();
    case dist::kLoadStates: {
      if (!optimizer_)
        throw UsageError("no optimizer is set on the servers (call SetOptimizer first)");
      ByteReader r(body.data(), body.size(), "optimizer states");
      uint32_t n = r.Get<uint32_t>();
      if (static_cast<int>(n) != node_->num_servers())
        throw UsageError("the optimizer states were saved from " + std::to_string(n) +
                         " servers but this job has " + std::to_string(node_->num_servers()) +
                         "; restore with the same number of servers");
      std::string mine;
      for (uint32_t i = 0; i < n; ++i) {
        std::string s = r.GetString(UINT32_MAX);
        if (static_cast<int>(i) == node_->rank()) mine = std::move(s);
      }
      optimizer_->LoadStates(mine);
      return {};
    }
    case dist::kCheckStringKeys: {
      std::istringstream is(body);
      std::string line;
      while (std::getline(is, line)) {
        auto tab = line.find('\t');
        if (tab == std::string::npos) throw InvalidArgument("bad string-key report");
        int64_t id = std::stoll(line.substr(0, tab));  // a wire id
        std::string name = line.substr(tab + 1);
        auto it = string_keys_.find(id);
        if (it == string_keys_.end()) {
          string_keys_[id] = name;
          string_key_source_[id] = sender;
        } else if (it->second != name) {
          throw KeyError("string keys were initialised in a different order: " +
                         WorkerName(sender) + " gave id " + std::to_string(id) + " to '" + name +
                         "' but " + WorkerName(string_key_source_[id]) + " gave it to '" +
                         it->second + "'; every worker must init string keys in the same order");
        }
      }
      return {};
    }
    case dist::kHasOptimizer:
      return optimizer_ ? "1" : "0";
    default:
      throw InvalidArgument("unknown command " + std::to_string(head));
  }
}

int RunServerOrScheduler(const Options& options) {
  const char* role = options.role == Role::kServer ? "server" : "scheduler";
  SetLogName(role);
  try {
    if (!options.log_levels.empty()) SetLogLevels(options.log_levels);  // [observe] PSKV_LOG_LEVEL
    if (options.role == Role::kServer) obs::Configure(options, role);  // [observe]
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
