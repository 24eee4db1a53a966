// How a dist store's dense keys are cut into messages and paced on the wire, from the
// store's options (PSKV_LINK_RATE, PSKV_WIRE_AHEAD_BYTES) and the node table (hosts):
// read once by the store and its parts, so that they agree.
#pragma once

#include <cstdint>

#include "kvstore/dist_protocol.h"
#include "pskv/options.h"

namespace pskv::dist {

struct WireShape {
  /// PushPacer's `ahead` for a key's pushes: PSKV_WIRE_AHEAD_BYTES, or 0 (none) where
  /// the kernel paces the connections (PSKV_LINK_RATE, distributed/link_pacing.h): each
  /// flow then keeps its share's rate by itself, and a lane's answers, paced too,
  /// would come too slowly to release the next piece in time (a co-located
  /// server's lane of one chunk alternated push and answer, twice the step).
  uint64_t push_ahead = 0;
  /// Chunks per big slice (PlaceDense): finer where the kernel paces the connections
  /// (PSKV_LINK_RATE: links are the limit, and a step's answers lag its pushes by
  /// the biggest message; dist_protocol.h, kFineChunksPerSlice), each chunk then its
  /// own message (message_bytes 1); else the chunk size alone, and a server's
  /// consecutive chunks go in messages of up to the chunk size (message_bytes 0).
  int64_t chunks_per_slice = 1;
  uint64_t message_bytes = 0;

  /// `paced`: distributed/link_pacing.h, LinksPaced (a stated or a learned rate).
  static WireShape Of(const Options& o, bool paced) {
    return {paced ? 0 : static_cast<uint64_t>(o.wire_ahead_bytes), paced ? kFineChunksPerSlice : 1,
            paced ? uint64_t{1} : 0};
  }
};

}  // namespace pskv::dist
