// What the dist KVStore's workers and servers say to each other on top of the
// KV messaging layer: data-request encoding, commands, and key placement.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvstore/distributed/wire/replication_wire.h"  // CopyPart
#include "ps/kv_app.h"
#include "pskv/ndarray.h"

namespace pskv::dist {

/// Data request head: dtype code in bits 0-7, kind in bits 8-15.
/// kStates moves one server's optimizer states as chunked data (any size; command
/// replies are capped at kMaxBody): a pull of the server's first ps key returns the
/// snapshot taken by kStatesSize, a push to it loads states.
/// kSparseInit / kSparsePush / kSparsePull carry one row_sparse key per server
/// (distributed/server/sparse_server.h describes their values).
enum class Kind : int {
  kDense = 0,
  kInit = 1,
  kCompressed = 2,
  kStates = 3,
  kSparseInit = 4,
  kSparsePush = 5,
  kSparsePull = 6,
  // Between servers; bodies: distributed/wire/replication_wire.h (the one codec of them).
  // primary -> replica: a completed sync round's sum of one key (dtype: the sum's);
  // body: its round and the pushing workers' counts (and the answers left to it)
  kReplicate = 7,
  // primary -> replica: async pushes as the primary applied them (dtype: the
  // gradients'; values: each key's gradient); body: the worker, per key its apply
  // sequence, the update count its rate came from and the push count
  kReplicateAsync = 8,
  // primary -> replica: a completed sync round of a row_sparse key (dtype: the key's):
  // value: the round's summed rows in the kSparsePush layout (sparse_codec.h); body:
  // its round, the update count its rate came from and the workers' push counts
  kReplicateSparse = 9,
  // primary -> a spare joining its key range (docs/fault-tolerance.md, "Back to full
  // strength"): the range's state, in parts (CopyPart): kBegin announces the keys,
  // value bytes and optimizer-states sizes (one key, no value); kKeys carries keys'
  // values (a row_sparse key's whole table); kStates a piece of a store's
  // Optimizer::SaveStates(dump) blob; kEnd is answered once the copy is installed
  kRangeCopy = 10,
  // Dynamic embedding tables (include/pskv/embedding.h; values:
  // distributed/wire/embedding_codec.h, served by distributed/server/embedding_server.h),
  // one key per server: the table's part there (every server holds one).
  kEmbeddingCreate = 11,  // value: the table's configuration payload
  kEmbeddingPush = 12,    // value: ids and gradients
  kEmbeddingPull = 13,    // value: ids; reply: rows and versions
  // primary -> replica: one update of a table's part as the primary applied it (a sync
  // round's concatenated pushes in rank order, or one async push); value: the push
  // layout of embedding_codec.h; body: its step and the workers' push counts
  // (replication_wire.h, EmbeddingRound)
  kReplicateEmbedding = 14,
  // value: save, restore, export or counters of a table's part; reply: their outcome
  // (distributed/wire/embedding_admin_codec.h)
  kEmbeddingAdmin = 15,
};
inline int MakeCmd(Kind k, DType t) {
  return (static_cast<int>(k) << 8) | static_cast<int>(t);
}
inline Kind CmdKind(int cmd) {
  return static_cast<Kind>((cmd >> 8) & 0xff);
}
inline int CmdDType(int cmd) {
  return cmd & 0xff;
}

/// Commands (worker -> every server).
/// Bodies and replies are payloads of distributed/wire/kv_payload.h (named after each
/// command).
enum Command : int {
  kSetMode = 1,         ///< body = mode payload (sync or async)
  kSetOptimizer = 2,    ///< body = optimizer config payload
  kSetCompression = 3,  ///< body = compression setting payload
  kWorkerDone = 4,      ///< a worker finished; no more pushes from it; empty body
  kHasOptimizer = 8,    ///< reply = has-optimizer payload
  /// (to server 0) body = init report payload: entries (wire id, name, dtype, shape)
  /// for the keys of an Init call, or failures (wire id, message) when rank 0 could
  /// not initialise a key. Never fails because of a mismatch: the first conflict per
  /// key is recorded for kCheckInit.
  kReportInit = 9,
  /// (to server 0, after Init's barrier) body = check-init ids payload: error reply
  /// (the same for every worker) if the workers' reports for these keys disagree.
  kCheckInit = 10,
  kBarrierState = 11,  ///< body = barrier state payload: the sender enters/leaves Barrier()
  kRoundStatus = 12,   ///< reply = round status payload (open sync rounds, deadlocks)
  kStatesSize = 13,    ///< snapshot this server's optimizer states; reply = states size payload
};

/// One server's part of a key: `len` elements starting at element `offset`.
struct Slice {
  int server;
  int64_t offset, len;
};

/// Units of a server's share of a big key: shares are whole numbers summing to this.
constexpr int64_t kShareUnits = int64_t{1} << 20;

/// Key placement (docs/design.md, "Key placement"): a key of fewer than `bound`
/// elements lives on one server chosen by (key * 9973) mod S (64-bit arithmetic,
/// MXNet used int); a bigger key is cut into S contiguous slices, one per server in
/// rank order. Evenly (`shares` empty): slice i has round(N(i+1)/S) - round(N i/S)
/// elements. With `shares` (one per server, summing to kShareUnits:
/// kvstore/distributed/server_shares.h): slice i ends at floor(N C(i+1) / kShareUnits),
/// C(i) being the sum of the first i shares; a server with share 0 gets an empty
/// slice. Whole-number arithmetic: every worker computes the same slices.
inline std::vector<Slice> PlaceKey(int key, int64_t n, int num_servers, int64_t bound,
                                   const std::vector<int64_t>& shares = {}) {
  std::vector<Slice> out;
  if (n < bound || num_servers == 1) {
    out.push_back({static_cast<int>((static_cast<int64_t>(key) * 9973) % num_servers), 0, n});
    return out;
  }
  if (!shares.empty()) {
    // floor(n c / U) without overflow: n = qU + r, so n c / U = q c + r c / U.
    auto cut = [&](int64_t c) {
      return (n / kShareUnits) * c + (n % kShareUnits) * c / kShareUnits;
    };
    int64_t c = 0;
    for (int i = 0; i < num_servers; ++i) {
      const int64_t begin = cut(c);
      c += shares[static_cast<size_t>(i)];
      out.push_back({i, begin, cut(c) - begin});
    }
    return out;
  }
  for (int i = 0; i < num_servers; ++i) {
    auto at = [&](int j) {
      return static_cast<int64_t>(std::llround(static_cast<double>(n) * j / num_servers));
    };
    out.push_back({i, at(i), at(i + 1) - at(i)});
  }
  return out;
}

/// One server's rows of a row_sparse key: rows [begin, begin + count).
struct RowRange {
  int server;
  int64_t begin, count;
};

/// Row placement of a row_sparse key of `rows` rows of `row_size` elements (spec
/// 4.5.3): a table of at least `bound` elements is sliced by row range over all
/// servers (server i owns llround(R(i+1)/S) - llround(R i/S) rows); a smaller one
/// lives on server (key * 9973) mod S. Servers with no rows are left out.
inline std::vector<RowRange> PlaceRows(int key, int64_t rows, int64_t row_size, int num_servers,
                                       int64_t bound) {
  std::vector<RowRange> out;
  if (rows * row_size < bound || num_servers == 1) {
    out.push_back({static_cast<int>((static_cast<int64_t>(key) * 9973) % num_servers), 0, rows});
    return out;
  }
  auto at = [&](int j) {
    return static_cast<int64_t>(std::llround(static_cast<double>(rows) * j / num_servers));
  };
  for (int i = 0; i < num_servers; ++i)
    if (at(i + 1) > at(i)) out.push_back({i, at(i), at(i + 1) - at(i)});
  return out;
}

/// The ps key of `key` on server `rank`. `key` may carry a store id (WireKey).
inline uint64_t PsKey(int64_t key, int rank, int num_servers) {
  return KVWorker::ServerRange(rank, num_servers).first + static_cast<uint64_t>(key);
}

// Several dist stores of one worker process share its node (trainer branch): the
// key k of store s travels as the 64-bit WireKey (s << 32) | k, and the commands
// that concern one store (optimizer, states) carry s in bits 8.. of the head.
// Store 0 is exactly the single-store encoding.
constexpr int kMaxStores = 1 << 16;
inline int64_t WireKey(int store, int key) {
  return (static_cast<int64_t>(store) << 32) | static_cast<int64_t>(key);
}
inline int StoreOf(int64_t wire_key) {
  return static_cast<int>((wire_key >> 32) & 0xffff);
}
inline int KeyOf(int64_t wire_key) {
  return static_cast<int>(wire_key & 0xffffffff);
}
inline int StoreCommand(int cmd, int store) {
  return cmd | (store << 8);
}

// Wire chunks (PSKV_WIRE_CHUNK_BYTES): a dense key's slice on a server bigger than
// the chunk size is cut into chunks of contiguous elements, chunk c travelling as
// the wire key (c << 48) | WireKey (chunk 0 is the unchunked encoding) — its own ps
// key, merged, updated and answered by the server on its own. Chunk c's ps key
// must stay inside the server's key range, which bounds the chunks per slice.
constexpr int kChunkShift = 48;
inline int64_t ChunkKey(int64_t wire_key, uint64_t chunk) {
  return wire_key | static_cast<int64_t>(chunk << kChunkShift);
}
inline uint64_t ChunkOf(int64_t wire_key) {
  return static_cast<uint64_t>(wire_key) >> kChunkShift;
}
/// Chunks a slice may have with `num_servers` servers (at least 1).
inline uint64_t MaxChunks(int num_servers) {
  const auto r = KVWorker::ServerRange(0, num_servers);
  return std::max<uint64_t>(1, std::min<uint64_t>((r.second - r.first) >> kChunkShift, 1u << 16));
}
/// The optimizer's state key of a wire key: the key for chunk 0, else
/// (chunk << 32) | key (Optimizer::Update gives it the key's multipliers).
inline int64_t OptimizerKey(int64_t wire_key) {
  const uint64_t c = ChunkOf(wire_key);
  return c == 0 ? KeyOf(wire_key)
                : static_cast<int64_t>((c << 32) | static_cast<uint32_t>(KeyOf(wire_key)));
}

/// One chunk of a key: `len` elements from element `offset`, on `server`.
struct Chunk {
  int server;
  int64_t offset, len;
  uint64_t index;  // chunk number within its server's slice
};
/// The lengths of the chunks a slice of `len` elements travels in, at most `per`
/// elements each (per >= 1) and at most `max_chunks` of them. A slice longer than
/// `per` starts and ends with a ramp of smaller chunks, per/8, per/4, per/2 from
/// either end (a step is taken while at least four times its length stays between
/// the two ramps), and its middle is cut into balanced chunks of at most `per`: a sync server can
/// answer a chunk only once every worker's copy of it arrived, so the first chunk's
/// size sets when the answers start (the pipeline's fill) and the last one's how
/// long they run after the last push (its drain); docs/design.md, "Wire chunks".
/// Where the ramp would need more than `max_chunks`, balanced chunks only.
inline std::vector<int64_t> ChunkLengths(int64_t len, int64_t per, uint64_t max_chunks) {
  if (len <= 0) return {};
  per = std::max<int64_t>(1, per);
  max_chunks = std::max<uint64_t>(1, max_chunks);
  if (len <= per) return {len};
  auto balanced = [](int64_t total, int64_t n, std::vector<int64_t>* out) {
    const int64_t each = (total + n - 1) / n;
    for (int64_t at = 0; at < total; at += each) out->push_back(std::min(each, total - at));
  };
  std::vector<int64_t> ramp;  // one end's chunks, smallest first
  int64_t middle = len;
  for (int64_t step = per / 8; step >= 1 && step < per && middle >= 6 * step; step *= 2) {
    ramp.push_back(step);
    middle -= 2 * step;
  }
  const int64_t n_middle = (middle + per - 1) / per;
  std::vector<int64_t> out;
  if (2 * ramp.size() + static_cast<uint64_t>(n_middle) > max_chunks) {
    balanced(len, std::min<int64_t>((len + per - 1) / per, static_cast<int64_t>(max_chunks)), &out);
    return out;
  }
  out.assign(ramp.begin(), ramp.end());
  balanced(middle, n_middle, &out);
  out.insert(out.end(), ramp.rbegin(), ramp.rend());
  return out;
}

/// Finer chunks where links are the limit (`PSKV_LINK_RATE` set; ChunkElems). With
/// sync rounds on links that are the limit, a server's answers run one round of
/// chunks behind the pushes and cannot catch up, so a step takes about (1 + the
/// biggest chunk / its slice) times the links' bound (docs/performance.md, "Across
/// hosts"): a 1 MiB slice in chunks of at most 256 KiB, 1.2 times.
constexpr int64_t kFineChunksPerSlice = 32;
/// Chunks are cut no smaller than this for kFineChunksPerSlice (ramps aside).
constexpr int64_t kMinFineChunkBytes = int64_t{16} << 10;

/// The chunk size, in elements, of a slice of `len` elements: `chunk_bytes` (0: the
/// whole slice). With `per_slice` > 1, a slice bigger than `chunk_bytes` is cut
/// finer, into chunks of a `per_slice`-th of it where that is smaller, but not below
/// kMinFineChunkBytes; a slice of at most `chunk_bytes` stays one chunk.
inline int64_t ChunkElems(int64_t len, int64_t elem_bytes, int64_t chunk_bytes,
                          int64_t per_slice = 1) {
  if (chunk_bytes <= 0) return std::max<int64_t>(1, len);
  elem_bytes = std::max<int64_t>(1, elem_bytes);
  int64_t bytes = chunk_bytes;
  if (per_slice > 1 && len > chunk_bytes / elem_bytes)
    bytes = std::min(chunk_bytes, std::max(kMinFineChunkBytes, len / per_slice * elem_bytes));
  return std::max<int64_t>(1, bytes / elem_bytes);
}

/// Cuts each slice into chunks of ChunkElems(`per_slice`) by ChunkLengths, at most
/// MaxChunks(num_servers) per slice. Empty slices are left out. The workers of a job
/// must cut alike (the same `chunk_bytes` and `per_slice`): a chunk is a ps key.
inline std::vector<Chunk> ChunkSlices(const std::vector<Slice>& slices, int64_t elem_bytes,
                                      int64_t chunk_bytes, int num_servers, int64_t per_slice = 1) {
  std::vector<Chunk> out;
  for (const Slice& s : slices) {
    if (s.len == 0) continue;
    const int64_t per = ChunkElems(s.len, elem_bytes, chunk_bytes, per_slice);
    uint64_t c = 0;
    int64_t at = 0;
    for (int64_t len : ChunkLengths(s.len, per, MaxChunks(num_servers))) {
      out.push_back({s.server, s.offset + at, len, c++});
      at += len;
    }
  }
  return out;
}

}  // namespace pskv::dist
