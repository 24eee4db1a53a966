// How a dist store's dense keys are cut into messages and paced on the wire, from the
// store's options (PSKV_LINK_RATE, PSKV_WIRE_AHEAD_BYTES) and the node table (hosts):
// read once by the store and its parts. The workers of a job must agree on the chunks
// (each a ps key: chunks_per_slice); how many of a server's consecutive chunks share a
// message (MessageBytes, per push) may differ between them and between pushes: a
// server's rounds are per key, and it answers a message once all its keys' completed.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kvstore/dist_protocol.h"
#include "ps/link_rate_share.h"
#include "pskv/options.h"

namespace pskv::dist {

/// Where the kernel paces the connections, a push's messages carry about this much
/// of the link's rate (a server's consecutive chunks together): each message costs
/// the sender, the server and the answer's receiver about 25 µs of a core (measured at
/// 1 Gbit/s, 4 MiB, k = 2 on 2 cores: 192 messages per push and worker took 1.66 x the
/// bound, whole messages of 128 KiB 1.23 x, unpaced 1.32 x; docs/performance.md).
/// Below about 260 Mbit/s (two of the least fine chunks, kMinFineChunkBytes, a
/// millisecond) every chunk is still a message of its own.
constexpr uint64_t kPacedMessageUs = 1000;

struct WireShape {
  /// PushPacer's `ahead` for a key's pushes: PSKV_WIRE_AHEAD_BYTES, or 0 (none) where
  /// the kernel paces the connections (PSKV_LINK_RATE, distributed/link_pacing.h): each
  /// flow then keeps its share's rate by itself, and a lane's answers, paced too,
  /// would come too slowly to release the next piece in time (a co-located
  /// server's lane of one chunk alternated push and answer, twice the step).
  uint64_t push_ahead = 0;
  /// Chunks per big slice (PlaceDense): finer where the kernel paces the connections
  /// (PSKV_LINK_RATE: links are the limit, and a step's answers lag its pushes by
  /// the biggest message; dist_protocol.h, kFineChunksPerSlice), and a server's
  /// consecutive chunks then go in messages of kPacedMessageUs of the link's rate
  /// (MessageBytes); else the chunk size alone, and a server's consecutive chunks go
  /// in messages of up to the chunk size.
  int64_t chunks_per_slice = 1;
  bool paced = false;
  /// With replicas (PSKV_REPLICAS) a chunk each: a push-pull's answer comes from the
  /// copy on the worker's host only for a message of one key (kv_worker_failover.cc),
  /// and the links' plan counts on it (server_shares.h, LinkLoads).
  bool one_key = false;
  uint64_t stated_rate = 0;                // PSKV_LINK_RATE > 0 (bytes/s); 0: learned
  uint64_t most_bytes = 0;                 // PSKV_WIRE_CHUNK_BYTES: a more urgent key can overtake
  const LinkRateShare* learned = nullptr;  // the node's learned rate (outlives the store)

  /// KVWorker::Push's `message_bytes` for a push now: 0 (up to the chunk size) unpaced
  /// and while no rate is learned yet (the connections are not paced: where the
  /// cores, not the link, hold them, none may be: 1 Gbit/s, 4 MiB on 2 cores);
  /// paced, kPacedMessageUs of the link's rate (stated, or the one the node's pacer
  /// paces for now: LinkRateShare::PacedFor), at most the chunk size and at least one
  /// chunk. Split keeps each within an 8th of the server's part (kMessagesPerPart).
  uint64_t MessageBytes() const {
    if (!paced) return 0;
    if (one_key) return 1;
    const uint64_t rate = stated_rate > 0 ? stated_rate : learned ? learned->PacedFor() : 0;
    if (rate == 0) return 0;  // not paced (yet): as unpaced
    const uint64_t bytes = rate / (1'000'000 / kPacedMessageUs);
    return std::max<uint64_t>(1, most_bytes > 0 ? std::min(bytes, most_bytes) : bytes);
  }

  /// `paced`: distributed/link_pacing.h, LinksPaced (a stated or a learned rate).
  /// `learned`: the node's LinkRateShare.
  static WireShape Of(const Options& o, bool paced, const LinkRateShare* learned) {
    WireShape w;
    w.push_ahead = paced ? 0 : static_cast<uint64_t>(o.wire_ahead_bytes);
    w.chunks_per_slice = paced ? kFineChunksPerSlice : 1;
    w.paced = paced;
    w.one_key = o.replicas > 0;
    w.stated_rate = o.link_rate > 0 ? static_cast<uint64_t>(o.link_rate) : 0;  // -1: learned
    w.most_bytes = static_cast<uint64_t>(std::max<int64_t>(0, o.wire_chunk_bytes));
    w.learned = learned;
    return w;
  }
};

}  // namespace pskv::dist
