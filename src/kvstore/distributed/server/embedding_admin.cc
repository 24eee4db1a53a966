// EmbeddingServer's administrative requests (kEmbeddingAdmin; embedding_server.h):
// save, restore and export of this server's part of a table, and its counters.
//
// Files: this server writes and reads them itself (embedding/table_files.h names
// them), so the directory must be one this server can reach: shared by the servers
// for a restore onto another server count (each part reads every saved part's
// files). A save runs under the part's mutex between rounds: the file is the part
// after a whole round, and pushes of the next round wait for it.
#include <algorithm>
#include <cstring>
#include <memory>

#include "embedding/stats_fields.h"
#include "embedding/table_files.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/embedding_server.h"
#include "kvstore/distributed/wire/embedding_admin_codec.h"
#include "pskv/error.h"

namespace pskv {

namespace {

namespace ea = dist::embedding_admin;

std::string Reply(const int64_t (&w)[ea::kReplyWords]) {
  return std::string(reinterpret_cast<const char*>(w), ea::kReplyBytes);
}

}  // namespace

uint64_t EmbeddingServer::RestorePart(Part& p, int64_t wire_key, const std::string& dir) const {
  const auto key = static_cast<int>(dist::KeyOf(wire_key));
  const embedding::SavedTable saved = embedding::FindSaved(dir, key);
  auto t = std::make_unique<embedding::Table>(p.table->config());
  t->Restore(saved.chains, static_cast<uint32_t>(range_.index()),
             static_cast<uint32_t>(range_.node->num_servers()));
  p.table = std::move(t);
  p.step = saved.step;
  p.save_seq = saved.seq;
  return saved.seq;
}

std::string EmbeddingServer::WritePart(Part& p, int64_t wire_key, const ea::Request& a) const {
  const auto key = static_cast<int>(dist::KeyOf(wire_key));
  const auto shard = static_cast<uint32_t>(range_.index());
  const auto shards = static_cast<uint32_t>(range_.node->num_servers());
  embedding::MakeDir(a.path);
  if (a.op == ea::Op::kExport) {
    const std::string path = a.path + "/" + embedding::ExportFileName(key, shard, shards);
    p.table->ExportRows(path);
    return path;
  }
  const uint64_t seq =
      std::max(p.save_seq, embedding::LastSavedSeq(a.path, key, shard, shards)) + 1;
  const bool full = a.op == ea::Op::kSaveFull;
  const std::string path =
      a.path + "/" + embedding::SaveFileName(key, seq, shard, shards, p.step, full);
  if (full) {
    p.table->SaveFull(path, shard, shards);
  } else {
    p.table->SaveDelta(path);
  }
  p.save_seq = seq;
  return path;
}

void EmbeddingServer::Admin(int64_t wire_key, Part& p, KVRequest&& req, KVServer* srv,
                            std::unique_lock<std::mutex>& lk) {
  const std::string what = "embedding table " + std::to_string(dist::KeyOf(wire_key));
  if (!req.pull || !req.push)
    return srv->RespondError(req, ErrorKind::kInvalid, "malformed embedding admin request");
  ea::Request a;
  try {
    const Message& m = req.msg;
    if (m.h.vals_len > 24 + ea::kMaxPath)  // before anything is reserved
      throw InvalidArgument("embedding admin request of " + std::to_string(m.h.vals_len) +
                            " bytes");
    std::string v(m.h.vals_len, '\0');
    m.CopyVals(0, v.size(), v.data());
    a = ea::Decode(dist::sparse_wire::Source::Of(v));
  } catch (const std::exception& e) {
    return srv->RespondError(req, KindOf(e), what + ": " + e.what());
  }
  const auto shard = static_cast<uint32_t>(range_.index());
  int64_t w[ea::kReplyWords] = {};
  std::string reply;
  if (a.op == ea::Op::kStats) {
    const embedding::TableStats s = p.table->Stats();
    size_t i = 0;
    embedding::ForEachStat([&](const char*, const char*, auto field, auto) {
      w[i++] = static_cast<int64_t>(s.*field);
    });
    w[ea::kPartStep] = p.step;
    reply = Reply(w);
  } else if (a.op == ea::Op::kOutcome) {
    if (p.admin_ticket != a.ticket)
      return srv->RespondError(req, ErrorKind::kUsage,
                               what + ": the checkpoint call " + std::to_string(a.ticket) +
                                   " of rank 0 did not reach server " + std::to_string(shard) +
                                   " (it holds " + std::to_string(p.admin_ticket) +
                                   "): call Save, Restore and Export on every worker");
    if (!p.admin_error.empty()) return srv->RespondError(req, p.admin_error_kind, p.admin_error);
    reply = p.admin_reply;
  } else {
    p.admin_ticket = a.ticket;
    p.admin_error.clear();
    try {
      if (a.op == ea::Op::kRestore) {
        if (p.round.open())
          throw UsageError(what + ": a restore while a push round is open (" +
                           std::to_string(p.round.num_pushed()) +
                           " workers pushed): call Restore on every worker between steps");
        w[ea::kSeq] = static_cast<int64_t>(RestorePart(p, wire_key, a.path));
        w[ea::kRows] = p.table->Stats().live;
      } else {
        const std::string path = WritePart(p, wire_key, a);
        if (a.op != ea::Op::kExport) w[ea::kSeq] = static_cast<int64_t>(p.save_seq);
        w[ea::kBytes] = static_cast<int64_t>(embedding::FileBytes(path));
        w[ea::kRows] = p.table->Stats().live;
      }
      w[ea::kStep] = p.step;
      p.admin_reply = reply = Reply(w);
      // Replicated: the range's other copies restore from the same files before the
      // answer (a failover right after it serves the restored rows).
      if (a.op == ea::Op::kRestore)
        return Restored(wire_key, p, a.path, std::move(req), std::move(reply), srv, lk);
    } catch (const std::exception& e) {
      p.admin_error_kind = KindOf(e);
      p.admin_error = what + " on server " + std::to_string(shard) + ": " + e.what();
      return srv->RespondError(req, p.admin_error_kind, p.admin_error);
    }
  }
  lk.unlock();
  auto out = std::make_shared<std::string>(std::move(reply));
  Frame f;
  f.data = out->data();
  f.size = out->size();
  f.owner = out;
  srv->Respond(req, {req.msg.key_ptr()[0]}, std::move(f), {ea::kReplyBytes});
}

}  // namespace pskv
