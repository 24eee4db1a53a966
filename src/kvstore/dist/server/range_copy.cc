// DistServer: copying a key range to a spare server that joins it, and installing
// that copy on the spare (dist_server.h, CopyTo; docs/fault-tolerance.md, "Back to
// full strength").
//
// The primary takes the copy in an exclusive section of its shard pool: every key is
// between two of its rounds (or async applies), so a key's value, open round number,
// push counts and the optimizer's states (per key, and the update count of the
// learning-rate schedule) belong together. In the same section it adds the spare to
// the range's replication targets (Replicator::AddCopying): every change after the
// copy is sent to the spare too, and answered only once the spare acknowledged it.
//
// Messages to one node may arrive out of their send order (small ones overtake big
// ones waiting for the send window, docs/design.md "Priorities on the wire"), so the
// spare installs parts in any order after the kBegin (small, sent first) and counts
// them; the copy is installed once kEnd and every part announced by kBegin arrived.
// Changes that arrive before that (rounds, inits, states loads from the primary) are
// acknowledged at once and applied, in arrival order, right after the install: they
// all follow the copy, and the spare is not a replica (cannot be promoted) until it
// has applied them and reported the install to the scheduler.
#include <algorithm>
#include <climits>
#include <cstring>

#include "common/logging.h"
#include "kvstore/dist/server/dist_server.h"
#include "kvstore/dist_protocol.h"
#include "pskv/error.h"

