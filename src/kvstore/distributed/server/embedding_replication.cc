// EmbeddingServer, replication (embedding_server.h, "Replicated"; docs/fault-tolerance.md,
// "Dynamic embedding tables").
//
// The primary of a range applies an update of a table's part (a sync round's pushes
// concatenated in rank order, or one async push) and sends the replicas the rows it
// pushed, in the push layout (embedding_codec.h), with the part's change number (the
// updates and restores it applied before) and the pushes' push counts
// (kReplicateEmbedding). A restore is sent the same way (the body names the
// directory, no values): each replica restores its copy from the same files. A replica applies them
// with the same Table::Push at the same step, so its part is the primary's, bit for bit: a part's
// content depends only on its configuration and the sequence of pushes (table.h). The
// pushes are answered only once every replica acknowledged the update, so no worker
// sees a row a promoted replica lacks; a replica acknowledges an update once it
// applied it.
//
// Order: one part's updates are sent under its lock, in step order. In dist_sync the
// next update of a part is applied only after the workers' pushes of this one were
// answered (each worker pushes every round), so they arrive in order. In dist_async a
// big copy (>= 64 KiB) may be overtaken by a smaller one (docs/design.md, "Send
// scheduling"): a replica keeps an update ahead of its step (at most one per worker:
// a worker has one push of a table unanswered) until the one before it arrived.
// A change whose number the part passed is acknowledged, not applied again (a new
// primary sending what this copy holds). With PSKV_REPLICAS >= 2 a replica keeps its
// parts' last changes (sync: the last; async: the last num_workers, as a worker has
// one push of a table unanswered): once promoted it sends them again to the other
// copies (TakeLastChanges), which may have missed them.
//
// After a failover a worker sends its unanswered pushes again to the new primary: a
// push the part holds (its count at most the worker's last applied one) is answered
// from the part; one it lacks (the dead primary never replicated it, so never
// answered it) is applied as a new push: in dist_sync its round is summed afresh from
// the retried pushes, in rank order, at the same step (the same bits).
#include <algorithm>
#include <memory>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/embedding_server.h"
#include "kvstore/distributed/wire/replication_wire.h"
#include "pskv/error.h"

