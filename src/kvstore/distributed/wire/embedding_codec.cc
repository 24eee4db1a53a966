#include "kvstore/distributed/wire/embedding_codec.h"

#include <cstring>

#include "pskv/embedding.h"
#include "pskv/error.h"

namespace pskv::dist::embedding_wire {

namespace {

char* PutU64(char* p, uint64_t v) {
  std::memcpy(p, &v, 8);
  return p + 8;
}

uint64_t U64(const Source& v, uint64_t offset) {
  uint64_t x;
  v.copy(offset, 8, reinterpret_cast<char*>(&x));
  return x;
}

void CheckOwner(const std::vector<uint64_t>& ids, Owner owner) {
  if (owner.servers == 0) return;
  for (uint64_t id : ids)
    if (EmbeddingShardOf(id, owner.servers) != owner.shard)
      throw KeyError("embedding id " + std::to_string(static_cast<int64_t>(id)) +
                     " belongs to server " + std::to_string(EmbeddingShardOf(id, owner.servers)) +
                     ", not to server " + std::to_string(owner.shard));
}

}  // namespace

char* EncodePush(char* dst, uint64_t width, const uint64_t* ids, uint64_t n, const float* grads) {
  dst = PutU64(dst, n);
  dst = PutU64(dst, width);
  if (n) std::memcpy(dst, ids, n * 8);
  dst += n * 8;
  if (n) std::memcpy(dst, grads, n * width * 4);
  return dst + n * width * 4;
}

void AppendPull(std::string* out, const uint64_t* ids, uint64_t n) {
  const size_t at = out->size();
  out->resize(at + PullBytes(n));
  char* p = PutU64(out->data() + at, n);
  if (n) std::memcpy(p, ids, n * 8);
}

PushRows DecodePush(const Source& v, int64_t width, Owner owner) {
  if (v.size < 16)
    throw InvalidArgument("embedding push: " + std::to_string(v.size) +
                          " bytes, shorter than its 16-byte head");
  const uint64_t n = U64(v, 0), w = U64(v, 8);
  if (w != static_cast<uint64_t>(width))
    throw ShapeError("embedding push of rows of width " + std::to_string(w) +
                     " to a table of width " + std::to_string(width));
  // n rows of 8 + 4w bytes each must be exactly what follows the head (checked by
  // division: no product of hostile numbers can overflow).
  const uint64_t per = 8 + 4 * w;
  if ((v.size - 16) % per != 0 || (v.size - 16) / per != n)
    throw InvalidArgument("embedding push: " + std::to_string(n) + " rows of width " +
                          std::to_string(w) + " disagree with its " + std::to_string(v.size) +
                          " bytes");
  PushRows out;
  out.ids.resize(n);
  if (n) v.copy(16, n * 8, reinterpret_cast<char*>(out.ids.data()));
  CheckOwner(out.ids, owner);
  out.grads.resize(n * w);
  if (n) v.copy(16 + n * 8, n * w * 4, reinterpret_cast<char*>(out.grads.data()));
  return out;
}

std::vector<uint64_t> DecodePull(const Source& v, Owner owner) {
  if (v.size < 8)
    throw InvalidArgument("embedding pull: " + std::to_string(v.size) +
                          " bytes, shorter than its 8-byte head");
  const uint64_t n = U64(v, 0);
  if ((v.size - 8) % 8 != 0 || (v.size - 8) / 8 != n)
    throw InvalidArgument("embedding pull: " + std::to_string(n) + " ids disagree with its " +
                          std::to_string(v.size) + " bytes");
  std::vector<uint64_t> ids(n);
  if (n) v.copy(8, n * 8, reinterpret_cast<char*>(ids.data()));
  CheckOwner(ids, owner);
  return ids;
}

std::string DecodeCreate(const Source& v) {
  if (v.size == 0 || v.size > kMaxConfig)
    throw InvalidArgument("embedding create: a configuration of " + std::to_string(v.size) +
                          " bytes (1 to " + std::to_string(kMaxConfig) + " expected)");
  std::string s(v.size, '\0');
  v.copy(0, v.size, s.data());
  return s;
}

}  // namespace pskv::dist::embedding_wire
