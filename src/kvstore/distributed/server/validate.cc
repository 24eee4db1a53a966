// Pass 1 of a data request: every key is checked before any is applied.
#include "kvstore/distributed/server/validate.h"

#include <climits>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/range_store.h"

namespace pskv {

using dist::Kind;

KeyRange::KeyRange(int rank, int num_servers)
    : begin_(KVWorker::ServerRange(rank, num_servers).first),
      end_(KVWorker::ServerRange(rank, num_servers).second),
      max_chunks_(dist::MaxChunks(num_servers)) {}

bool KeyRange::WireKeyOf(uint64_t ps_key, int64_t* wire_key) const {
  if (ps_key < begin_ || ps_key >= end_) return false;
  const int64_t key = static_cast<int64_t>(ps_key - begin_);
  if ((static_cast<uint64_t>(key) & 0xffffffff) > static_cast<uint64_t>(INT32_MAX) ||
      dist::ChunkOf(key) >= max_chunks_)
    return false;
  *wire_key = key;
  return true;
}

std::optional<Failure> RangeStore::Validate(const KVRequest& req, std::vector<Item>* items) {
  const Message& m = req.msg;
  const Kind kind = dist::CmdKind(req.cmd);
  const int dt = dist::CmdDType(req.cmd);
  if (!IsValidDType(dt) ||
      (kind != Kind::kDense && kind != Kind::kInit && kind != Kind::kCompressed))
    return Failure{ErrorKind::kInvalid,
                   "malformed data request (cmd " + std::to_string(req.cmd) + ")"};
  const DType dtype = static_cast<DType>(dt);
  const KeyRange range = range_.keys();
  items->reserve(m.num_keys());
  // The keys of a request ascend: a shard's next key is usually the successor of the
  // one found there before (a fused message of consecutive keys): no tree search.
  std::vector<KeyState*> last(keys_.size(), nullptr);
  // An init of a key held already is a retry (its primary died before answering it,
  // after this copy applied it) when the key holds the same push of the same worker;
  // anything else is a second init of the key.
  const InitOrigin origin = kind == Kind::kInit && replicated_
                                ? InitOriginOf(req, m.num_keys(), node_->num_workers())
                                : InitOrigin{};
  auto find = [&](int64_t key) -> KeyState* {
    KeyState*& prev = last[ShardOf(key)];
    KeyState* st = prev && prev->next && prev->next->wire_key == key ? prev->next : FindKey(key);
    if (st) {
      prev = st;
      if (st->next)  // the next key's state, likely needed: all its cache lines
        for (size_t b = 0; b < sizeof(KeyState); b += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(st->next) + b);
    }
    return st;
  };
  uint64_t off = 0;
  for (uint32_t i = 0; i < m.num_keys(); ++i) {
    const uint64_t ps_key = m.key_ptr()[i], len = m.len_ptr()[i];
    const uint64_t key_off = off;
    off += len;
    if (i > 0 && ps_key <= m.key_ptr()[i - 1])
      return Failure{ErrorKind::kInvalid, "the keys of a request must be strictly ascending"};
    int64_t key = 0;
    if (!range.WireKeyOf(ps_key, &key))
      return Failure{ErrorKind::kInvalid,
                     "key " + std::to_string(ps_key) + " does not belong to " + node_->Tag()};
    if (sparse_.Holds(key))
      return Failure{ErrorKind::kUsage, "key " + std::to_string(dist::KeyOf(key)) +
                                            " is row_sparse: it is pushed as row_sparse and read "
                                            "with row_sparse_pull, never as a dense array"};
    KeyState* st = find(key);
    if (kind == Kind::kInit) {
      if (st && !AlreadyApplied(st->applied_push, origin.worker, origin.counts, i))
        return Failure{ErrorKind::kKey, "duplicate init of key " + std::to_string(key)};
      if (len % DTypeSize(dtype))
        return Failure{ErrorKind::kShape, "init value size is not a whole number of elements"};
    } else if (auto bad = CheckKey(req, dtype, key, st, len)) {
      return bad;
    }
    items->push_back({key, key_off, len, st});
  }
  return std::nullopt;
}

// A push, pull or push-pull of an existing key.
std::optional<Failure> RangeStore::CheckKey(const KVRequest& req, DType dtype, int64_t key,
                                            const KeyState* st, uint64_t len) {
  if (!st)
    return Failure{ErrorKind::kKey, "key " + std::to_string(key) + " has not been inited on " +
                                        node_->Tag() + " (call Init before push or pull)" +
                                        ChunkHint(key)};
  if (dtype != st->value.dtype())
    return Failure{ErrorKind::kShape, "key " + std::to_string(key) + " holds " +
                                          DTypeName(st->value.dtype()) +
                                          " but the request carries " + DTypeName(dtype)};
  if (!req.push) return std::nullopt;
  return CheckPush(req, key, *st, len);
}

std::optional<Failure> RangeStore::CheckPush(const KVRequest& req, int64_t key, const KeyState& st,
                                             uint64_t len) {
  const bool compressed = dist::CmdKind(req.cmd) == Kind::kCompressed;
  if (compressed && !config_.compressor)
    return Failure{ErrorKind::kUsage,
                   "a compressed push arrived but compression is not configured"};
  const uint64_t want =
      compressed ? static_cast<uint64_t>(config_.compressor->CompressedBytes(st.value.size()))
                 : st.value.nbytes();
  if (len != want)
    return Failure{ErrorKind::kShape, "The value size cannot be changed: key " +
                                          std::to_string(key) + " takes " + std::to_string(want) +
                                          " bytes on " + node_->Tag() + ", got " +
                                          std::to_string(len) + ChunkHint(key)};
  if (config_.sync) {
    std::string why =
        st.round.Refusal(req.sender, config_.done_workers, "key " + std::to_string(key),
                         [this](int id) { return node_->NodeName(id); });
    if (!why.empty()) return Failure{ErrorKind::kUsage, std::move(why)};
  } else if (!config_.OptimizerOf(key)) {
    return Failure{ErrorKind::kUsage,
                   "Updater needs to be set for async mode: call SetOptimizer "
                   "on the dist_async store before pushing"};
  }
  return std::nullopt;
}

// A chunked key the workers cut differently: name the setting, not just the key.
std::string RangeStore::ChunkHint(int64_t key) {
  const int64_t unchunked = key & ((int64_t{1} << dist::kChunkShift) - 1);
  if (dist::ChunkOf(key) == 0 && !FindKey(dist::ChunkKey(unchunked, 1))) return "";
  return "; key " + std::to_string(dist::KeyOf(key)) +
         " travels in wire chunks: every node of a job must use the same "
         "PSKV_WIRE_CHUNK_BYTES";
}

}  // namespace pskv
