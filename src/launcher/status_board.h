// StatusBoard: what the processes of a job said about themselves (status records,
// common/status_record.h), and which process the others wait for when the job hangs.
//
// The launcher feeds it every record a child sent (a packet of its status socket, or
// a tagged line of its output for remote launchers); records are untrusted input:
// malformed ones are counted and ignored. Only the latest record of each reporting
// node counts (a record carries the node's whole state).
//
// Blame follows the wait-for graph: a node waiting (or failed) names the nodes it
// waits for (or blames); the process that hung is one still running that others
// wait for, directly or through other waiting nodes, and that waits for nobody
// itself. A worker waiting for a server that waits for worker 1 blames worker 1, not
// the server; a node waiting for a process that exited is not blamed (the exit is the
// failure); in a cycle of waits, the node most others wait for. Pure: no I/O, the
// caller says which children are alive.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status_record.h"

namespace pskv::launcher {

class StatusBoard {
 public:
  /// `children`: the names the plan gave the processes ("scheduler", "worker 1",
  /// "servers" for a group of processes under one command).
  explicit StatusBoard(std::vector<std::string> children);
  /// Child `child` is called `name` from now on (a standby scheduler that took over
  /// is "scheduler": its records decide on dead servers).
  void Rename(size_t child, std::string name) {
    if (child < children_.size()) children_[child] = std::move(name);
  }

  /// A child added after the start (a fresh standby scheduler); its index.
  size_t AddChild(std::string name) {
    children_.push_back(std::move(name));
    return children_.size() - 1;
  }
  /// A record (one packet or line) from child `child`; false when it is ignored
  /// (malformed, oversized, another version, an unknown child).
  bool Add(size_t child, std::string_view record);
  /// Child `child` was started again: the records of its previous process are dropped.
  void Forget(size_t child);
  /// Counts a record the caller dropped unread (e.g. a packet over kMaxRecordBytes).
  void Ignore() { ++ignored_; }
  size_t ignored() const { return ignored_; }

  /// The latest record of any node in child `child`, null if none.
  const StatusRecord* Latest(size_t child) const;

  /// "waiting for server 0 (push, 12 s)", "failed: TimeoutError: ...", "running"; ""
  /// when the child reported nothing.
  std::string Describe(size_t child) const;

  struct Blame {
    size_t hung = 0;     ///< the child that hung
    std::string node;    ///< the node in it ("worker 1"), as records name it
    size_t witness = 0;  ///< a child that waited for it
    std::string by;      ///< the node in the witness that waited ("server 0")
  };
  /// The running child the others wait for, per the rules above; `alive[i]`: child i
  /// still runs. `from`: only waits reachable from that child's nodes count (it
  /// failed: whom was it waiting for?); none: every node's.
  std::optional<Blame> Hung(const std::vector<bool>& alive, std::optional<size_t> from) const;

  /// The nodes that reported from child `child` with a rank, in order of first record.
  std::vector<NodeRef> NodesOf(size_t child) const;
  /// The child the scheduler reported from and its latest record; nullopt before it
  /// reported. Where a child is named "scheduler", only its records count.
  std::optional<std::pair<size_t, const StatusRecord*>> Scheduler() const;

  /// "worker 1" for worker.1, "scheduler" for scheduler.0.
  static std::string NodeName(const NodeRef& ref);

 private:
  struct Reporter {
    size_t child;
    StatusRecord record;
  };
  /// The child a reference names: the child whose node reported as it, else the
  /// child named after it ("worker 1"), else its role's group ("workers").
  std::optional<size_t> ChildOf(const NodeRef& ref) const;
  const Reporter* ReporterOf(const NodeRef& ref) const;

  std::vector<std::string> children_;
  std::vector<Reporter> reporters_;  // in order of first record
  size_t ignored_ = 0;
};

}  // namespace pskv::launcher
