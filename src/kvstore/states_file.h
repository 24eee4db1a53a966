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
// A dist store's file holds whole keys, whatever the number of servers that saved it
// (kvstore/states_layout.h gathers and re-slices them):
//   "PSKVDST3", then one blob whose keys are the store's keys, each state the whole
//   key's (its parts on the servers put back together): the same content as a local
//   store's blob, so any store can load it.
// Read only: files of every server's blob, in server order, loadable only into a job
// with the same number of servers (or re-sliced, states_transfer.h):
//   "PSKVDST2", u32 server count n, n u64 blob sizes, the blobs;
//   "PSKVDST1", u32 n, then n times (u32 size, blob).
//
// A states file (what KVStore::SaveOptimizerStates and Trainer::SaveStates write, for
// every store type) wraps its content in a checksum:
//   "PSKVSUM1", the content (a blob, or "PSKVDST3" and its blob), u32 CRC32C of the
//   content
// so that any change of a byte (a bad disk, a cut copy) is refused, naming the file,
// instead of loading as other states. Files written before it (the content alone, and
// the per-server files) are read without a check.
//
// Decoders never trust a count: every size is checked against the bytes left before
// anything is allocated, so a hostile or cut file is an error, not a huge allocation.
// Errors: IOError (bad magic, inconsistent sizes) or ProtocolError (cut short).
#pragma once

#include <cstdint>
#include <functional>
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

/// The head of a whole-keys dist file; its blob follows.
inline constexpr std::string_view kWholeKeysMagic = "PSKVDST3";

/// The blob's bytes; arrays are copied from their handles.
std::string EncodeBlob(const Blob& blob);
/// Parses a blob, or the blob of a "PSKVDST3" file (IOError: bad magic or trailing
/// bytes; ProtocolError: cut short).
Blob DecodeBlob(std::string_view bytes);

/// A float32 array inside encoded bytes: `n` elements at `data`; n == -1: none.
struct ArrayView {
  const char* data = nullptr;
  int64_t n = -1;
};
/// One key of a blob, its arrays in place.
struct KeyView {
  int64_t key = 0;
  int64_t t = 0;
  std::vector<ArrayView> slots;
  ArrayView master;
};
/// A blob indexed without copying its arrays: the views point into the bytes given
/// to IndexBlob and live as long as they do.
struct BlobView {
  bool dumped = false;
  std::string config;
  int64_t num_update = 0;
  std::vector<KeyView> keys;
};
/// Indexes a blob (or a "PSKVDST3" file's blob) with DecodeBlob's checks and errors.
BlobView IndexBlob(std::string_view bytes);

/// Writes a blob piece by piece to a sink (a file, a buffer), so that big states are
/// never held twice: Head once, then per key Key, each slot's and the master's
/// ArrayHead, each followed by that many float32 elements of Bytes. The caller writes
/// exactly the keys and arrays it announced (DecodeBlob checks them).
class BlobWriter {
 public:
  using Sink = std::function<void(const char* p, size_t n)>;
  explicit BlobWriter(Sink out) : out_(std::move(out)) {}
  void Head(bool dumped, const std::string& config, int64_t num_update, uint64_t num_keys);
  void Key(int64_t key, int64_t t, uint32_t num_slots);
  void ArrayHead(int64_t n);  // -1: none
  void Bytes(const void* p, size_t n) { out_(static_cast<const char*>(p), n); }

 private:
  template <typename T>
  void Put(T v) {
    out_(reinterpret_cast<const char*>(&v), sizeof v);
  }
  Sink out_;
};
/// Marks an encoded "PSKVOPT1" blob as dumped ("PSKVOPT2") in place; others unchanged.
void MarkDumped(std::string* blob);

/// The head of a dist file for blobs of `sizes` bytes (the blobs follow it).
std::string EncodeDistHeader(const std::vector<uint64_t>& sizes);

/// A parsed dist file: its blobs as views into the bytes given to DecodeDistFile.
struct DistFile {
  int version = 0;  // 1 or 2 (per-server files)
  std::vector<std::string_view> blobs;
};
/// Whether `bytes` start like a per-server dist file ("PSKVDST1" or "PSKVDST2").
bool IsPerServerDistFile(std::string_view bytes);
/// Parses a per-server dist file (either version). IOError naming `name` and the reason
/// ("bad magic", "truncated", "sizes do not add up", ...).
DistFile DecodeDistFile(std::string_view bytes, const std::string& name);

/// Writes states file `fname` (the checksum around the content that `write` gives its
/// sink) atomically: to a temporary file, renamed once complete. IOError naming the
/// file if it cannot be written; what `write` throws is passed on (no file then).
void WriteStatesFile(const std::string& fname,
                     const std::function<void(const BlobWriter::Sink&)>& write);
/// The content of states file `fname`, its checksum checked (a file without one:
/// as it is). IOError naming the file: cannot open or read it, not a states file,
/// cut short, or its checksum does not match (the file is corrupt).
std::string ReadStatesFile(const std::string& fname);

/// The configuration text saved in file `fname` with dump_optimizer (a blob, a
/// whole-keys dist file, or a per-server dist file whose first blob is read), or nullopt when it
/// carries none (not dumped). Reads the file once in pieces (its checksum checked) and keeps only
/// the text. IOError naming the file: as ReadStatesFile (not a states file included).
std::optional<std::string> ReadDumpedConfigText(const std::string& fname);

}  // namespace pskv::states