namespace pskv {

using dist::CopyPart;
using dist::Kind;

namespace {

// Value bytes per kKeys message and bytes per kStates message, at most (a key of
// more travels alone; the transport cuts any message into kChunkBytes frames).
constexpr uint64_t kCopyMessageBytes = uint64_t{4} << 20;

ByteWriter CopyBody(uint64_t version, CopyPart part, int range) {
  ByteWriter w;
  w.Put<uint64_t>(version);
  w.Put<uint8_t>(static_cast<uint8_t>(part));
  w.Put<int32_t>(range);
  return w;
}

Message CopyMessage(ByteWriter body, std::vector<uint64_t> keys, std::vector<uint64_t> lens,
                    Frame vals) {
  Message m;
  m.h.flags = kPush;
  m.h.head = dist::MakeCmd(Kind::kRangeCopy, DType::kUInt8);
  m.h.num_keys = static_cast<uint32_t>(keys.size());
  uint64_t total = 0;
  for (uint64_t l : lens) total += l;
  m.h.vals_len = total;
  m.keys = U64Frame(keys);
  m.lens = U64Frame(lens);
  if (total) m.vals = std::move(vals);
  m.body = body.Take();
  return m;
}

// The bound on a copy's optimizer states for its values: every slot and master copy
// is float32, one per weight element (at most 8 per element of a 2-byte weight with
// two slots and a master copy), plus a header per key.
uint64_t StatesBound(uint64_t value_bytes, uint64_t keys) {
  return 8 * value_bytes + 4096 * (keys + 1) + (uint64_t{1} << 20);
}

}  // namespace

void DistServer::CopyTo(int to) {
  const int range = RangeIndex();
  const int S = node_->num_servers();
  const uint64_t carrier = dist::PsKey(dist::WireKey(0, 0), range, S);
  const auto started = Clock::now();
  struct Totals {
    uint64_t bytes = 0;
    size_t keys = 0;
  };
  auto totals = std::make_shared<Totals>();
  std::string refused;
  pool_.Exclusive([&] {
    if (sparse_.any()) {
      refused = "it holds row_sparse keys, whose copy is not built";
      return;
    }
    const uint64_t version = replicator_->version();
    struct KeyCopy {
      int64_t key;
      ReplyOwner value;  // its token: a later update of the key copies the value first
      int64_t round;
      std::map<int, uint64_t> applied;
    };
    std::vector<KeyCopy> keys;
    uint64_t value_bytes = 0;
    ForEachKey([&](int64_t k, KeyState& st) {
      keys.push_back({k, ReplyOwner{st.value, st.token}, st.round.round(), st.applied_push});
      value_bytes += st.value.nbytes();
    });
    std::map<int, std::string> states;
    for (auto& [store, opt] : optimizers_)
      if (opt) states[store] = opt->SaveStates(/*dump_optimizer=*/true);
    std::vector<Message> out;
    ByteWriter begin = CopyBody(version, CopyPart::kBegin, range);
    begin.Put<uint8_t>(sync_ ? 1 : 0);
    begin.Put<uint64_t>(keys.size());
    begin.Put<uint64_t>(value_bytes);
    begin.Put<uint32_t>(static_cast<uint32_t>(states.size()));
    for (auto& [store, blob] : states) {
      begin.Put<int32_t>(store);
      begin.Put<uint64_t>(blob.size());
    }
    out.push_back(CopyMessage(std::move(begin), {carrier}, {0}, {}));
    for (size_t i = 0; i < keys.size();) {
      ByteWriter body = CopyBody(version, CopyPart::kKeys, range);
      std::vector<uint64_t> ps, lens;
      std::vector<Frame::Piece> pieces;
      auto owners = std::make_shared<std::vector<ReplyOwner>>();
      uint64_t bytes = 0;
      for (; i < keys.size() &&
             (ps.empty() || bytes + keys[i].value.value.nbytes() <= kCopyMessageBytes);
           ++i) {
        const KeyCopy& k = keys[i];
        body.Put<int64_t>(k.key);
        body.Put<int32_t>(static_cast<int32_t>(k.value.value.dtype()));
        body.Put<int64_t>(k.round);
        body.Put<uint32_t>(static_cast<uint32_t>(k.applied.size()));
        for (auto& [id, count] : k.applied) {
          body.Put<int32_t>(id);
          body.Put<uint64_t>(count);
        }
        ps.push_back(dist::PsKey(k.key, range, S));
        lens.push_back(k.value.value.nbytes());
        pieces.push_back({static_cast<const char*>(k.value.value.raw()), k.value.value.nbytes()});
        owners->push_back(k.value);
        bytes += k.value.value.nbytes();
      }
      Frame vals = Frame::Gather(std::move(pieces), owners);
      out.push_back(CopyMessage(std::move(body), std::move(ps), std::move(lens), std::move(vals)));
    }
    for (auto& [store, blob] : states) {
      auto shared = std::make_shared<std::string>(std::move(blob));
      for (uint64_t off = 0; off < shared->size(); off += kCopyMessageBytes) {
        const uint64_t n = std::min<uint64_t>(kCopyMessageBytes, shared->size() - off);
        ByteWriter body = CopyBody(version, CopyPart::kStates, range);
        body.Put<int32_t>(store);
        body.Put<uint64_t>(off);
        out.push_back(CopyMessage(std::move(body), {carrier}, {n},
                                  Frame::Of(shared->data() + off, n, shared)));
      }
    }
    out.push_back(CopyMessage(CopyBody(version, CopyPart::kEnd, range), {carrier}, {0}, {}));
    totals->keys = keys.size();
    for (auto& m : out) totals->bytes += m.h.vals_len + m.body.size();
    const size_t last = out.size() - 1;
    for (size_t i = 0; i < out.size(); ++i) {
      const bool end = i == last;
      replicator_->Send(
          {to}, std::move(out[i]), [this, to, range, end, totals, started](std::exception_ptr e) {
            if (e) {
              try {
                std::rethrow_exception(e);
              } catch (const std::exception& ex) {
                PSKV_WARN(node_->Tag() << ": copy of key range " << range << " to "
                                       << node_->NodeName(to) << ": " << ex.what());
              }
              return;
            }
            if (!end) return;
            const auto ms =
                std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started)
                    .count();
            PSKV_WARN(node_->Tag()
                      << ": " << node_->NodeName(to) << " installed its copy of key range " << range
                      << " (" << totals->keys << " keys, " << totals->bytes << " bytes) " << ms
                      << " ms after the copy was taken");
          });
    }
    // Every change after this section follows the copy to the spare.
    replicator_->AddCopying(range, to);
  });
  if (!refused.empty()) {
    PSKV_WARN(node_->Tag() << ": key range " << range << " is not copied to " << node_->NodeName(to)
                           << ": " << refused
                           << "; the range stays with one copy fewer (docs/fault-tolerance.md)");
    return;
  }
  PSKV_WARN(node_->Tag() << ": sending " << node_->NodeName(to) << " a copy of key range " << range
                         << " (" << totals->keys << " keys, " << totals->bytes
                         << " bytes); training goes on meanwhile");
}

