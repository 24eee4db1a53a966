// EmbeddingServer: a dist server's parts of the dynamic embedding tables
// (embedding_server.h).
#include "kvstore/distributed/server/embedding_server.h"

#include <cstring>

#include "common/logging.h"
#include "embedding/stats_fields.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/embedding_codec.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/error.h"

namespace pskv {

namespace {

using dist::Kind;
namespace ew = dist::embedding_wire;

ew::Source ValuesOf(const Message& m) {
  ew::Source s;
  s.size = m.h.vals_len;
  s.copy = [&m](uint64_t offset, uint64_t len, char* out) { m.CopyVals(offset, len, out); };
  return s;
}

std::string TableName(int64_t wire_key) {
  return "embedding table " + std::to_string(dist::KeyOf(wire_key));
}

void FailAll(std::vector<SyncRound<KVRequest>::Entry>& pushes, KVServer* srv, ErrorKind kind,
             const std::string& why) {
  for (auto& p : pushes) {
    try {
      srv->RespondError(p.push, kind, why);
    } catch (...) {
    }
  }
}

}  // namespace

EmbeddingServer::EmbeddingServer(RangeOf range, const RangeConfig& config)
    : range_(range), config_(config) {
  // A scrape reads every part under its lock (between updates); the registry's lock
  // is taken before mu_ and a part's, never while one is held here.
  gauges_ = obs::Gauges([this](std::vector<obs::GaugeSample>* out) {
    std::vector<std::pair<int64_t, Part*>> parts;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& [wk, p] : parts_) parts.emplace_back(wk, p.get());
    }
    for (auto& [wk, p] : parts) {
      embedding::TableStats s;
      {
        std::lock_guard<std::mutex> lk(p->mu);
        s = p->table->Stats();
      }
      const std::string labels = "table=\"" + std::to_string(dist::KeyOf(wk)) + "\",range=\"" +
                                 std::to_string(range_.index()) + "\"";
      embedding::ForEachStat([&](const char* name, const char* help, auto field, auto) {
        out->push_back({std::string("pskv_embedding_") + name,
                        std::string("Dynamic embedding table part: ") + help + ".", labels,
                        static_cast<double>(s.*field)});
      });
    }
  });
}

bool EmbeddingServer::Holds(int64_t wire_key) const {
  std::lock_guard<std::mutex> lk(mu_);
  return parts_.count(wire_key) > 0;
}

void EmbeddingServer::Create(int64_t wire_key, KVRequest&& req, KVServer* srv) {
  if (!req.push) return srv->RespondError(req, ErrorKind::kInvalid, "malformed embedding create");
  if (const std::string why = CreateRefusal(req); !why.empty())
    return srv->RespondError(req, IsServerId(req.sender) ? ErrorKind::kInvalid : ErrorKind::kUsage,
                             TableName(wire_key) + ": " + why);
  std::string bytes;
  std::unique_ptr<embedding::Table> table;
  try {
    bytes = ew::DecodeCreate(ValuesOf(req.msg));
    table = std::make_unique<embedding::Table>(payload::DecodeEmbeddingTable(bytes));
  } catch (const ProtocolError& e) {  // a malformed configuration: the sender's bad argument
    return srv->RespondError(req, ErrorKind::kInvalid, TableName(wire_key) + ": " + e.what());
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), TableName(wire_key) + ": " + e.what());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& slot = parts_[wire_key];
    if (slot) {  // parts are never removed: reading its config needs no lock of its own
      if (slot->config != bytes)
        return srv->RespondError(req, ErrorKind::kKey,
                                 TableName(wire_key) +
                                     " exists with another configuration: create each table "
                                     "once, with the same configuration on every worker");
    } else {
      slot = std::make_unique<Part>();
      slot->config = std::move(bytes);
      slot->table = std::move(table);
    }
  }
  // Replicated: the replicas create it too before the answer (a retry is forwarded
  // again: with a new primary, a copy may lack it).
  if (rep_.targets)
    if (const std::vector<int> to = rep_.targets(req); !to.empty()) return rep_.forward(req, to);
  srv->Respond(req);
}

ew::Owner EmbeddingServer::Owner() const {
  return {static_cast<uint32_t>(range_.index()), static_cast<uint32_t>(range_.node->num_servers())};
}

void EmbeddingServer::Handle(KVRequest&& req, KVServer* srv) {
  const Message& m = req.msg;
  int64_t wire_key = 0;
  if (m.num_keys() != 1 || !range_.keys().WireKeyOf(m.key_ptr()[0], &wire_key) ||
      dist::ChunkOf(wire_key) != 0)
    return srv->RespondError(req, ErrorKind::kInvalid, "malformed embedding request");
  const Kind kind = dist::CmdKind(req.cmd);
  if (kind == Kind::kEmbeddingCreate) return Create(wire_key, std::move(req), srv);
  if (kind == Kind::kReplicateEmbedding) return ApplyCopy(wire_key, std::move(req), srv);
  Part* pp;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = parts_.find(wire_key);
    pp = it == parts_.end() ? nullptr : it->second.get();
  }
  if (!pp)
    return srv->RespondError(req, ErrorKind::kKey,
                             TableName(wire_key) +
                                 " does not exist here: create it first "
                                 "(EmbeddingTable::Create, on every worker)");
  Part& p = *pp;
  std::unique_lock<std::mutex> lk(p.mu);
  if (dist::CmdDType(req.cmd) != static_cast<int>(DType::kFloat32))
    return srv->RespondError(req, ErrorKind::kShape,
                             TableName(wire_key) + " holds float32 rows; the request carries " +
                                 "dtype code " + std::to_string(dist::CmdDType(req.cmd)));
  if (kind == Kind::kEmbeddingPull) return Pull(p, std::move(req), srv, lk);
  if (kind == Kind::kEmbeddingAdmin) return Admin(wire_key, p, std::move(req), srv, lk);
  if (kind != Kind::kEmbeddingPush || !req.push)
    return srv->RespondError(req, ErrorKind::kInvalid, "malformed embedding request");
  Push(wire_key, p, std::move(req), srv, lk);
}

