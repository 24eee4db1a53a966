// RangeTable: who holds each key range of a job with replicated servers
// (docs/fault-tolerance.md, "Replicated servers, first slice").
//
// A range is server rank i's share of the ps key space (KVWorker::ServerRange(i, S));
// ranges keep their numbers for the whole job, only their holders change. Each range
// has a primary (the server that answers its requests) and up to R replicas (in
// promotion order). Initially range i's primary is server i and its replicas servers
// i+1 .. i+R (mod S).
//
// The scheduler owns the table: when a server dies it Remove()s it (each range it was
// primary of gets its first live replica as primary; it leaves every replica list)
// and publishes the new version. Every node Apply()s a published table only if its
// version is newer, so reordered or repeated tables are harmless.
//
// Spare servers (PSKV_SPARE_SERVERS; docs/fault-tolerance.md, "Back to full strength")
// are listed while they hold nothing. When a removal leaves ranges with fewer than R
// replicas, AssignSpare() makes the first spare *join* each of them: the range's
// primary sends it a copy, and once it installed that copy, Joined() lists it as a
// replica (version + 1). A joining server counts as holding the range (it acknowledges
// the range's replicated rounds) but is never promoted.
//
// Not thread-safe: its owner (Node) guards it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "protocol/payload.h"

namespace pskv {

class RangeTable {
 public:
  /// An empty table (version 0, no ranges): replication off.
  RangeTable() = default;
  /// The job's first table (version 1) for `num_servers` servers and `replicas`
  /// copies per range besides its primary (at most num_servers - 1); spare servers
  /// (ranks num_servers .. num_servers + spares - 1) hold nothing.
  static RangeTable Initial(int num_servers, int replicas, int spares = 0);
  /// A table received from the scheduler; throws ProtocolError if it does not fit a
  /// job of `num_servers` servers and `spares` spares (a range count other than S,
  /// an id that is not a server's, a server listed twice for one range, a spare that
  /// also holds a range).
  static RangeTable FromData(const payload::RangeTableData& data, int num_servers, int spares = 0);
  payload::RangeTableData ToData() const;

  bool empty() const { return ranges_.empty(); }
  uint64_t version() const { return version_; }
  int num_ranges() const { return static_cast<int>(ranges_.size()); }
  /// Node id of range `range`'s primary.
  int Primary(int range) const { return ranges_.at(static_cast<size_t>(range)).primary; }
  /// Node ids of its replicas, in promotion order.
  const std::vector<int32_t>& Replicas(int range) const {
    return ranges_.at(static_cast<size_t>(range)).replicas;
  }
  /// Spare servers joining range `range` (being sent a copy; not replicas yet).
  const std::vector<int32_t>& Joining(int range) const {
    return ranges_.at(static_cast<size_t>(range)).joining;
  }
  /// Spare servers that hold nothing yet, in the order they will be used.
  const std::vector<int32_t>& Spares() const { return spares_; }
  bool IsSpare(int id) const;
  /// Ranges whose primary is node `id`.
  std::vector<int> PrimaryOf(int id) const;
  /// Ranges that node `id` replicates (is a replica of, not the primary).
  std::vector<int> ReplicaOf(int id) const;
  /// True if node `id` holds some range (as primary, replica or joining server).
  bool Holds(int id) const;
  /// True if node `id` is neither in a range nor a spare: it left the job.
  bool Gone(int id) const { return !Holds(id) && !IsSpare(id); }

  struct Removal {
    bool changed = false;   // the table changed (its version went up by one)
    std::vector<int> lost;  // ranges left without any copy (their primary stays `id`)
  };
  /// Server `id` is gone: promotes, drops it from every replica and joining list and
  /// from the spares. Ranges with no live copy left keep the dead primary and are
  /// listed in `lost`.
  Removal Remove(int id);
  /// When some range has fewer than `replicas` replicas and joining servers, the first
  /// spare joins every such range (it replaces one dead server); returns its id (the
  /// version went up by one), or 0 if no range needs one or no spare is left.
  int AssignSpare(int replicas);
  /// Joining server `id` installed its copy of `range`: it becomes the range's last
  /// replica (version + 1). False if it was not joining that range.
  bool Joined(int range, int id);
  /// Takes `newer` if its version is higher than this one's; true if taken.
  bool Apply(const RangeTable& newer);

  /// "v2: range 0 server[1] (replicas: -), range 1 ...", for logs.
  std::string Describe() const;

 private:
  uint64_t version_ = 0;
  std::vector<payload::RangeHolders> ranges_;
  std::vector<int32_t> spares_;
};

}  // namespace pskv
