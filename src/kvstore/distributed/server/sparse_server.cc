#include "kvstore/distributed/server/sparse_server.h"

#include <algorithm>
#include <cstring>

#include "common/byte_io.h"
#include "common/logging.h"

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/replication_wire.h"
#include "kvstore/distributed/wire/sparse_codec.h"
#include "pskv/error.h"
#include "pskv/row_sparse.h"
#include "sparse/sparse_ops.h"

namespace pskv {

namespace {

using dist::Kind;
namespace sparse_wire = dist::sparse_wire;

// The row_sparse values (layout and checks: kvstore/distributed/wire/sparse_codec.h, the
// codec the workers encode with) read from a received message's pieces.
sparse_wire::Source ValuesOf(const Message& m) {
  sparse_wire::Source s;
  s.size = m.h.vals_len;
  s.copy = [&m](uint64_t offset, uint64_t len, char* out) { m.CopyVals(offset, len, out); };
  return s;
}

// A kSparseInit value: the key's slice, rows x row_size elements of `dtype`.
NDArray DecodeInit(const Message& m, DType dtype) {
  const sparse_wire::Source v = ValuesOf(m);
  const sparse_wire::InitHead h = sparse_wire::DecodeInitHead(v, DTypeSize(dtype));
  NDArray table(Shape{static_cast<int64_t>(h.rows), static_cast<int64_t>(h.row_size)}, dtype);
  v.copy(16, table.nbytes(), static_cast<char*>(table.raw()));
  return table;
}

// A kSparsePush value: local row ids and rows (an aligned copy).
using Rows = sparse_wire::PushRows;

// The push count a replicated job's worker sent with a row_sparse push (kv_app.h), or 0.
uint64_t PushCount(const KVRequest& req) {
  const PushBody body = PushBody::Parse(req.msg.body, 1);
  return body.counts.empty() ? 0 : body.counts[0];
}
Rows DecodePush(const Message& m, int64_t key_rows, int64_t row_size, DType dtype) {
  return sparse_wire::DecodePush(ValuesOf(m), key_rows, row_size, dtype);
}

// A kSparsePull value: the local row ids to read.
std::vector<int64_t> DecodePull(const Message& m, int64_t key_rows) {
  return sparse_wire::DecodePull(ValuesOf(m), key_rows);
}

}  // namespace

bool SparseServer::Holds(int64_t wire_key) const {
  if (count_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lk(mu_);
  return keys_.count(wire_key) > 0;
}

std::pair<int64_t, bool> SparseServer::WeightInfo(int64_t wire_key) const {
  Key* k;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = keys_.find(wire_key);
    if (it == keys_.end()) return {-1, false};
    k = it->second.get();
  }
  std::lock_guard<std::mutex> lk(k->mu);
  return {k->table.size(), IsLowPrecision(k->table.dtype())};
}

void SparseServer::Init(int64_t wire_key, KVRequest&& req, KVServer* srv, DType dtype,
                        const Context& ctx) {
  if (!req.push) return srv->RespondError(req, ErrorKind::kInvalid, "malformed row_sparse init");
  auto k = std::make_unique<Key>();
  try {
    k->table = DecodeInit(req.msg, dtype);
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), e.what());
  }
  k->rows = k->table.shape()[0];
  k->row_size = k->table.shape()[1];
  if (ctx.init_count) k->applied_push[ctx.init_worker] = ctx.init_count;
  Key* held = nullptr;  // keys are never removed
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto [it, fresh] = keys_.emplace(wire_key, std::move(k));
    if (!fresh) held = it->second.get();
    count_.store(keys_.size(), std::memory_order_release);
  }
  if (held) {
    // A retry of the same init (its primary died before answering it, after this copy
    // applied it) is answered as it is; anything else is a second init of the key.
    std::lock_guard<std::mutex> klk(held->mu);
    auto pushed = held->applied_push.find(ctx.init_worker);
    if (!ctx.init_count || pushed == held->applied_push.end() || pushed->second < ctx.init_count)
      return srv->RespondError(req, ErrorKind::kKey,
                               "duplicate init of key " + std::to_string(dist::KeyOf(wire_key)));
  }
  if (ctx.answer_init) return ctx.answer_init(req);
  srv->Respond(req);
}