namespace pskv {

namespace {

using dist::Kind;
namespace ew = dist::embedding_wire;
namespace rw = dist::replication_wire;

// The push count a replicated job's worker sent with a request (kv_app.h), or 0.
uint64_t PushCount(const KVRequest& req) {
  const PushBody body = PushBody::Parse(req.msg.body, 1);
  return body.counts.empty() ? 0 : body.counts[0];
}

ew::Source ValuesOf(const Message& m) {
  ew::Source s;
  s.size = m.h.vals_len;
  s.copy = [&m](uint64_t offset, uint64_t len, char* out) { m.CopyVals(offset, len, out); };
  return s;
}

std::string Name(int64_t wire_key) {
  return "embedding table " + std::to_string(dist::KeyOf(wire_key));
}

}  // namespace

std::string EmbeddingServer::CreateRefusal(const KVRequest& req) const {
  if (IsServerId(req.sender)) {  // only a range's primary forwards one, down to its copies
    if (!rep_.not_from_primary) return "a create from a server, for a range not replicated";
    return rep_.not_from_primary(req);
  }
  if (!rep_.targets) return {};
  if (rep_.spares > 0)
    return "dynamic embedding tables with PSKV_SPARE_SERVERS > 0 are not supported yet (a "
           "spare that joins a key range is not sent the tables' rows, so it could not take "
           "the range over): set PSKV_SPARE_SERVERS=0 for this job (docs/fault-tolerance.md)";
  return {};
}

bool EmbeddingServer::HeldAlready(const Part& p, const KVRequest& req, KVServer* srv) const {
  if (!rep_.targets) return false;
  const uint64_t count = PushCount(req);
  auto it = p.applied_push.find(req.sender);
  if (!count || it == p.applied_push.end() || count > it->second) return false;
  PSKV_WARN(range_.node->Tag() << ": a push of " << range_.node->NodeName(req.sender)
                               << " sent again after a failover is held here: answered without "
                                  "applying it again");
  srv->Respond(req);  // its update is here (and on every copy)
  return true;
}

void EmbeddingServer::SendChange(int64_t wire_key, const std::vector<int>& to, Message m,
                                 std::function<void(std::exception_ptr)> done) {
  (void)wire_key;
  m.h.flags = kPush;
  m.h.head = dist::MakeCmd(Kind::kReplicateEmbedding, DType::kFloat32);
  m.h.num_keys = 1;
  rep_.send(to, std::move(m), std::move(done));
}

void EmbeddingServer::Applied(int64_t wire_key, Part& p, const ew::PushRows& rows,
                              std::vector<KVRequest> pushes, KVServer* srv,
                              std::unique_lock<std::mutex>& lk) {
  const int64_t seq = p.changes++;
  std::vector<int> to;
  if (rep_.targets) {
    for (const KVRequest& r : pushes)
      if (const uint64_t count = PushCount(r)) p.applied_push[r.sender] = count;
    to = rep_.targets(pushes.front());
  }
  if (to.empty()) {
    lk.unlock();
    for (auto& r : pushes) srv->Respond(r);
    return;
  }
  const auto width = static_cast<uint64_t>(p.table->config().width);
  const uint64_t n = rows.ids.size();
  const uint64_t bytes = ew::PushBytes(n, width);
  auto buf = std::make_shared<std::string>(bytes, '\0');
  ew::EncodePush(buf->data(), width, rows.ids.data(), n, rows.grads.data());
  rw::EmbeddingRound body{rep_.version(), seq, {}, {}};
  for (const KVRequest& r : pushes) body.counts.push_back({r.sender, PushCount(r)});
  Message m;
  m.h.vals_len = bytes;
  m.keys = U64Frame({pushes.front().msg.key_ptr()[0]});
  m.lens = U64Frame({bytes});
  Frame f;
  f.data = buf->data();
  f.size = buf->size();
  f.owner = buf;
  m.vals = std::move(f);
  m.body = rw::EncodeEmbeddingRound(body);
  auto answer = std::make_shared<std::vector<KVRequest>>(std::move(pushes));
  const std::string what = Name(wire_key);
  // Sent under the part's lock (the caller's `lk`): its changes leave in order.
  SendChange(wire_key, to, std::move(m),
             [srv, answer, what, replicated = rep_.replicated](std::exception_ptr e) {
               if (!e && replicated) replicated();
               std::string why;
               ErrorKind kind = ErrorKind::kIO;
               if (e) {
                 try {
                   std::rethrow_exception(e);
                 } catch (const std::exception& ex) {
                   why = what + ": replication failed: " + ex.what();
                   kind = KindOf(ex);
                 }
               }
               for (auto& r : *answer) {
                 try {
                   if (e)
                     srv->RespondError(r, kind, why);
                   else
                     srv->Respond(r);
                 } catch (...) {
                 }
               }
             });
}

void EmbeddingServer::Restored(int64_t wire_key, Part& p, const std::string& dir, KVRequest&& req,
                               std::string reply, KVServer* srv, std::unique_lock<std::mutex>& lk) {
  const int64_t seq = p.changes++;
  const uint64_t ps_key = req.msg.key_ptr()[0];
  auto out = std::make_shared<std::string>(std::move(reply));
  auto answer = std::make_shared<KVRequest>(std::move(req));
  auto respond = [srv, answer, out, ps_key](ErrorKind kind, const std::string& why) {
    try {
      if (!why.empty()) return srv->RespondError(*answer, kind, why);
      Frame f;
      f.data = out->data();
      f.size = out->size();
      f.owner = out;
      srv->Respond(*answer, {ps_key}, std::move(f), {out->size()});
    } catch (...) {
    }
  };
  const std::vector<int> to = rep_.targets ? rep_.targets(*answer) : std::vector<int>{};
  if (to.empty()) {
    lk.unlock();
    return respond(ErrorKind::kGeneric, {});
  }
  // Every copy restores from the same files (the directory is reachable from every
  // server: docs/embedding.md); the answer waits for them, like an update's.
  Message m;
  m.h.vals_len = 0;
  m.keys = U64Frame({ps_key});
  m.lens = U64Frame({0});
  m.body = rw::EncodeEmbeddingRound({rep_.version(), seq, {}, dir});
  const std::string what = Name(wire_key);
  SendChange(wire_key, to, std::move(m), [respond, what](std::exception_ptr e) {
    if (!e) return respond(ErrorKind::kGeneric, {});
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      respond(KindOf(ex), what + ": the restore did not reach every replica: " + ex.what());
    }
  });
}