bool DistServer::TakenByCopy(KVRequest& req) {
  const Kind kind = dist::CmdKind(req.cmd);
  if (kind != Kind::kRangeCopy) {
    if (!copy_in_ || !IsServerId(req.sender)) return false;
    // A change of the range from its primary, after the copy: acknowledged now,
    // applied once the copy is installed.
    server_->Respond(req);
    if (!copy_in_->failed) copy_in_->held.push_back(std::move(req));
    return true;
  }
  std::string why;
  CopyPart part = CopyPart::kBegin;
  ByteReader body(req.msg.body.data(), req.msg.body.size(), "range copy");
  try {
    body.Get<uint64_t>();  // the sender's range-table version (NotFromPrimary)
    const uint8_t p = body.Get<uint8_t>();
    const int range = body.Get<int32_t>();
    if (p > static_cast<uint8_t>(CopyPart::kEnd)) why = "an unknown part";
    part = static_cast<CopyPart>(p);
    if (why.empty() && range != RangeIndex())
      why = "a part of key range " + std::to_string(range) + " sent to key range " +
            std::to_string(RangeIndex());
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (why.empty() && !IsServerId(req.sender)) why = "not from a server";
  if (why.empty()) why = NotFromPrimary(req);
  if (why.empty() && part == CopyPart::kBegin) {
    copy_in_ = std::make_unique<CopyIn>();
    copy_in_->from = req.sender;
    copy_in_->started = Clock::now();
  }
  if (why.empty() && (!copy_in_ || copy_in_->from != req.sender))
    why = "a part of a copy that did not begin";
  if (why.empty() && copy_in_->failed) why = "the copy was refused before";
  if (why.empty()) why = pool_.Exclusive([&] { return InstallPart(req, part, body); });
  if (!why.empty()) {
    PSKV_ERROR(node_->Tag() << ": cannot install the copy of key range " << RangeIndex() << " from "
                            << node_->NodeName(req.sender) << ": " << why
                            << "; this server does not join the range");
    if (copy_in_) {
      copy_in_->failed = true;
      copy_in_->held.clear();
    }
    server_->RespondError(req, ErrorKind::kInvalid, "copy of key range: " + why);
    return true;
  }
  CopyIn& in = *copy_in_;
  in.bytes += req.msg.h.vals_len + req.msg.body.size();
  if (part == CopyPart::kEnd)
    in.end = std::make_unique<KVRequest>(std::move(req));  // answered once installed
  else
    server_->Respond(req);
  const bool complete = in.end && in.keys == in.got_keys && in.value_bytes == in.got_values &&
                        std::all_of(in.states.begin(), in.states.end(), [&](const auto& s) {
                          return in.states_got[s.first] == s.second.size();
                        });
  if (!complete) return true;
  if (std::string err = pool_.Exclusive([&] { return InstallEnd(); }); !err.empty()) {
    PSKV_ERROR(node_->Tag() << ": cannot install the copy of key range " << RangeIndex() << " from "
                            << node_->NodeName(in.from) << ": " << err
                            << "; this server does not join the range");
    in.failed = true;
    in.held.clear();
    server_->RespondError(*in.end, ErrorKind::kInvalid, "copy of key range: " + err);
    return true;
  }
  std::unique_ptr<CopyIn> done = std::move(copy_in_);
  server_->Respond(*done->end);
  PSKV_WARN(
      node_->Tag()
      << ": installed the copy of key range " << RangeIndex() << " from "
      << node_->NodeName(done->from) << " (" << done->keys << " keys, " << done->bytes << " bytes, "
      << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - done->started).count()
      << " ms); applying the " << done->held.size() << " change(s) that followed it");
  for (auto& held : done->held) Handle(std::move(held));
  node_->ReportRangeCopied(RangeIndex(), done->from, done->bytes);
  return true;
}