void EmbeddingServer::Push(int64_t wire_key, Part& p, KVRequest&& req, KVServer* srv,
                           std::unique_lock<std::mutex>& lk) {
  try {  // validated now (a round applies it later): a bad push fails alone
    (void)ew::DecodePush(ValuesOf(req.msg), p.table->config().width, Owner());
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), TableName(wire_key) + ": " + e.what());
  }
  if (HeldAlready(p, req, srv)) return;
  if (!p.ahead.empty()) {  // copies of a primary that died: this copy leads now
    PSKV_WARN(range_.node->Tag() << ": " << TableName(wire_key) << ": dropped " << p.ahead.size()
                                 << " update(s) its dead primary sent out of order");
    p.ahead.clear();
  }
  if (config_.sync) return JoinRound(wire_key, p, std::move(req), srv, lk);
  ew::PushRows rows;
  try {
    rows = Apply(p, {&req});
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), TableName(wire_key) + ": " + e.what());
  }
  std::vector<KVRequest> pushes;
  pushes.push_back(std::move(req));
  Applied(wire_key, p, rows, std::move(pushes), srv, lk);
}

void EmbeddingServer::Pull(Part& p, KVRequest&& req, KVServer* srv,
                           std::unique_lock<std::mutex>& lk) {
  if (!req.pull || !req.push)
    return srv->RespondError(req, ErrorKind::kInvalid, "malformed embedding pull");
  std::vector<uint64_t> ids;
  try {
    ids = ew::DecodePull(ValuesOf(req.msg), Owner());
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), std::string("embedding pull: ") + e.what());
  }
  const uint64_t n = ids.size();
  const auto width = static_cast<uint64_t>(p.table->config().width);
  const uint64_t bytes = ew::PullReplyBytes(n, width);
  auto out = std::make_shared<std::string>(bytes, '\0');
  auto* rows = reinterpret_cast<float*>(out->data());
  p.table->Pull(ids.data(), static_cast<int64_t>(n), rows);
  char* versions = out->data() + n * width * 4;
  for (uint64_t i = 0; i < n; ++i) {
    embedding::Table::RowView row;
    const int64_t v = p.table->Row(ids[i], &row) ? row.last_step : -1;
    std::memcpy(versions + i * 8, &v, 8);
  }
  lk.unlock();
  Frame f;
  f.data = out->data();
  f.size = out->size();
  f.owner = out;
  srv->Respond(req, {req.msg.key_ptr()[0]}, std::move(f), {bytes});
}

ew::PushRows EmbeddingServer::Apply(Part& p, const std::vector<const KVRequest*>& pushes) const {
  const int64_t width = p.table->config().width;
  ew::PushRows all;
  for (const KVRequest* r : pushes) {
    ew::PushRows one = ew::DecodePush(ValuesOf(r->msg), width, Owner());
    if (pushes.size() == 1) {
      all = std::move(one);
      break;
    }
    all.ids.insert(all.ids.end(), one.ids.begin(), one.ids.end());
    all.grads.insert(all.grads.end(), one.grads.begin(), one.grads.end());
  }
  p.table->Push(p.step, all.ids.data(), static_cast<int64_t>(all.ids.size()), all.grads.data());
  ++p.step;
  return all;
}

void EmbeddingServer::JoinRound(int64_t wire_key, Part& p, KVRequest&& req, KVServer* srv,
                                std::unique_lock<std::mutex>& lk) {
  const int sender = req.sender;
  const Node* node = range_.node;
  const std::string why = p.round.Refusal(sender, config_.done_workers, TableName(wire_key),
                                          [node](int id) { return node->NodeName(id); });
  if (!why.empty()) return srv->RespondError(req, ErrorKind::kUsage, why);
  p.round.Join(sender, std::move(req), std::chrono::steady_clock::now());
  if (!p.round.complete(node->num_workers())) return;
  auto round = p.round.Take();
  ew::PushRows rows;
  try {
    rows = Apply(p, SyncRound<KVRequest>::RankOrder(round));
  } catch (const std::exception& e) {
    // Table::Push refuses a push whole before it changes anything (the budget): the
    // round is over, unapplied, and the table's step does not move.
    FailAll(round, srv, KindOf(e), TableName(wire_key) + ": " + e.what());
    p.round.Advance();
    return;
  }
  p.round.Advance();
  std::vector<KVRequest> pushes;
  for (auto& r : round) pushes.push_back(std::move(r.push));
  Applied(wire_key, p, rows, std::move(pushes), srv, lk);
}

void EmbeddingServer::WorkerDone(int id, KVServer* srv) {
  std::vector<std::pair<int64_t, Part*>> parts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [wk, p] : parts_) parts.emplace_back(wk, p.get());
  }
  for (auto& [wk, p] : parts) {
    std::lock_guard<std::mutex> lk(p->mu);
    if (!p->round.NeedsPushFrom(id)) continue;
    auto round = p->round.Take();
    FailAll(round, srv, ErrorKind::kUsage,
            FinishedWithoutPushing(TableName(wk), range_.node->NodeName(id), p->round.round()));
  }
}

}  // namespace pskv
