// The row_sparse values of a dist store's data requests: the one codec of their
// layout, used by workers (encode) and servers (decode).
//
// Every row_sparse request carries one key per server: the part of a table the
// server holds (its row range, dist::PlaceRows). Values, little-endian u64 fields,
// row ids local to the server's range:
//   init  push       [rows][row_size] then rows*row_size elements (the whole slice)
//   push  push       [n][row_size][n ids, ascending][n*row_size elements]
//   pull  push+pull  [n][n ids, ascending]; the reply is n*row_size elements
//
// Decoders treat the bytes as hostile: every count is checked against the value's
// size (and the key's rows) before anything is allocated; ids must be ascending,
// unique and in range. Errors are typed for the reply: InvalidArgument (malformed),
// ShapeError (sizes disagree with the key), KeyError (bad row ids).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "pskv/ndarray.h"

namespace pskv::dist::sparse_wire {

/// Bytes of one server's part of each value kind (`row_bytes` = row_size * dtype size).
inline uint64_t InitBytes(uint64_t rows, uint64_t row_bytes) {
  return 16 + rows * row_bytes;
}
inline uint64_t PushBytes(uint64_t n, uint64_t row_bytes) {
  return 16 + n * (8 + row_bytes);
}
inline uint64_t PullBytes(uint64_t n) {
  return 8 + n * 8;
}

/// Writes an init part at `dst` (InitBytes of room): `rows` rows of `row_size`
/// elements from `data`. Returns the end of what was written.
char* EncodeInit(char* dst, uint64_t rows, uint64_t row_size, const void* data, uint64_t row_bytes);
/// Writes a push part at `dst` (PushBytes of room): the n rows `ids[0..n)` (global ids,
/// stored as ids - `base`) whose values are the n rows at `data`.
char* EncodePush(char* dst, uint64_t row_size, const int64_t* ids, uint64_t n, int64_t base,
                 const void* data, uint64_t row_bytes);
/// Appends a pull part to `out`: the n rows `ids[0..n)` (global ids, stored as ids - `base`).
void AppendPull(std::string* out, const int64_t* ids, uint64_t n, int64_t base);

/// Where a decoder reads a value from: its size and a copy of any of its ranges (a
/// received message's values may lie in several frames).
struct Source {
  uint64_t size = 0;
  std::function<void(uint64_t offset, uint64_t len, char* out)> copy;
  /// A contiguous value (views `bytes`, which must outlive the Source).
  static Source Of(std::string_view bytes);
};

/// A decoded init part's geometry; its rows*row_size elements start at byte 16.
struct InitHead {
  uint64_t rows = 0, row_size = 0;
};
/// Checks an init part of elements of `elem_size` bytes: InvalidArgument if shorter
/// than its head, ShapeError if empty or its size disagrees with the head.
InitHead DecodeInitHead(const Source& v, uint64_t elem_size);

/// A decoded push part: local row ids and their rows (an aligned copy).
struct PushRows {
  std::vector<int64_t> ids;
  NDArray data;  // ids.size() * row_size elements of the key's dtype
};
/// Decodes a push part for a key of `key_rows` rows of `row_size` elements of `dtype`.
PushRows DecodePush(const Source& v, int64_t key_rows, int64_t row_size, DType dtype);

/// Decodes a pull part for a key of `key_rows` rows: the local row ids asked for.
/// InvalidArgument if malformed, KeyError if the ids are not ascending, unique, in range.
std::vector<int64_t> DecodePull(const Source& v, int64_t key_rows);

}  // namespace pskv::dist::sparse_wire