std::string DistServer::InstallPart(const KVRequest& req, CopyPart part, ByteReader& body) {
  CopyIn& in = *copy_in_;
  const Message& m = req.msg;
  try {
    switch (part) {
      case CopyPart::kBegin: {
        in.sync = body.Get<uint8_t>() != 0;
        in.keys = body.Get<uint64_t>();
        in.value_bytes = body.Get<uint64_t>();
        const uint32_t stores = body.Get<uint32_t>();
        if (in.value_bytes > kMaxVals || in.keys > in.value_bytes + 1 || stores > dist::kMaxStores)
          return "a copy of " + std::to_string(in.keys) + " keys and " +
                 std::to_string(in.value_bytes) + " value bytes is beyond the bounds";
        const uint64_t bound = StatesBound(in.value_bytes, in.keys);
        std::vector<std::pair<int, uint64_t>> sizes;
        uint64_t all = 0;
        for (uint32_t i = 0; i < stores; ++i) {
          const int store = body.Get<int32_t>();
          const uint64_t bytes = body.Get<uint64_t>();
          all += std::min(bytes, bound + 1);
          sizes.emplace_back(store, bytes);
        }
        if (body.remaining() != 0) return "a malformed kBegin";
        // Sizes checked before anything is reserved.
        if (all > bound)
          return std::to_string(all) + " bytes of optimizer states for " +
                 std::to_string(in.value_bytes) + " value bytes (at most " + std::to_string(bound) +
                 ")";
        for (auto& [store, bytes] : sizes) {
          if (!OptimizerOf(dist::WireKey(store, 0)))
            return "store " + std::to_string(store) +
                   " has optimizer states on the primary but no optimizer here";
          in.states[store].resize(bytes);
          in.states_got[store] = 0;
        }
        return {};
      }
      case CopyPart::kKeys:
        return InstallKeys(req, body);
      case CopyPart::kStates: {
        const int store = body.Get<int32_t>();
        const uint64_t off = body.Get<uint64_t>();
        auto it = in.states.find(store);
        if (it == in.states.end() || m.num_keys() != 1) return "states of an unannounced store";
        const uint64_t n = m.len_ptr()[0];
        if (off > it->second.size() || n > it->second.size() - off ||
            in.states_got[store] + n > it->second.size())
          return "states beyond the size announced";
        m.CopyVals(0, n, it->second.data() + off);
        in.states_got[store] += n;
        return {};
      }
      case CopyPart::kEnd:
        return {};
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "an unknown part";
}

std::string DistServer::InstallKeys(const KVRequest& req, ByteReader& body) {
  CopyIn& in = *copy_in_;
  const Message& m = req.msg;
  uint64_t off = 0;
  for (uint32_t i = 0; i < m.num_keys(); ++i) {
    const int64_t key = body.Get<int64_t>();
    const int dt = body.Get<int32_t>();
    const int64_t round = body.Get<int64_t>();
    const uint32_t workers = body.Get<uint32_t>();
    std::map<int, uint64_t> applied;
    for (uint32_t w = 0; w < workers; ++w) {
      const int id = body.Get<int32_t>();
      const uint64_t count = body.Get<uint64_t>();
      if (!IsJobWorker(id)) return "a push count of node " + std::to_string(id);
      applied[id] = count;
    }
    int64_t wk = 0;
    const uint64_t len = m.len_ptr()[i];
    if (!Range().WireKeyOf(m.key_ptr()[i], &wk) || wk != key)
      return "key " + std::to_string(key) + " is not of this range";
    if (!IsValidDType(dt) || len % DTypeSize(static_cast<DType>(dt)) || round < 1)
      return "key " + std::to_string(dist::KeyOf(key)) + ": a malformed value";
    if (++in.got_keys > in.keys || len > in.value_bytes - in.got_values)
      return "more keys or value bytes than announced";
    if (FindKey(key) || sparse_.Holds(key))
      return "key " + std::to_string(dist::KeyOf(key)) + " twice";
    in.got_values += len;
    const DType dtype = static_cast<DType>(dt);
    KeyState& st = AddKey(key, NDArray({static_cast<int64_t>(len / DTypeSize(dtype))}, dtype));
    m.CopyVals(off, len, static_cast<char*>(st.value.raw()));
    st.round.StartAt(round);
    st.applied_push = std::move(applied);
    off += len;
  }
  if (body.remaining() != 0) return "a malformed kKeys";
  return {};
}

// Exclusive: every part arrived; loads the optimizer states (which replace the
// optimizers' configuration with the primary's) and the mode.
std::string DistServer::InstallEnd() {
  CopyIn& in = *copy_in_;
  try {
    for (auto& [store, blob] : in.states) {
      Optimizer* optimizer = OptimizerOf(dist::WireKey(store, 0));
      optimizer->LoadStates(blob, [this, store](int64_t key) -> std::pair<int64_t, bool> {
        const int64_t k = key & 0xffffffff;
        const uint64_t chunk = static_cast<uint64_t>(key) >> 32;
        if (key < 0 || k > INT32_MAX || chunk >= dist::MaxChunks(node_->num_servers()))
          return {-1, false};
        const KeyState* st =
            FindKey(dist::ChunkKey(dist::WireKey(store, static_cast<int>(k)), chunk));
        if (!st) return {-1, false};
        return {st->value.size(), IsLowPrecision(st->value.dtype())};
      });
    }
  } catch (const std::exception& e) {
    return std::string("its optimizer states do not load: ") + e.what();
  }
  sync_ = in.sync;
  return {};
}

DistServer::KeyState& DistServer::AddKey(int64_t wire_key, NDArray value) {
  KeyState st;
  st.wire_key = wire_key;
  st.value = std::move(value);
  auto& keys = keys_[ShardOf(wire_key)];
  auto at = keys.emplace(wire_key, std::move(st)).first;
  auto after = std::next(at);
  at->second.next = after == keys.end() ? nullptr : &after->second;
  if (at != keys.begin()) std::prev(at)->second.next = &at->second;
  return at->second;
}

}  // namespace pskv
