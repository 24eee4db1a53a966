// Optimizer-states files: the one codec of their formats (little-endian).
//
// An optimizer's blob (Optimizer::SaveStates; a local store's or a Trainer's file is
// one blob, a server sends one per dist store):
//   "PSKVOPT1" | "PSKVOPT2"   (2: dumped, the loader adopts the saved configuration,
//                              MXNet's save_optimizer_states(dump_optimizer=True))
//   u32 length + config text  (OptimizerConfig::Serialize)
//   i64 update count, u64 key count, then per key:
//     i64 key, i64 step count, u32 slot count, the slots, the float32 master copy;
//     each an array: i64 element count (-1: none), then that many float32.
// A dist store's file wraps every server's blob, in server order:
//   "PSKVDST2", u32 server count n, n u64 blob sizes, the blobs;
//   "PSKVDST1" (read only), u32 n, then n times (u32 size, blob).
//
// Decoders never trust a count: every size is checked against the bytes left before
// anything is allocated, so a hostile or cut file is an error, not a huge allocation.
// Errors: IOError (bad magic, inconsistent sizes) or ProtocolError (cut short).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pskv/ndarray.h"

namespace pskv::states {

/// One key's optimizer state in a blob.
struct KeyStates {
  int64_t key = 0;
  int64_t t = 0;               // updates applied to the key
  std::vector<NDArray> slots;  // float32 1-D arrays (or empty handles)
  NDArray master;              // float32 master copy, or empty
};

/// A decoded optimizer blob.
struct Blob {
  bool dumped = false;  // "PSKVOPT2"
  std::string config;   // OptimizerConfig::Serialize text
  int64_t num_update = 0;
  std::vector<KeyStates> keys;
};

/// The blob's bytes; arrays are copied from their handles.
std::string EncodeBlob(const Blob& blob);
/// Parses a blob (IOError: bad magic or trailing bytes; ProtocolError: cut short).
Blob DecodeBlob(std::string_view bytes);
/// Marks an encoded "PSKVOPT1" blob as dumped ("PSKVOPT2") in place; others unchanged.
void MarkDumped(std::string* blob);

/// The head of a dist file for blobs of `sizes` bytes (the blobs follow it).
std::string EncodeDistHeader(const std::vector<uint64_t>& sizes);

/// A parsed dist file: its blobs as views into the bytes given to DecodeDistFile.
struct DistFile {
  int version = 0;  // 1 or 2
  std::vector<std::string_view> blobs;
};
/// Parses a dist file (either version). IOError naming `name` and the reason
/// ("bad magic", "truncated", "sizes do not add up", ...).
DistFile DecodeDistFile(std::string_view bytes, const std::string& name);

/// The configuration text saved in file `fname` with dump_optimizer (a blob, or a dist
/// file whose first blob is read), or nullopt when it carries none (not dumped, or not
/// a states file). Reads only the file's head. IOError: cannot open, or cut short.
std::optional<std::string> ReadDumpedConfigText(const std::string& fname);

}  // namespace pskv::states
