// The values of a dist table's administrative requests (kEmbeddingAdmin,
// dist_protocol.h): save, restore, export, counters, and the outcome of the last of
// them, one key per server (the table's part there). The one codec of their layout.
//
// Request (push+pull), little-endian:
//   [u32 op][u32 zero][u64 ticket][u64 n][n bytes: a directory path, kSaveFull..kExport]
// Reply: kReplyWords i64 (kReplyWords * 8 bytes): for kStats the part's counters
// (embedding/stats_fields.h) and its step (kPartStep), otherwise the outcome (ReplyOutcome).
//
// The ticket numbers a table's collective calls on every worker alike: rank 0 sends
// the operation, the other workers then ask (kOutcome) for the outcome of that ticket,
// so every worker reports the same error. The path is checked for size (at most
// kMaxPath bytes) and for NUL bytes; a job's servers write where its workers ask
// (senders proved they belong to the job).
#pragma once

#include <cstdint>
#include <string>

#include "embedding/stats_fields.h"
#include "kvstore/distributed/wire/sparse_codec.h"  // Source

namespace pskv::dist::embedding_admin {

enum class Op : uint32_t {
  kStats = 1,
  kSaveFull = 2,
  kSaveDelta = 3,
  kRestore = 4,
  kExport = 5,
  kOutcome = 6,  ///< the outcome of `ticket` (an error reply if it failed or never ran)
};
constexpr uint64_t kMaxPath = 4096;
constexpr uint64_t kReplyWords = 16;
constexpr uint64_t kReplyBytes = kReplyWords * 8;

struct Request {
  Op op = Op::kStats;
  uint64_t ticket = 0;
  std::string path;
};
std::string Encode(const Request& r);
/// InvalidArgument for a malformed value (size, unknown op, a path too long or
/// holding a NUL, a path on an op that takes none or none where one is needed).
Request Decode(const sparse_wire::Source& v);

/// Word indices of an outcome reply.
enum ReplyOutcome : uint32_t { kBytes = 0, kSeq = 1, kStep = 2, kRows = 3 };
/// A stats reply: words 0 .. StatCount() - 1 are the part's counters in
/// embedding::ForEachStat's order (embedding/stats_fields.h, their one definition),
/// then the part's step.
constexpr uint32_t kPartStep = static_cast<uint32_t>(embedding::StatCount());
static_assert(kPartStep < kReplyWords, "the stats reply holds every counter and the step");

}  // namespace pskv::dist::embedding_admin
