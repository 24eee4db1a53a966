// The bodies of the messages servers send each other about a key range: replicated
// changes (primary -> replicas), forwarded inits and copies of a range (primary -> a
// joining spare). The one codec of their layout, used by the sender (Encode*) and the
// receiver (Parse*); the values travel in the message's value frames, not here
// (dist_protocol.h says what each kind's values are).
//
// Little-endian fields; every replicated change starts with the sender's range-table
// version (u64), so that a replica that has not applied the table promoting the
// sender yet still takes its changes:
//   kReplicate        version, round (i64), n (u32), n x push count, a (u32),
//                     a x delegated answer
//   kReplicateSparse  version, round (i64), schedule_at (i64), n (u32), n x push count
//   kReplicateAsync   version, worker (i32), then per key of the message: seq (i64),
//                     schedule_at (i64), push count (u64)
//   kReplicateEmbedding  version, step (i64), n (u32), n x push count
//   forwarded init    worker (i32), then per key of the message its push count (u64)
//   kRangeCopy        version, part (u8, CopyPart), range (i32), then per part:
//     kBegin   sync (u8), keys (u64), value bytes (u64), s (u32), s x (store (i32),
//              optimizer-states bytes (u64))
//     kKeys    per key of the message: wire key (i64), dtype (i32), rows (i64: a
//              row_sparse key's table rows, 0 for a dense key), open round (i64),
//              w (u32), w x push count
//     kStates  store (i32), offset (u64)
//     kEnd     nothing
// where a push count is worker (i32), count (u64) and a delegated answer is worker
// (i32), timestamp (u64), priority (i32), cmd (i32).
//
// Parsers treat the bytes as hostile: every count is checked against the bytes left
// before anything is reserved, and a body that is truncated, longer than its fields or
// of an unknown part is refused with ProtocolError naming the body. They check the
// layout only; what the fields mean (a worker of this job, a key of this range, sizes
// against the announced ones) is the receiver's to check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pskv::dist {

/// The parts of a copy of a key range, in the order they are sent.
enum class CopyPart : uint8_t { kBegin = 0, kKeys = 1, kStates = 2, kEnd = 3 };

