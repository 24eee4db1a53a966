// The values of a dist store's dynamic embedding requests (include/pskv/embedding.h):
// the one codec of their layout, used by workers (encode) and servers (decode).
//
// Every embedding request carries one key per server: the table's part there (the
// ids with EmbeddingShardOf(id, servers) == that server). Values, little-endian:
//   create  push       an embedding-table payload (kv_payload.h), at most kMaxConfig bytes
//   push    push       [u64 n][u64 width][n u64 ids][n * width float32]
//   pull    push+pull  [u64 n][n u64 ids]; the reply is [n * width float32][n i64 versions]
// A replicated round (kReplicateEmbedding) has the push layout.
//
// Decoders treat the bytes as hostile: every count is checked against the value's
// size before anything is allocated, the width against the table's, and each id
// against the server it was sent to. Errors are typed for the reply:
// InvalidArgument (malformed), ShapeError (a width other than the table's), KeyError
// (an id that belongs to another server).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvstore/distributed/wire/sparse_codec.h"  // Source

namespace pskv::dist::embedding_wire {

using Source = sparse_wire::Source;

/// The largest create value (an embedding-table payload).
constexpr uint64_t kMaxConfig = 1 << 20;

inline uint64_t PushBytes(uint64_t n, uint64_t width) {
  return 16 + n * (8 + 4 * width);
}
inline uint64_t PullBytes(uint64_t n) {
  return 8 + n * 8;
}
/// The bytes of a pull's reply for n ids.
inline uint64_t PullReplyBytes(uint64_t n, uint64_t width) {
  return n * (4 * width + 8);
}

/// Writes a push part at `dst` (PushBytes of room): ids[0..n) and their rows `grads`
/// (n * width float32). Returns the end of what was written.
char* EncodePush(char* dst, uint64_t width, const uint64_t* ids, uint64_t n, const float* grads);
/// Appends a pull part to `out`.
void AppendPull(std::string* out, const uint64_t* ids, uint64_t n);

/// Who may hold an id: this server's index among `servers` (each id must satisfy
/// EmbeddingShardOf(id, servers) == shard); servers == 0 skips the check.
struct Owner {
  uint32_t shard = 0, servers = 0;
};

/// A decoded push part.
struct PushRows {
  std::vector<uint64_t> ids;
  std::vector<float> grads;  // ids.size() * width
};
/// Decodes a push part for a table of `width`.
PushRows DecodePush(const Source& v, int64_t width, Owner owner);
/// Decodes a pull part: the ids asked for.
std::vector<uint64_t> DecodePull(const Source& v, Owner owner);
/// A create value: the configuration payload's bytes (size checked first).
std::string DecodeCreate(const Source& v);

}  // namespace pskv::dist::embedding_wire
