// The dist stores' dynamic embedding tables, worker side (embedding_worker.h).
#include "kvstore/distributed/worker/embedding_worker.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <type_traits>

#include "common/crc32c.h"
#include "embedding/batch.h"
#include "embedding/local_table.h"
#include "embedding/row_cache.h"
#include "embedding/stats_fields.h"
#include "embedding/table.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/embedding_admin_codec.h"
#include "kvstore/distributed/wire/embedding_codec.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/distributed/worker/collective_init.h"
#include "kvstore/distributed/worker/store.h"
#include "pskv/error.h"

namespace pskv::dist {

namespace {

namespace ew = embedding_wire;
namespace ea = embedding_admin;
using embedding::Distinct;

Frame FrameOf(std::shared_ptr<std::string> buf) {
  Frame f;
  f.data = buf->data();
  f.size = buf->size();
  f.owner = std::move(buf);
  return f;
}

class DistTable final : public EmbeddingTable {
 public:
  DistTable(DistWorkerStore& store, int key, const EmbeddingConfig& cfg,
            const EmbeddingCacheConfig& cache)
      : EmbeddingTable(key, cfg),
        store_(store),
        link_(store.link()),
        servers_(static_cast<uint32_t>(link_.node()->num_servers())),
        what_("embedding table " + std::to_string(key) + " ('" + cfg.name + "')") {
    const int64_t wire = WireKey(link_.store_id(), key);
    for (uint32_t s = 0; s < servers_; ++s)
      ps_keys_.push_back(PsKey(wire, static_cast<int>(s), static_cast<int>(servers_)));
    if (cache.capacity > 0) {
      embedding::RowCacheConfig c;
      c.width = cfg.width;
      c.capacity = cache.capacity;
      c.staleness = cache.staleness;
      c.aging_steps = cache.aging_steps;
      cache_ = std::make_unique<embedding::RowCache>(c);  // InvalidArgument if bad
    } else if (cache.capacity < 0 || cache.staleness < 0) {
      throw InvalidArgument(what_ + ": a cache capacity and staleness must be >= 0");
    }
  }

  void Create() {
    const std::string bytes = payload::EncodeEmbeddingTable(config());
    payload::InitReport report;
    report.entries.push_back({WireKey(link_.store_id(), key()), config().name, "float32 embedding",
                              "(*, " + std::to_string(config().width) + ") config " +
                                  std::to_string(Crc32c(bytes.data(), bytes.size()))});
    CollectiveInit(link_, report, [&](size_t) {
      auto buf = std::make_shared<std::string>();
      std::vector<uint64_t> lens;
      for (uint32_t s = 0; s < servers_; ++s) {
        buf->append(bytes);
        lens.push_back(bytes.size());
      }
      auto done = std::make_shared<Completion>();
      const uint64_t ts = link_.worker()->Push(ps_keys_, FrameOf(std::move(buf)), lens,
                                               MakeCmd(Kind::kEmbeddingCreate, DType::kFloat32),
                                               Completion::Callback(done));
      Await(ts, done, "create of " + what_, {});
    });
  }

  NDArray Pull(const NDArray& ids, std::chrono::milliseconds timeout) override {
    return Pull(ids, nullptr, timeout);
  }
  NDArray Pull(const NDArray& ids, NDArray* versions, std::chrono::milliseconds timeout) override;
  void Push(const NDArray& ids, const NDArray& grads, std::chrono::milliseconds timeout) override;
  EmbeddingStats Stats(std::chrono::milliseconds timeout) override;
  uint64_t Save(const std::string& dir, EmbeddingSaveKind kind,
                std::chrono::milliseconds timeout) override {
    const auto op = kind == EmbeddingSaveKind::kFull ? ea::Op::kSaveFull : ea::Op::kSaveDelta;
    return Collective(op, dir, "save of " + what_ + " into '" + dir + "'", timeout);
  }
  void Restore(const std::string& dir, std::chrono::milliseconds timeout) override {
    if (cache_) cache_ = std::make_unique<embedding::RowCache>(cache_->config());
    Collective(ea::Op::kRestore, dir, "restore of " + what_ + " from '" + dir + "'", timeout);
  }
  uint64_t Export(const std::string& dir, std::chrono::milliseconds timeout) override {
    return Collective(ea::Op::kExport, dir, "export of " + what_ + " into '" + dir + "'", timeout);
  }