void EmbeddingServer::ApplyCopy(int64_t wire_key, KVRequest&& req, KVServer* srv) {
  auto fail = [&](const KVRequest& r, const std::string& why) {
    srv->RespondError(r, ErrorKind::kInvalid, "embedding replication: " + why);
  };
  if (!rep_.not_from_primary) return fail(req, "this server does not replicate its tables");
  if (!IsServerId(req.sender)) return fail(req, "a change from a node that is not a server");
  if (const std::string why = rep_.not_from_primary(req); !why.empty()) return fail(req, why);
  if (!req.push || req.pull) return fail(req, "malformed request");
  Part* pp;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = parts_.find(wire_key);
    pp = it == parts_.end() ? nullptr : it->second.get();
  }
  if (!pp) return fail(req, Name(wire_key) + " is not held here");
  Part& p = *pp;
  std::lock_guard<std::mutex> lk(p.mu);
  rw::EmbeddingRound body;
  try {
    body = rw::ParseEmbeddingRound(req.msg.body);
    if (body.restore.empty())
      (void)ew::DecodePush(ValuesOf(req.msg), p.table->config().width, Owner());
    else if (req.msg.h.vals_len != 0)
      throw ProtocolError("a replicated restore carrying values");
  } catch (const std::exception& e) {
    return fail(req, Name(wire_key) + ": " + e.what());
  }
  if (dist::CmdDType(req.cmd) != static_cast<int>(DType::kFloat32))
    return fail(req, Name(wire_key) + ": rows of another dtype than float32");
  const int workers = range_.node->num_workers();
  for (const rw::PushCount& c : body.counts)
    if (!IsJobWorker(c.worker, workers))
      return fail(req, "a push count of node id " + std::to_string(c.worker) +
                           ", which is not a worker of this job");
  if (body.seq < p.changes) return srv->Respond(req);  // held: a new primary sending it again
  if (body.seq > p.changes) {
    // dist_async: a copy overtaken by a later, smaller one (bounded: one per worker).
    if (config_.sync || p.ahead.count(body.seq) ||
        p.ahead.size() >= static_cast<size_t>(std::max(workers, 1)))
      return fail(req, "change " + std::to_string(body.seq) + " of " + Name(wire_key) +
                           " before change " + std::to_string(p.changes));
    PSKV_DEBUG(range_.node->Tag() << ": " << Name(wire_key) << ": change " << body.seq
                                  << " kept until the one at step " << p.changes);
    p.ahead.emplace(body.seq, std::move(req));
    return;
  }
  if (std::string why = ApplyCopyNow(wire_key, p, req, srv); !why.empty())
    return fail(req, Name(wire_key) + ": " + why);
  while (!p.ahead.empty() && p.ahead.begin()->first == p.changes) {
    KVRequest next = std::move(p.ahead.begin()->second);
    p.ahead.erase(p.ahead.begin());
    if (std::string why = ApplyCopyNow(wire_key, p, next, srv); !why.empty())
      fail(next, Name(wire_key) + ": " + why);
  }
}

std::string EmbeddingServer::ApplyCopyNow(int64_t wire_key, Part& p, const KVRequest& req,
                                          KVServer* srv) {
  rw::EmbeddingRound body;
  ew::PushRows rows;
  try {  // checked on arrival: these do not throw
    body = rw::ParseEmbeddingRound(req.msg.body);
    if (body.restore.empty())
      rows = ew::DecodePush(ValuesOf(req.msg), p.table->config().width, Owner());
  } catch (const std::exception& e) {
    return e.what();
  }
  if (!body.restore.empty()) {
    try {  // the primary's restore, from the same files: refused here only if they differ
      RestorePart(p, wire_key, body.restore);
    } catch (const std::exception& e) {
      PSKV_ERROR(range_.node->Tag()
                 << ": the replicated restore from " << body.restore << " failed: " << e.what());
      return std::string("the restore failed on a replica: ") + e.what();
    }
  } else {
    try {  // the primary's update (same part, same pushes): refused here only if they differ
      p.table->Push(p.step, rows.ids.data(), static_cast<int64_t>(rows.ids.size()),
                    rows.grads.data());
    } catch (const std::exception& e) {
      PSKV_ERROR(range_.node->Tag() << ": the replicated update at step " << p.step
                                    << " failed to apply: " << e.what());
      return std::string("the update failed to apply on a replica: ") + e.what();
    }
    ++p.step;
    if (config_.sync) p.round.Advance();  // as on the primary (its round numbers, for messages)
  }
  ++p.changes;
  for (const rw::PushCount& c : body.counts)
    if (c.count) p.applied_push[c.worker] = c.count;
  if (rep_.replicas >= 2) {
    // This copy may be promoted while another missed this change (the dead primary
    // sent it here only): kept for TakeLastChanges (the request's buffers, no copy).
    // Sync: a part's next change leaves only once every copy acknowledged this one;
    // async: a worker has one push of a table unanswered.
    const size_t keep =
        config_.sync ? 1 : static_cast<size_t>(std::max(range_.node->num_workers(), 1));
    p.kept.push_back(std::make_shared<const Message>(req.msg));
    while (p.kept.size() > keep) p.kept.pop_front();
  }
  srv->Respond(req);  // acknowledged once applied
  return {};
}

std::vector<std::vector<std::shared_ptr<const Message>>> EmbeddingServer::TakeLastChanges() {
  std::vector<Part*> parts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [wk, p] : parts_) parts.push_back(p.get());
  }
  std::vector<std::vector<std::shared_ptr<const Message>>> out;
  for (Part* p : parts) {
    std::lock_guard<std::mutex> lk(p->mu);
    if (p->kept.empty()) continue;
    out.emplace_back(p->kept.begin(), p->kept.end());
    p->kept.clear();
  }
  return out;
}

}  // namespace pskv
