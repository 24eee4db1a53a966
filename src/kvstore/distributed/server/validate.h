// What a server accepts as a key, and how a refused request is described.
//
// KeyRange is the one place that says which ps keys are this server's wire keys
// (dist_protocol.h): inside the server's ps-key range, with a key part that is a
// non-negative int32 and a chunk number below MaxChunks. Every handler asks it;
// handlers narrow it further (row_sparse and optimizer-state requests carry chunk 0).
#pragma once

#include <cstdint>
#include <string>

#include "ps/kv_app.h"

namespace pskv {

/// Why a request is refused: the error kind the worker sees and the message.
struct Failure {
  ErrorKind kind = ErrorKind::kGeneric;
  std::string message;
};

class KeyRange {
 public:
  KeyRange(int rank, int num_servers);
  /// True if `ps_key` is a valid wire key of this server; sets *wire_key to it.
  bool WireKeyOf(uint64_t ps_key, int64_t* wire_key) const;
  /// A wire key for dispatch only (0 for a ps key below the range; the handler
  /// validates it): never fails.
  int64_t DispatchKey(uint64_t ps_key) const { return ps_key < begin_ ? 0 : ps_key - begin_; }

 private:
  uint64_t begin_, end_;
  uint64_t max_chunks_;
};

}  // namespace pskv