 private:
  void Await(uint64_t ts, const std::shared_ptr<Completion>& done, const std::string& what,
             std::chrono::milliseconds timeout) {
    if (timeout.count() <= 0) return link_.Await(ts, done, what);
    try {
      link_.worker()->Await(ts, done, timeout, link_.options().stall_warning, what);
    } catch (...) {
      link_.MarkBrokenIf(std::current_exception());
      throw;
    }
  }
  /// Per server, the indices (into ids) of the ids it holds, in order.
  std::vector<std::vector<uint32_t>> ByServer(const std::vector<uint64_t>& ids) const {
    std::vector<std::vector<uint32_t>> out(servers_);
    for (size_t i = 0; i < ids.size(); ++i)
      out[EmbeddingShardOf(ids[i], servers_)].push_back(static_cast<uint32_t>(i));
    return out;
  }
  /// The rows (ids.size() * width) and versions of distinct ids, from their servers.
  void Fetch(const std::vector<uint64_t>& ids, float* rows, int64_t* versions,
             std::chrono::milliseconds timeout);
  /// One admin request (embedding_admin_codec.h) to every server; the replies.
  std::vector<std::array<int64_t, ea::kReplyWords>> AskAll(const ea::Request& r,
                                                           const std::string& what,
                                                           std::chrono::milliseconds timeout);
  /// Save, Restore or Export: rank 0 sends `op` between two barriers, the other
  /// workers ask the servers for its outcome (so all report the same error). Returns
  /// the bytes written by the servers.
  uint64_t Collective(ea::Op op, const std::string& dir, const std::string& what,
                      std::chrono::milliseconds timeout);

