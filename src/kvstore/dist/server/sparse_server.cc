#include "kvstore/dist/server/sparse_server.h"

#include <algorithm>

#include "kvstore/dist/wire/sparse_codec.h"
#include "kvstore/dist_protocol.h"
#include "pskv/error.h"
#include "pskv/row_sparse.h"
#include "sparse/sparse_ops.h"

namespace pskv {

namespace {

using dist::Kind;
namespace sparse_wire = dist::sparse_wire;

// The row_sparse values (layout and checks: kvstore/dist/wire/sparse_codec.h, the
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

void SparseServer::Init(int64_t wire_key, KVRequest&& req, KVServer* srv, DType dtype) {
  if (!req.push) return srv->RespondError(req, ErrorKind::kInvalid, "malformed row_sparse init");
  auto k = std::make_unique<Key>();
  try {
    k->table = DecodeInit(req.msg, dtype);
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), e.what());
  }
  k->rows = k->table.shape()[0];
  k->row_size = k->table.shape()[1];
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!keys_.emplace(wire_key, std::move(k)).second)
      return srv->RespondError(req, ErrorKind::kKey,
                               "duplicate init of key " + std::to_string(dist::KeyOf(wire_key)));
    count_.store(keys_.size(), std::memory_order_release);
  }
  srv->Respond(req);
}

void SparseServer::Apply(int64_t wire_key, Key& k, const std::vector<const KVRequest*>& pushes,
                         Optimizer* optimizer) {
  const Shape shape{k.rows, k.row_size};
  std::vector<RowSparseNDArray> parts;
  for (const KVRequest* r : pushes) {
    Rows rows = DecodePush(r->msg, k.rows, k.row_size, k.table.dtype());
    NDArray ids(Shape{static_cast<int64_t>(rows.ids.size())}, DType::kInt64);
    std::copy(rows.ids.begin(), rows.ids.end(), ids.data<int64_t>());
    parts.push_back(RowSparseNDArray::FromRows(shape, ids, rows.data));
  }
  RowSparseNDArray sum = sparse::Sum(parts);
  const int64_t* ids = sum.indices().data<int64_t>();
  if (optimizer) {
    optimizer->UpdateRows(dist::KeyOf(wire_key), ids, sum.nnz(), sum.data(), k.row_size, &k.table);
  } else {  // no optimizer: the slice becomes the sum (MXNet's assignment)
    k.table.Fill(0);
    sparse::Scatter(sum.data(), ids, sum.nnz(), k.row_size, &k.table, false);
  }
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
  if (kind == Kind::kSparseInit) return Init(wire_key, std::move(req), srv, dtype);
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
    Apply(wire_key, k, {&req}, ctx.optimizer);
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), std::string("update failed: ") + e.what());
  }
  k.round.Advance();
  srv->Respond(req);
}

void SparseServer::JoinRound(int64_t wire_key, Key& k, KVRequest&& req, KVServer* srv,
                             const Context& ctx, std::unique_lock<std::mutex>& lk) {
  const std::string why =
      k.round.Refusal(req.sender, *ctx.done_workers,
                      "row_sparse key " + std::to_string(dist::KeyOf(wire_key)), ctx.worker_name);
  if (!why.empty()) return srv->RespondError(req, ErrorKind::kUsage, why);
  const int sender = req.sender;
  k.round.Join(sender, std::move(req), std::chrono::steady_clock::now());
  if (!k.round.complete(ctx.num_workers)) return;
  auto round = k.round.Take();
  try {
    Apply(wire_key, k, SyncRound<KVRequest>::RankOrder(round), ctx.optimizer);
  } catch (const std::exception& e) {
    FailRound(std::move(round), srv, KindOf(e), std::string("update failed: ") + e.what());
    return;
  }
  k.round.Advance();
  lk.unlock();
  for (auto& r : round) srv->Respond(r.push);
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

}  // namespace pskv