RowSparseNDArray SparseServer::SumOf(const Key& k, const std::vector<const KVRequest*>& pushes) {
  const Shape shape{k.rows, k.row_size};
  std::vector<RowSparseNDArray> parts;
  for (const KVRequest* r : pushes) {
    Rows rows = DecodePush(r->msg, k.rows, k.row_size, k.table.dtype());
    NDArray ids(Shape{static_cast<int64_t>(rows.ids.size())}, DType::kInt64);
    std::copy(rows.ids.begin(), rows.ids.end(), ids.data<int64_t>());
    parts.push_back(RowSparseNDArray::FromRows(shape, ids, rows.data));
  }
  return sparse::Sum(parts);
}

void SparseServer::ApplySum(int64_t wire_key, Key& k, const RowSparseNDArray& sum,
                            Optimizer* optimizer, int64_t* schedule_at) {
  const int64_t* ids = sum.indices().data<int64_t>();
  if (optimizer) {
    optimizer->UpdateRows(dist::KeyOf(wire_key), ids, sum.nnz(), sum.data(), k.row_size, &k.table,
                          schedule_at);
  } else {  // no optimizer: the slice becomes the sum (MXNet's assignment)
    k.table.Fill(0);
    sparse::Scatter(sum.data(), ids, sum.nnz(), k.row_size, &k.table, false);
  }
}

void SparseServer::Replicate(const Key& k, const RowSparseNDArray& sum, int64_t round,
                             int64_t schedule_at, std::vector<SyncRound<KVRequest>::Entry> pushes,
                             KVServer* srv, const Context& ctx) {
  const uint64_t row_bytes = static_cast<uint64_t>(k.row_size) * DTypeSize(k.table.dtype());
  const uint64_t n = static_cast<uint64_t>(sum.nnz());
  const uint64_t bytes = sparse_wire::PushBytes(n, row_bytes);
  std::shared_ptr<char[]> buf(new char[bytes]);
  sparse_wire::EncodePush(buf.get(), static_cast<uint64_t>(k.row_size),
                          sum.indices().data<int64_t>(), n, 0, sum.data().raw(), row_bytes);
  dist::replication_wire::SparseRound body{ctx.table_version, round, schedule_at, {}};
  for (auto& e : pushes) body.counts.push_back({e.sender, PushCount(e.push)});
  const KVRequest& first = pushes.front().push;
  Message m;
  m.h.flags = kPush;
  m.h.head = dist::MakeCmd(Kind::kReplicateSparse, k.table.dtype());
  m.h.num_keys = 1;
  m.h.vals_len = bytes;
  m.keys = U64Frame({first.msg.key_ptr()[0]});
  m.lens = U64Frame({bytes});
  m.vals = Frame::Of(std::move(buf), bytes);
  m.body = dist::replication_wire::EncodeSparseRound(body);
  auto answer = std::make_shared<std::vector<SyncRound<KVRequest>::Entry>>(std::move(pushes));
  ctx.replicate(std::move(m), [srv, answer](std::exception_ptr e) {
    if (!e) {
      for (auto& r : *answer) {
        try {
          srv->Respond(r.push);
        } catch (...) {
        }
      }
      return;
    }
    std::string why = "replication failed";
    ErrorKind kind = ErrorKind::kIO;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      why += std::string(": ") + ex.what();
      kind = KindOf(ex);
    }
    FailRound(std::move(*answer), srv, kind, why);
  });
}

void SparseServer::FailRound(std::vector<SyncRound<KVRequest>::Entry> pushes, KVServer* srv,
                             ErrorKind kind, const std::string& why) {
  for (auto& p : pushes) {
    try {
      srv->RespondError(p.push, kind, why);
    } catch (...) {
    }
  }
}