  DistWorkerStore& store_;
  ServerLink& link_;
  const uint32_t servers_;
  const std::string what_;
  std::vector<uint64_t> ps_keys_;               // per server
  std::unique_ptr<embedding::RowCache> cache_;  // null: none
  int64_t clock_ = 0;                           // pushes applied: the cache's step
  uint64_t ticket_ = 0;                         // collective checkpoint calls so far
  EmbeddingStats mine_;                         // the worker fields
};

void DistTable::Fetch(const std::vector<uint64_t>& ids, float* rows, int64_t* versions,
                      std::chrono::milliseconds timeout) {
  const auto width = static_cast<uint64_t>(config().width);
  const auto parts = ByServer(ids);
  std::vector<uint64_t> keys, lens, out_lens;
  auto req = std::make_shared<std::string>();
  std::vector<uint64_t> mine;
  for (uint32_t s = 0; s < servers_; ++s) {
    if (parts[s].empty()) continue;
    mine.clear();
    for (uint32_t u : parts[s]) mine.push_back(ids[u]);
    ew::AppendPull(req.get(), mine.data(), mine.size());
    keys.push_back(ps_keys_[s]);
    lens.push_back(ew::PullBytes(mine.size()));
    out_lens.push_back(ew::PullReplyBytes(mine.size(), width));
  }
  uint64_t total = 0;
  for (uint64_t l : out_lens) total += l;
  ++mine_.pulls;
  mine_.pulled_ids += static_cast<int64_t>(ids.size());
  mine_.pull_bytes_sent += req->size();
  mine_.pull_bytes_received += total;
  if (keys.empty()) return;
  std::string reply(total, '\0');
  auto done = std::make_shared<Completion>();
  const uint64_t ts = link_.worker()->PushPull(
      keys, FrameOf(std::move(req)), lens, reply.data(), out_lens,
      MakeCmd(Kind::kEmbeddingPull, DType::kFloat32), Completion::Callback(done));
  Await(ts, done, "pull of " + what_, timeout);
  // Server part k holds m ids' rows, then their versions.
  const char* p = reply.data();
  for (uint32_t s = 0; s < servers_; ++s) {
    const size_t m = parts[s].size();
    for (size_t j = 0; j < m; ++j) {
      const uint32_t u = parts[s][j];
      std::memcpy(rows + u * width, p + j * width * 4, width * 4);
      std::memcpy(versions + u, p + m * width * 4 + j * 8, 8);
    }
    if (m) p += ew::PullReplyBytes(m, width);
  }
}

NDArray DistTable::Pull(const NDArray& ids, NDArray* versions, std::chrono::milliseconds timeout) {
  const uint64_t* id = embedding::CheckIds(ids, config(), "Pull");
  const int64_t n = ids.size();
  const int64_t width = config().width;
  NDArray out(Shape{n, width}, DType::kFloat32);
  if (versions) *versions = NDArray(Shape{n}, DType::kInt64);
  if (cache_) {
    // Only the rows the cache plans (missing, or fetched more than S steps ago).
    const std::vector<uint64_t> fetch = cache_->Plan(id, n, clock_);
    std::vector<float> rows(fetch.size() * static_cast<size_t>(width));
    std::vector<int64_t> vers(fetch.size());
    if (!fetch.empty()) Fetch(fetch, rows.data(), vers.data(), timeout);
    cache_->Fill(fetch.data(), static_cast<int64_t>(fetch.size()), rows.data(), vers.data());
    cache_->Read(id, n, out.data<float>());
    if (versions)
      for (int64_t i = 0; i < n; ++i) cache_->Version(id[i], versions->data<int64_t>() + i);
    return out;
  }
  const Distinct d = embedding::DistinctOf(id, n);
  std::vector<float> rows(d.ids.size() * static_cast<size_t>(width));
  std::vector<int64_t> vers(d.ids.size());
  Fetch(d.ids, rows.data(), vers.data(), timeout);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = d.where[static_cast<size_t>(i)];
    std::memcpy(out.data<float>() + i * width, rows.data() + u * width,
                static_cast<size_t>(width) * 4);
    if (versions) versions->data<int64_t>()[i] = vers[u];
  }
  return out;
}

void DistTable::Push(const NDArray& ids, const NDArray& grads, std::chrono::milliseconds timeout) {
  const uint64_t* id = embedding::CheckIds(ids, config(), "Push");
  const int64_t n = ids.size();
  const float* g = embedding::CheckGrads(grads, n, config());
  const auto width = static_cast<uint64_t>(config().width);
  const Distinct d = embedding::DistinctOf(id, n);
  const std::vector<float> sum = embedding::SumGrads(d, g, n, config().width);
  const auto parts = ByServer(d.ids);
  std::vector<uint64_t> lens;
  uint64_t total = 0;
  for (uint32_t s = 0; s < servers_; ++s) {
    lens.push_back(ew::PushBytes(parts[s].size(), width));
    total += lens.back();
  }
  auto buf = std::make_shared<std::string>(total, '\0');
  char* p = buf->data();
  std::vector<uint64_t> mine;
  std::vector<float> rows;
  for (uint32_t s = 0; s < servers_; ++s) {  // every server: an empty part joins its round
    mine.clear();
    rows.clear();
    for (uint32_t u : parts[s]) {
      mine.push_back(d.ids[u]);
      rows.insert(rows.end(), sum.begin() + u * width, sum.begin() + (u + 1) * width);
    }
    p = ew::EncodePush(p, width, mine.data(), mine.size(), rows.data());
  }
  auto done = std::make_shared<Completion>();
  const uint64_t ts = link_.worker()->Push(ps_keys_, FrameOf(std::move(buf)), lens,
                                           MakeCmd(Kind::kEmbeddingPush, DType::kFloat32),
                                           Completion::Callback(done));
  Await(ts, done, "push of " + what_, timeout);
  ++clock_;  // applied (dist_sync: by every server, as one round of every worker)
}

std::vector<std::array<int64_t, ea::kReplyWords>> DistTable::AskAll(
    const ea::Request& r, const std::string& what, std::chrono::milliseconds timeout) {
  const std::string bytes = ea::Encode(r);
  auto buf = std::make_shared<std::string>();
  std::vector<uint64_t> lens, out_lens;
  for (uint32_t s = 0; s < servers_; ++s) {
    buf->append(bytes);
    lens.push_back(bytes.size());
    out_lens.push_back(ea::kReplyBytes);
  }
  std::vector<std::array<int64_t, ea::kReplyWords>> out(servers_);
  auto done = std::make_shared<Completion>();
  const uint64_t ts = link_.worker()->PushPull(
      ps_keys_, FrameOf(std::move(buf)), lens, reinterpret_cast<char*>(out.data()), out_lens,
      MakeCmd(Kind::kEmbeddingAdmin, DType::kFloat32), Completion::Callback(done));
  Await(ts, done, what, timeout);
  return out;
}

uint64_t DistTable::Collective(ea::Op op, const std::string& dir, const std::string& what,
                               std::chrono::milliseconds timeout) {
  if (dir.empty() || dir.size() > ea::kMaxPath || dir.find('\0') != std::string::npos)
    throw InvalidArgument(what + ": the directory must be a path of 1 to " +
                          std::to_string(ea::kMaxPath) + " bytes");
  const uint64_t ticket = ++ticket_;
  store_.Barrier();  // every worker stopped pushing and pulling this table
  std::exception_ptr failed;
  std::vector<std::array<int64_t, ea::kReplyWords>> replies;
  if (store_.Rank() == 0) {
    try {
      replies = AskAll({op, ticket, dir}, what, timeout);
    } catch (...) {
      failed = std::current_exception();
    }
  }
  store_.Barrier();  // the servers have the outcome
  if (failed) std::rethrow_exception(failed);
  if (store_.Rank() != 0) replies = AskAll({ea::Op::kOutcome, ticket, {}}, what, timeout);
  uint64_t bytes = 0;
  for (const auto& r : replies) bytes += static_cast<uint64_t>(r[ea::kBytes]);
  return bytes;
}

EmbeddingStats DistTable::Stats(std::chrono::milliseconds timeout) {
  EmbeddingStats out = mine_;
  if (cache_) {
    const embedding::RowCacheStats c = cache_->Stats();
    out.cache_hits = c.hits;
    out.cache_evicted = c.evicted;
    out.cache_rows = c.cached;
  }
  for (const auto& r : AskAll({ea::Op::kStats, 0, {}}, "counters of " + what_, timeout)) {
    size_t i = 0;
    embedding::ForEachStat([&](const char*, const char*, auto, auto field) {
      out.*field += static_cast<std::remove_reference_t<decltype(out.*field)>>(r[i++]);
    });
    out.step = std::max(out.step, r[ea::kPartStep]);
  }
  return out;
}

}  // namespace

std::unique_ptr<EmbeddingTable> CreateDistEmbedding(DistWorkerStore& store, int key,
                                                    const EmbeddingConfig& config,
                                                    const EmbeddingCacheConfig& cache) {
  auto t = std::make_unique<DistTable>(store, key, config, cache);
  t->Create();
  return t;
}

}  // namespace pskv::dist

namespace pskv {

// Here, where both kinds are known: a dist store's tables live on its servers, any
// other store's in this process.
std::unique_ptr<EmbeddingTable> EmbeddingTable::Create(KVStore& store, int key,
                                                       const EmbeddingConfig& config,
                                                       const EmbeddingCacheConfig& cache) {
  (void)embedding::Table(config);  // checks the configuration (InvalidArgument)
  if (auto* dist = dynamic_cast<dist::DistWorkerStore*>(&store))
    return dist::CreateDistEmbedding(*dist, key, config, cache);
  return embedding::CreateLocalTable(key, config);
}

}  // namespace pskv
