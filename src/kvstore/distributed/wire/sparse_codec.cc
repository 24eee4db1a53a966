#include "kvstore/distributed/wire/sparse_codec.h"

#include <cstring>

#include "pskv/error.h"

namespace pskv::dist::sparse_wire {

namespace {

char* PutU64(char* p, uint64_t v) {
  std::memcpy(p, &v, 8);
  return p + 8;
}

uint64_t U64At(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Ids must be ascending, unique and in [0, rows).
bool ValidIds(const std::vector<int64_t>& ids, int64_t rows) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= rows || (i && ids[i] <= ids[i - 1])) return false;
  return true;
}

}  // namespace

char* EncodeInit(char* dst, uint64_t rows, uint64_t row_size, const void* data,
                 uint64_t row_bytes) {
  dst = PutU64(dst, rows);
  dst = PutU64(dst, row_size);
  if (rows) std::memcpy(dst, data, rows * row_bytes);
  return dst + rows * row_bytes;
}

char* EncodePush(char* dst, uint64_t row_size, const int64_t* ids, uint64_t n, int64_t base,
                 const void* data, uint64_t row_bytes) {
  dst = PutU64(dst, n);
  dst = PutU64(dst, row_size);
  for (uint64_t j = 0; j < n; ++j) dst = PutU64(dst, static_cast<uint64_t>(ids[j] - base));
  if (n) std::memcpy(dst, data, n * row_bytes);
  return dst + n * row_bytes;
}

void AppendPull(std::string* out, const int64_t* ids, uint64_t n, int64_t base) {
  const size_t at = out->size();
  out->resize(at + PullBytes(n));
  char* p = PutU64(out->data() + at, n);
  for (uint64_t j = 0; j < n; ++j) p = PutU64(p, static_cast<uint64_t>(ids[j] - base));
}

Source Source::Of(std::string_view bytes) {
  Source s;
  s.size = bytes.size();
  s.copy = [bytes](uint64_t offset, uint64_t len, char* out) {
    if (offset > bytes.size() || len > bytes.size() - offset)
      throw InvalidArgument("row_sparse value: read past its end");
    if (len) std::memcpy(out, bytes.data() + offset, len);
  };
  return s;
}

InitHead DecodeInitHead(const Source& v, uint64_t elem_size) {
  if (v.size < 16) throw InvalidArgument("malformed row_sparse init");
  char head[16];
  v.copy(0, 16, head);
  InitHead h{U64At(head), U64At(head + 8)};
  // rows bounded by the size first: no product below can overflow.
  if (h.rows == 0 || h.row_size == 0 || elem_size == 0 ||
      h.rows > (v.size - 16) / elem_size / h.row_size ||
      16 + h.rows * h.row_size * elem_size != v.size)
    throw ShapeError("row_sparse init of " + std::to_string(h.rows) + " rows of " +
                     std::to_string(h.row_size) + " elements does not match its " +
                     std::to_string(v.size) + " bytes");
  return h;
}

PushRows DecodePush(const Source& v, int64_t key_rows, int64_t row_size, DType dtype) {
  if (v.size < 16) throw InvalidArgument("row_sparse push shorter than its header");
  char head[16];
  v.copy(0, 16, head);
  const uint64_t n = U64At(head), u = U64At(head + 8);
  if (u != static_cast<uint64_t>(row_size))
    throw ShapeError("row_sparse push has rows of " + std::to_string(u) +
                     " elements but the key's rows have " + std::to_string(row_size));
  const uint64_t es = DTypeSize(dtype);
  // n is bounded by the key's rows (whose table exists) before any product or allocation.
  if (n > static_cast<uint64_t>(key_rows) || v.size != 16 + n * 8 + n * u * es)
    throw ShapeError("row_sparse push of " + std::to_string(n) + " rows has " +
                     std::to_string(v.size) + " bytes, which does not match rows of " +
                     std::to_string(u) + " " + DTypeName(dtype) + " elements");
  PushRows r;
  r.ids.resize(n);
  if (n) v.copy(16, n * 8, reinterpret_cast<char*>(r.ids.data()));
  if (!ValidIds(r.ids, key_rows))
    throw KeyError("row_sparse push: row ids must be ascending, unique and within the " +
                   std::to_string(key_rows) + " rows held here");
  r.data = NDArray(Shape{static_cast<int64_t>(n * u)}, dtype);
  if (n) v.copy(16 + n * 8, n * u * es, static_cast<char*>(r.data.raw()));
  return r;
}

std::vector<int64_t> DecodePull(const Source& v, int64_t key_rows) {
  uint64_t n = 0;
  if (v.size >= 8) {
    char head[8];
    v.copy(0, 8, head);
    n = U64At(head);
  }
  if (v.size < 8 || n > static_cast<uint64_t>(key_rows) || v.size != PullBytes(n))
    throw InvalidArgument("malformed row_sparse pull");
  std::vector<int64_t> ids(n);
  if (n) v.copy(8, n * 8, reinterpret_cast<char*>(ids.data()));
  if (!ValidIds(ids, key_rows))
    throw KeyError("row ids must be ascending, unique and within the " + std::to_string(key_rows) +
                   " rows held here");
  return ids;
}

}  // namespace pskv::dist::sparse_wire