void SparseServer::Handle(int64_t wire_key, KVRequest&& req, KVServer* srv, const Context& ctx) {
  const Kind kind = dist::CmdKind(req.cmd);
  const DType dtype = static_cast<DType>(dist::CmdDType(req.cmd));
  const std::string key_name = std::to_string(dist::KeyOf(wire_key));
  if (kind == Kind::kSparseInit) return Init(wire_key, std::move(req), srv, dtype, ctx);
  Key* kp;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = keys_.find(wire_key);
    kp = it == keys_.end() ? nullptr : it->second.get();
  }
  if (!kp)
    return srv->RespondError(req, ErrorKind::kKey,
                             "row_sparse key " + key_name + " has not been inited here");
  Key& k = *kp;
  std::unique_lock<std::mutex> lk(k.mu);
  if (dtype != k.table.dtype())
    return srv->RespondError(req, ErrorKind::kShape,
                             "key " + key_name + " holds " + DTypeName(k.table.dtype()) +
                                 " but the request carries " + DTypeName(dtype));
  if (kind == Kind::kSparsePull) {
    if (!req.pull) return srv->RespondError(req, ErrorKind::kInvalid, "malformed row_sparse pull");
    std::vector<int64_t> ids;
    try {
      ids = DecodePull(req.msg, k.rows);
    } catch (const KeyError& e) {
      return srv->RespondError(req, ErrorKind::kKey,
                               "row_sparse pull of key " + key_name + ": " + e.what());
    } catch (const std::exception& e) {
      return srv->RespondError(req, KindOf(e), e.what());
    }
    auto rows = std::make_shared<NDArray>(
        sparse::Gather(k.table, ids.data(), static_cast<int64_t>(ids.size()), k.row_size));
    lk.unlock();
    Frame f;
    f.data = static_cast<const char*>(rows->raw());
    f.size = rows->nbytes();
    f.owner = rows;
    const uint64_t bytes = rows->nbytes();
    return srv->Respond(req, {req.msg.key_ptr()[0]}, std::move(f), {bytes});
  }
  if (kind != Kind::kSparsePush || !req.push)
    return srv->RespondError(req, ErrorKind::kInvalid, "malformed row_sparse request");
  // Validate now (the round applies it later): a bad push fails alone.
  try {
    DecodePush(req.msg, k.rows, k.row_size, k.table.dtype());
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), "key " + key_name + ": " + e.what());
  }
  if (ctx.sync) return JoinRound(wire_key, k, std::move(req), srv, ctx, lk);
  if (!ctx.optimizer)
    return srv->RespondError(req, ErrorKind::kUsage,
                             "Updater needs to be set for async mode: call SetOptimizer on "
                             "the dist_async store before pushing row_sparse key " +
                                 key_name);
  try {
    ApplySum(wire_key, k, SumOf(k, {&req}), ctx.optimizer, nullptr);
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), std::string("update failed: ") + e.what());
  }
  k.round.Advance();
  srv->Respond(req);
}

void SparseServer::JoinRound(int64_t wire_key, Key& k, KVRequest&& req, KVServer* srv,
                             const Context& ctx, std::unique_lock<std::mutex>& lk) {
  const int sender = req.sender;
  if (const uint64_t count = PushCount(req)) {
    // A push this key already holds (retried after a failover: its primary replicated
    // the round but died before answering): answered, not applied.
    auto it = k.applied_push.find(sender);
    if (it != k.applied_push.end() && count <= it->second) return srv->Respond(req);
  }
  const std::string why =
      k.round.Refusal(sender, *ctx.done_workers,
                      "row_sparse key " + std::to_string(dist::KeyOf(wire_key)), ctx.worker_name);
  if (!why.empty()) return srv->RespondError(req, ErrorKind::kUsage, why);
  k.round.Join(sender, std::move(req), std::chrono::steady_clock::now());
  if (!k.round.complete(ctx.num_workers)) return;
  auto round = k.round.Take();
  const int64_t number = k.round.round();
  RowSparseNDArray sum;
  int64_t schedule_at = 0;
  try {
    sum = SumOf(k, SyncRound<KVRequest>::RankOrder(round));
    ApplySum(wire_key, k, sum, ctx.optimizer, &schedule_at);
  } catch (const std::exception& e) {
    FailRound(std::move(round), srv, KindOf(e), std::string("update failed: ") + e.what());
    return;
  }
  k.round.Advance();
  for (auto& r : round)
    if (const uint64_t count = PushCount(r.push)) k.applied_push[r.sender] = count;
  // Sent under the key's lock: one key's rounds reach the replicas in order.
  if (ctx.replicate) return Replicate(k, sum, number, schedule_at, std::move(round), srv, ctx);
  lk.unlock();
  for (auto& r : round) srv->Respond(r.push);
}

