// StatusReporter: one node's status, written as records (common/status_record.h) to
// the process's status channel each time it changes.
//
// The state is a base phase (registering -> running -> finished, or failed, which
// sticks) plus the waits that have reported a stall and not yet ended, each under a
// key its owner chose ("barrier/4", "rounds", ...). While any such wait is open the
// node is "waiting": its record names the most recent wait and the union of the
// nodes all open waits are missing. When the last one ends, a record with the base
// phase follows, so a launcher never keeps a wait that is over. Every record
// carries the whole state: a dropped record is repaired by the next one.
//
// Waits report on the stall schedule of common/stall.h (first after
// PSKV_STALL_WARNING, then each time the wait has doubled), so records are few.
// Thread-safe. Without a channel every call returns at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status_record.h"

namespace pskv {

class StatusReporter {
 public:
  StatusReporter() = default;
  StatusReporter(const StatusReporter&) = delete;
  StatusReporter& operator=(const StatusReporter&) = delete;

  /// Sets where records go and who this node is; emits nothing by itself.
  void Configure(StatusChannel channel, std::string role, std::string host);
  void SetRank(int rank);
  bool enabled() const { return enabled_.load(std::memory_order_acquire); }

  /// registering, running or finished (no effect once failed).
  void SetPhase(StatusPhase phase);
  /// The node failed: `kind` (the error's type name), `message`, and the nodes it
  /// blames (a dead or unreachable peer), if known. Sticks: later phases are ignored.
  void Failed(const std::string& kind, const std::string& message,
              const std::vector<NodeRef>& culprits = {});

  /// The wait under `key` has stalled for `waited` on `missing` (and `more` nodes not
  /// listed); `what` says what it waits on ("barrier", "push", "sync round of key 3").
  void Waiting(const std::string& key, const std::string& what, std::vector<NodeRef> missing,
               int64_t more, std::chrono::milliseconds waited);
  /// The wait under `key` ended (no effect if it never reported).
  void Resumed(const std::string& key);

  /// The scheduler's view of the job, in every later record: servers keep `replicas`
  /// copies of each key range besides its primary; a dead node is declared dead within
  /// `detect_ms` (0: never). Emits nothing by itself.
  void SetJob(int64_t replicas, int64_t detect_ms);
  /// The job continues without `node`, declared dead (the scheduler survived it).
  void Departed(const NodeRef& node);
  /// Spare server `node` joined the key ranges it was assigned (it is their replica).
  void Joined(const NodeRef& node);
  /// Elastic workers: a new process took the place of departed worker `node` (it
  /// joined the running job): `node` is no longer listed departed.
  void Returned(const NodeRef& node);

  /// The record of the current state (for tests and for the writer).
  StatusRecord Snapshot() const;

 private:
  struct Wait {
    std::string what;
    std::vector<NodeRef> missing;
    int64_t more = 0;
    int64_t waited_ms = 0;
    uint64_t order = 0;  // the most recent report wins the record's `wait`
  };
  StatusRecord SnapshotLocked() const;
  void EmitLocked() const;
  /// Adds `node` to `list` (departed_ or joined_) unless it is there, and emits the
  /// record if it was added.
  void AddOnce(std::vector<NodeRef>* list, const NodeRef& node);

  mutable std::mutex mu_;
  StatusChannel channel_;
  // channel_.enabled(), for the calls' check before the lock (Configure runs on the
  // starting thread while the server's threads may already report).
  std::atomic<bool> enabled_{false};
  std::string role_, host_;
  int rank_ = -1;
  StatusPhase base_ = StatusPhase::kRegistering;
  std::string kind_, message_;
  std::vector<NodeRef> culprits_;
  std::map<std::string, Wait> waits_;
  uint64_t reports_ = 0;
  int64_t replicas_ = 0, detect_ms_ = 0;
  std::vector<NodeRef> departed_, joined_;
};

/// A wait that reports itself to `reporter` (may be null) under a key unique to this
/// object, and ends when destroyed. Costs nothing until Report is called.
class StatusWait {
 public:
  explicit StatusWait(StatusReporter* reporter) : reporter_(reporter) {}
  ~StatusWait();
  StatusWait(const StatusWait&) = delete;
  StatusWait& operator=(const StatusWait&) = delete;

  void Report(const std::string& what, std::vector<NodeRef> missing, int64_t more,
              std::chrono::milliseconds waited);
  /// The wait gave up (timeout, deadlock): the node failed, blaming the nodes its
  /// last report named.
  void Fail(const std::string& kind, const std::string& message);

 private:
  StatusReporter* reporter_;
  std::string key_;               // set by the first Report
  std::vector<NodeRef> missing_;  // of the last Report
};

/// The type of the error in `e` as records name it: "TimeoutError", "NodeFailure",
/// ... (pskv's error classes, include/pskv/error.h), "Error" for another pskv::Error,
/// "exception" for anything else.
std::string ErrorKindName(std::exception_ptr e);
/// What `e` says (its what()), or "" if it is not a std::exception.
std::string ErrorMessage(std::exception_ptr e);

}  // namespace pskv