namespace replication_wire {

/// A worker's push count: how many pushes of the key it made, this one included.
struct PushCount {
  int32_t worker = 0;
  uint64_t count = 0;
  bool operator==(const PushCount&) const = default;
};

/// A push-pull the primary left to the replica to answer (the worker on its host).
struct DelegatedAnswer {
  int32_t worker = 0;
  uint64_t timestamp = 0;
  int32_t priority = 0;
  int32_t cmd = 0;
  bool operator==(const DelegatedAnswer&) const = default;
};

/// The table version every replicated change starts with.
uint64_t ParseVersion(std::string_view body);
/// `body` (a replicated change's) with its table version replaced by `version`.
std::string WithVersion(std::string_view body, uint64_t version);

/// kReplicate: a dense sync round of one key.
struct Round {
  uint64_t version = 0;
  int64_t round = 0;
  std::vector<PushCount> counts;
  std::vector<DelegatedAnswer> answers;
  bool operator==(const Round&) const = default;
};
std::string EncodeRound(const Round& r);
Round ParseRound(std::string_view body);
/// The round `body` encodes without its delegated answers, under table `version` (a
/// promoted replica sends its last round again: the answers were the old copy's).
std::string RoundAgain(std::string_view body, uint64_t version);

/// kReplicateSparse: a row_sparse sync round of one key.
struct SparseRound {
  uint64_t version = 0;
  int64_t round = 0;
  int64_t schedule_at = 0;
  std::vector<PushCount> counts;
  bool operator==(const SparseRound&) const = default;
};
std::string EncodeSparseRound(const SparseRound& r);
SparseRound ParseSparseRound(std::string_view body);

/// kReplicateEmbedding: one change of a dynamic embedding table's part — an update (a
/// sync round's pushes, or one async push; `counts` of the pushes it holds) or, when
/// `restore` names a directory, a restore from the save there — numbered `seq` (the
/// changes the part applied before it: its order on every copy).
struct EmbeddingRound {
  uint64_t version = 0;
  int64_t seq = 0;
  std::vector<PushCount> counts;
  std::string restore;  // at most kMaxRestorePath bytes, no NUL
  bool operator==(const EmbeddingRound&) const = default;
};
constexpr size_t kMaxRestorePath = 4096;
std::string EncodeEmbeddingRound(const EmbeddingRound& r);
EmbeddingRound ParseEmbeddingRound(std::string_view body);

/// kReplicateAsync: one worker's async pushes, one entry per key of the message.
struct AsyncPush {
  int64_t seq = 0;
  int64_t schedule_at = 0;
  uint64_t count = 0;
  bool operator==(const AsyncPush&) const = default;
};
struct AsyncPushes {
  uint64_t version = 0;
  int32_t worker = 0;
  std::vector<AsyncPush> keys;
  bool operator==(const AsyncPushes&) const = default;
};
std::string EncodeAsyncPushes(const AsyncPushes& p);
/// Refused unless it holds exactly `num_keys` entries.
AsyncPushes ParseAsyncPushes(std::string_view body, uint64_t num_keys);

/// An init a primary forwards to its replicas: its range-table version (first, as in
/// every server's message), the worker it came from and the worker's push counts (one
/// per key).
struct ForwardedInit {
  uint64_t version = 0;
  int32_t worker = 0;
  std::vector<uint64_t> counts;
  bool operator==(const ForwardedInit&) const = default;
};
/// `version`, `worker` and the worker's own body `counts` (its push counts, u64 each).
std::string EncodeForwardedInit(uint64_t version, int32_t worker, std::string_view counts);
/// The body of a forwarded states load: the primary's range-table version only.
std::string EncodeForwardedStates(uint64_t version);
/// Refused unless it holds exactly `num_keys` counts.
ForwardedInit ParseForwardedInit(std::string_view body, uint64_t num_keys);

/// kRangeCopy: what every part starts with.
struct CopyHead {
  uint64_t version = 0;
  CopyPart part = CopyPart::kBegin;
  int32_t range = 0;
  bool operator==(const CopyHead&) const = default;
};
/// The head alone (the rest is the part's parser's to read).
CopyHead ParseCopyHead(std::string_view body);

struct CopyBegin {
  bool sync = false;
  uint64_t keys = 0;
  uint64_t value_bytes = 0;
  std::vector<std::pair<int32_t, uint64_t>> states;  // store, optimizer-states bytes
  bool operator==(const CopyBegin&) const = default;
};
struct CopyKey {
  int64_t key = 0;  // wire key
  int32_t dtype = 0;
  int64_t rows = 0;  // row_sparse: the table's rows; 0: dense
  int64_t round = 0;
  std::vector<PushCount> applied;
  bool operator==(const CopyKey&) const = default;
};
struct CopyStates {
  int32_t store = 0;
  uint64_t offset = 0;
  bool operator==(const CopyStates&) const = default;
};

/// The part `head.part` says (EncodeCopyKeys: kKeys, ...); `head.part` is set here.
std::string EncodeCopyBegin(CopyHead head, const CopyBegin& b);
std::string EncodeCopyKeys(CopyHead head, const std::vector<CopyKey>& keys);
std::string EncodeCopyStates(CopyHead head, const CopyStates& s);
std::string EncodeCopyEnd(CopyHead head);
/// A whole part; ProtocolError also when the head names another part.
CopyBegin ParseCopyBegin(std::string_view body);
/// Refused unless it holds exactly `num_keys` keys.
std::vector<CopyKey> ParseCopyKeys(std::string_view body, uint64_t num_keys);
CopyStates ParseCopyStates(std::string_view body);
void ParseCopyEnd(std::string_view body);

}  // namespace replication_wire
}  // namespace pskv::dist