void SparseServer::ApplyCopy(int64_t wire_key, KVRequest&& req, KVServer* srv, Optimizer* optimizer,
                             const std::function<bool(int)>& is_worker, bool keep_last) {
  const Message& m = req.msg;
  auto fail = [&](const std::string& why) {
    srv->RespondError(req, ErrorKind::kInvalid, "row_sparse replication: " + why);
  };
  Key* kp;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = keys_.find(wire_key);
    kp = it == keys_.end() ? nullptr : it->second.get();
  }
  if (!kp) return fail("key " + std::to_string(dist::KeyOf(wire_key)) + " is not held here");
  Key& k = *kp;
  std::lock_guard<std::mutex> lk(k.mu);
  if (dist::CmdDType(req.cmd) != static_cast<int>(k.table.dtype())) return fail("another dtype");
  int64_t round = 0, schedule_at = 0;
  std::vector<std::pair<int, uint64_t>> counts;
  try {
    // The sender's range-table version was checked by the caller.
    const auto body = dist::replication_wire::ParseSparseRound(m.body);
    round = body.round;
    schedule_at = body.schedule_at;
    for (const auto& c : body.counts) {
      if (!is_worker(c.worker))
        return fail("a push count of node id " + std::to_string(c.worker) +
                    ", which is not a worker of this job");
      counts.emplace_back(c.worker, c.count);
    }
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  // Rounds arrive in order (the primary sends round r + 1 only after this replica
  // acknowledged round r); a round already held is acknowledged, never applied twice.
  if (round < k.round.round()) return srv->Respond(req);
  if (round > k.round.round())
    return fail("round " + std::to_string(round) + " of key " +
                std::to_string(dist::KeyOf(wire_key)) + " before round " +
                std::to_string(k.round.round()));
  Rows rows;
  try {
    rows = DecodePush(m, k.rows, k.row_size, k.table.dtype());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  // Acknowledged on receipt, applied right after under the key's lock (the dense
  // rule, replica_apply.cc): the decoded sum is held here and its update runs before
  // any later request of the key; should it fail all the same, the round stays open
  // and the primary's next round of the key is refused.
  srv->Respond(req);
  try {
    NDArray ids(Shape{static_cast<int64_t>(rows.ids.size())}, DType::kInt64);
    std::copy(rows.ids.begin(), rows.ids.end(), ids.data<int64_t>());
    ApplySum(wire_key, k, RowSparseNDArray::FromRows(Shape{k.rows, k.row_size}, ids, rows.data),
             optimizer, &schedule_at);
  } catch (const std::exception& e) {
    PSKV_ERROR("row_sparse key " << dist::KeyOf(wire_key) << ": replicated round " << round
                                 << " failed to apply: " << e.what());
    return;
  }
  k.round.Advance();
  for (auto& [id, count] : counts)
    if (count) k.applied_push[id] = count;
  if (keep_last) k.last_round = std::make_shared<const Message>(m);
}

std::vector<std::shared_ptr<const Message>> SparseServer::TakeLastRounds() {
  std::vector<std::shared_ptr<const Message>> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [wk, k] : keys_) {
    std::lock_guard<std::mutex> klk(k->mu);
    if (k->last_round) out.push_back(std::move(k->last_round));
    k->last_round.reset();
  }
  return out;
}

void SparseServer::WorkerDone(int id, KVServer* srv,
                              const std::function<std::string(int)>& worker_name) {
  std::vector<std::pair<int64_t, Key*>> keys;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [wk, k] : keys_) keys.emplace_back(wk, k.get());
  }
  for (auto& [wk, k] : keys) {
    std::lock_guard<std::mutex> lk(k->mu);
    if (k->round.NeedsPushFrom(id))
      FailRound(k->round.Take(), srv, ErrorKind::kUsage,
                FinishedWithoutPushing("row_sparse key " + std::to_string(dist::KeyOf(wk)),
                                       worker_name(id), k->round.round()));
  }
}

std::vector<SparseServer::KeyCopy> SparseServer::Copy() const {
  std::vector<KeyCopy> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [wk, k] : keys_) {
    std::lock_guard<std::mutex> klk(k->mu);
    out.push_back({wk, k->table.Clone(), k->round.round(), k->applied_push});
  }
  return out;
}

std::string SparseServer::Install(KeyCopy copy) {
  if (copy.table.shape().size() != 2 || copy.table.shape()[0] < 1 || copy.table.shape()[1] < 1 ||
      copy.round < 1)
    return "row_sparse key " + std::to_string(dist::KeyOf(copy.wire_key)) + ": a malformed copy";
  auto k = std::make_unique<Key>();
  k->rows = copy.table.shape()[0];
  k->row_size = copy.table.shape()[1];
  k->table = std::move(copy.table);
  k->round.StartAt(copy.round);
  k->applied_push = std::move(copy.applied_push);
  std::lock_guard<std::mutex> lk(mu_);
  if (!keys_.emplace(copy.wire_key, std::move(k)).second)
    return "row_sparse key " + std::to_string(dist::KeyOf(copy.wire_key)) + " twice";
  count_.store(keys_.size(), std::memory_order_release);
  return {};
}

}  // namespace pskv
