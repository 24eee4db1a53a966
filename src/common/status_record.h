// Status records: how a pskv process tells its launcher what it is doing.
//
// A launcher that must say which process of a hung or failed job is to blame learns
// it from the processes themselves, not from the wording of their log lines. Each
// node reports its phase (registering, running, waiting for named nodes, failed with
// an error kind and message, finished) as one record per change, on the channel the
// launcher names in PSKV_STATUS (docs/design.md, "Status channel"):
//
//   fd:N    records go to file descriptor N, an AF_UNIX SOCK_SEQPACKET (or
//           SOCK_DGRAM) socket the launcher created and reads: one record per
//           packet, never mixed with the program's output (the local launcher);
//   stderr  records go to standard error as whole lines among the program's output
//           (remote launchers: ssh, mpi, slurm, ... forward that output, not a file).
//
// One format for both, versioned by its tag:
//
//   @pskv-status/1 role=worker rank=1 host=10.0.0.2 pid=42 phase=waiting wait=push
//       missing=server.0,worker.3 more=0 waited_ms=4000
//
// (one line). The scheduler's records also describe the job as a whole: `replicas=R`
// (its servers replicate their key ranges: a server's death is survived while every
// range keeps a copy), `detect_ms=N` (a dead node is declared dead within N ms; 0:
// detection is off), `departed=server.1,...` (nodes declared dead that the job
// continues without; docs/fault-tolerance.md, "The launcher") and `joined=server.2,...`
// (spare servers that took over the copies of the key ranges left short of one: each
// is now a replica of every range it was assigned; "Back to full strength").
//
// Fields are key=value separated by single spaces; values are
// percent-encoded (every byte outside [A-Za-z0-9._:,/+-] as %XX), so a record is
// printable ASCII without spaces inside a value. `missing` lists node references
// "role.rank" (at most kMaxRefs; `more` counts the rest).
//
// Readers treat records as untrusted input: a line longer than kMaxRecordBytes, with
// another tag or version, an unknown phase or role, a bad escape, a bad number or
// too many references is ignored whole; unknown keys are skipped (a later minor
// addition). Writers never block and never raise SIGPIPE: a record that cannot be
// written at once is dropped (the next one carries the whole state again).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pskv {

enum class StatusPhase { kRegistering, kRunning, kWaiting, kFailed, kFinished };

/// A node of the job as records name it: "worker.1", "server.0", "scheduler.0".
struct NodeRef {
  std::string role;  ///< "scheduler", "server" or "worker"
  int rank = 0;
  bool operator==(const NodeRef&) const = default;
  bool operator<(const NodeRef& o) const { return role != o.role ? role < o.role : rank < o.rank; }
};

/// One status record: the whole state of one node at the time it was written.
struct StatusRecord {
  std::string role;  ///< the reporting node's role
  int rank = -1;     ///< -1 while the node has no rank yet (registering)
  std::string host;
  int64_t pid = 0;
  StatusPhase phase = StatusPhase::kRunning;
  std::string wait;              ///< waiting: what it waits on ("barrier", "push", ...)
  std::vector<NodeRef> missing;  ///< waiting: the nodes it waits for; failed: the culprits
  int64_t more = 0;              ///< further nodes not listed in `missing`
  int64_t waited_ms = 0;         ///< waiting: how long so far
  std::string kind;              ///< failed: the error's kind ("NodeFailure", "TimeoutError")
  std::string message;           ///< failed: the error's message (at most kMaxMessageBytes)
  // The scheduler only: the job as a whole.
  int64_t replicas = 0;           ///< copies of each key range besides its primary (0: none)
  int64_t detect_ms = 0;          ///< a dead node is declared dead within this (0: never)
  std::vector<NodeRef> departed;  ///< declared dead, the job goes on (at most kMaxRefs)
  std::vector<NodeRef> joined;    ///< spares that joined key ranges (at most kMaxRefs)
  bool operator==(const StatusRecord&) const = default;
};

/// The tag that starts every record (format version 1).
inline constexpr std::string_view kStatusTag = "@pskv-status/1 ";
/// The longest record (the tag included, no newline) a reader accepts.
inline constexpr size_t kMaxRecordBytes = 4096;
/// The longest message a writer puts in a record (truncated; the wait: 128 bytes,
/// the host: 64), so that every record fits in kMaxRecordBytes.
inline constexpr size_t kMaxMessageBytes = 384;
/// The most node references one record lists.
inline constexpr size_t kMaxRefs = 32;

const char* StatusPhaseName(StatusPhase p);

/// The record as one line (no newline), at most kMaxRecordBytes: longer texts are
/// truncated and references beyond kMaxRefs are counted in `more`.
std::string EncodeStatus(const StatusRecord& r);

/// Parses one line (a trailing newline is allowed); nullopt if it is not a valid
/// version-1 record (see the rules above).
std::optional<StatusRecord> DecodeStatus(std::string_view line);

/// Whether `line` starts with a status tag of any version ("@pskv-status/"): a
/// reader of tagged output keeps such lines out of the forwarded text even when
/// they are invalid.
bool LooksLikeStatus(std::string_view line);

/// Where a process writes its records (PSKV_STATUS). Copyable; does not own the fd.
class StatusChannel {
 public:
  StatusChannel() = default;
  /// Checks the syntax of a PSKV_STATUS value ("", "fd:N", "stderr"); throws
  /// ConfigError naming PSKV_STATUS otherwise.
  static void Validate(const std::string& spec);
  /// The channel `spec` names. "fd:N" must be an open AF_UNIX packet socket (checked
  /// once, here): anything else (closed, reused for another file) gives a disabled
  /// channel and `*why` says why. "" gives a disabled channel.
  static StatusChannel Open(const std::string& spec, std::string* why = nullptr);

  bool enabled() const { return fd_ >= 0; }
  /// Writes one record; never blocks, never raises SIGPIPE; false if dropped.
  bool Write(const StatusRecord& r) const;

 private:
  int fd_ = -1;
  bool packet_ = false;  // fd:N (one send per record); else stderr lines
};

}  // namespace pskv
