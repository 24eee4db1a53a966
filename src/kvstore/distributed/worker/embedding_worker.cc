// The dist stores' dynamic embedding tables, worker side (embedding_worker.h).
#include "kvstore/distributed/worker/embedding_worker.h"

#include <cstring>

#include "common/crc32c.h"
#include "embedding/batch.h"
#include "embedding/local_table.h"
#include "embedding/table.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/embedding_codec.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/distributed/worker/collective_init.h"
#include "kvstore/distributed/worker/store.h"
#include "pskv/error.h"

namespace pskv::dist {

namespace {

namespace ew = embedding_wire;
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
  DistTable(ServerLink& link, int key, const EmbeddingConfig& cfg)
      : EmbeddingTable(key, cfg),
        link_(link),
        servers_(static_cast<uint32_t>(link.node()->num_servers())),
        what_("embedding table " + std::to_string(key) + " ('" + cfg.name + "')") {
    const int64_t wire = WireKey(link.store_id(), key);
    for (uint32_t s = 0; s < servers_; ++s)
      ps_keys_.push_back(PsKey(wire, static_cast<int>(s), static_cast<int>(servers_)));
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
  /// Per server, the indices (into d.ids) of the distinct ids it holds, in order.
  std::vector<std::vector<uint32_t>> ByServer(const Distinct& d) const {
    std::vector<std::vector<uint32_t>> out(servers_);
    for (size_t i = 0; i < d.ids.size(); ++i)
      out[EmbeddingShardOf(d.ids[i], servers_)].push_back(static_cast<uint32_t>(i));
    return out;
  }

  ServerLink& link_;
  const uint32_t servers_;
  const std::string what_;
  std::vector<uint64_t> ps_keys_;  // per server
};

NDArray DistTable::Pull(const NDArray& ids, NDArray* versions, std::chrono::milliseconds timeout) {
  const uint64_t* id = embedding::CheckIds(ids, config(), "Pull");
  const int64_t n = ids.size();
  const auto width = static_cast<uint64_t>(config().width);
  const Distinct d = embedding::DistinctOf(id, n);
  const auto parts = ByServer(d);
  std::vector<uint64_t> keys, lens, out_lens;
  std::vector<uint32_t> order;  // distinct index of each row of the reply, in order
  auto req = std::make_shared<std::string>();
  for (uint32_t s = 0; s < servers_; ++s) {
    if (parts[s].empty()) continue;
    std::vector<uint64_t> mine;
    for (uint32_t u : parts[s]) mine.push_back(d.ids[u]);
    ew::AppendPull(req.get(), mine.data(), mine.size());
    keys.push_back(ps_keys_[s]);
    lens.push_back(ew::PullBytes(mine.size()));
    out_lens.push_back(ew::PullReplyBytes(mine.size(), width));
    order.insert(order.end(), parts[s].begin(), parts[s].end());
  }
  uint64_t total = 0;
  for (uint64_t l : out_lens) total += l;
  std::string reply(total, '\0');
  if (!keys.empty()) {
    auto done = std::make_shared<Completion>();
    const uint64_t ts = link_.worker()->PushPull(
        keys, FrameOf(std::move(req)), lens, reply.data(), out_lens,
        MakeCmd(Kind::kEmbeddingPull, DType::kFloat32), Completion::Callback(done));
    Await(ts, done, "pull of " + what_, timeout);
  }
  // Rows and versions of each distinct id: server part k holds m ids' rows, then
  // their versions.
  std::vector<const char*> row_of(d.ids.size()), version_of(d.ids.size());
  const char* p = reply.data();
  size_t at = 0;
  for (uint32_t s = 0; s < servers_; ++s) {
    const size_t m = parts[s].size();
    if (!m) continue;
    for (size_t j = 0; j < m; ++j) {
      row_of[order[at + j]] = p + j * width * 4;
      version_of[order[at + j]] = p + m * width * 4 + j * 8;
    }
    p += ew::PullReplyBytes(m, width);
    at += m;
  }
  NDArray out(Shape{n, config().width}, DType::kFloat32);
  if (versions) *versions = NDArray(Shape{n}, DType::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = d.where[static_cast<size_t>(i)];
    std::memcpy(out.data<float>() + i * config().width, row_of[u], width * 4);
    if (versions) std::memcpy(versions->data<int64_t>() + i, version_of[u], 8);
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
  const auto parts = ByServer(d);
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
}

}  // namespace

std::unique_ptr<EmbeddingTable> CreateDistEmbedding(DistWorkerStore& store, int key,
                                                    const EmbeddingConfig& config) {
  auto t = std::make_unique<DistTable>(store.link(), key, config);
  t->Create();
  return t;
}

}  // namespace pskv::dist

namespace pskv {

// Here, where both kinds are known: a dist store's tables live on its servers, any
// other store's in this process.
std::unique_ptr<EmbeddingTable> EmbeddingTable::Create(KVStore& store, int key,
                                                       const EmbeddingConfig& config) {
  (void)embedding::Table(config);  // checks the configuration (InvalidArgument)
  if (auto* dist = dynamic_cast<dist::DistWorkerStore*>(&store))
    return dist::CreateDistEmbedding(*dist, key, config);
  return embedding::CreateLocalTable(key, config);
}

}  // namespace pskv
