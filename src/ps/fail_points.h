// Failure points: the places where a test may make a node misbehave or die.
//
// A Node owns one FailPoints. Production's is this base class, whose every point does
// nothing (and whose disturbances are all off), so the library never sleeps, holds a
// message or exits a process for a test. A test installs its own implementation:
//  * for the nodes of one process: InstallFailPoints, before the first node is made
//    (a test's own server or worker binary does this in main; tests/support/
//    env_fail_points.h is the implementation those binaries install, driven by
//    the tests' own environment variables, which the library never reads);
//  * for one node made in a test: Node::set_fail_points, before it starts.
// The disturbances are asked once, when the part they wrap is made (a node's
// transport, a server's request path); the points are called inline, on the thread
// named with each, and return at once unless a test made them hold or end the process.
// Drops, delays and duplicates of any message on the wire are the FaultTransport
// decorator's (transport/fault); interleavings inside the ZeroMQ backend are
// TransportConfig::Seams.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace pskv {

class Node;

/// Messages a node's transport adds to its own (ps/test_disturbance.h).
struct WireDisturbance {
  /// A server sends every data reply twice.
  bool duplicate_replies = false;
  /// With every send-window credit a node also sends one for far more messages than
  /// it received (which the peer must drop).
  bool bogus_credits = false;
  /// Every message the node sends to a peer for which `cut(peer)` is true is dropped
  /// (a partition the test starts and ends itself; called on each send). Unset: none.
  std::function<bool(int peer)> cut;
};

class FailPoints {
 public:
  virtual ~FailPoints() = default;

  // ---- disturbances, asked once when the part they wrap is made
  /// What the node's transport adds to its messages (asked by Node::Start).
  virtual WireDisturbance Wire() { return {}; }
  /// How long a dist server sleeps before handling each data request (asked when the
  /// server is made): replies then arrive after a worker's timeout.
  virtual std::chrono::milliseconds ReplyDelay() { return std::chrono::milliseconds(0); }
  /// A spare server installs a copy of a key range only once it holds this many
  /// changes of the range that followed the copy (asked at each step of the install).
  virtual uint64_t CopyHoldChanges() { return 0; }

  // ---- points on the node's own paths
  /// The node table arrived, before the job's start barrier (Node::Start's thread).
  virtual void Registered() {}
  /// Primary of key range `range`: the replicas acknowledged a sync round, before any
  /// push of that round is answered (the thread of the last acknowledgement).
  virtual void RoundReplicated(int range) { (void)range; }
  /// Primary of key range `range`: the replicas acknowledged an init it forwarded,
  /// before that init is answered (the thread of the last acknowledgement).
  virtual void InitForwarded(int range) { (void)range; }
  /// Replica of key range `range`: it acknowledged a replicated round whose primary
  /// left it `answers` push-pulls to answer, before it answers them (the key's shard).
  virtual void DelegatedRoundAcknowledged(int range, size_t answers) {
    (void)range;
    (void)answers;
  }
  /// Primary of key range `range`: sync round `round` of a key is about to go to
  /// the replicas chosen by the range table whose version `table_version` reads
  /// (the key's shard). False (the default): it is sent now. True: the fail point
  /// took `send` and runs it later, on a thread of its own, before Quiesce returns.
  virtual bool HoldReplicatedRound(int range, int64_t round,
                                   std::function<uint64_t()> table_version,
                                   std::function<void()>& send) {
    (void)range, (void)round, (void)table_version, (void)send;
    return false;
  }
  /// A replicated change (`what`: "a dense round", ...) is about to go to the servers
  /// `*to` (two or more; the replicator's lock is held). A test may leave one of them
  /// only in `*to`: the others never get it, and NarrowedChangeAnswered runs when that
  /// one answered. The default leaves `*to` as it is.
  virtual void ReplicationFanout(std::vector<int>* to, const char* what) { (void)to, (void)what; }
  /// Server `id` answered the change ReplicationFanout narrowed to it (the thread of
  /// the answer, under the replicator's lock).
  virtual void NarrowedChangeAnswered(int id) { (void)id; }
  /// Returns once nothing a point deferred (HoldReplicatedRound) is still to run: the
  /// part that deferred it is about to go away.
  virtual void Quiesce() {}
};

/// Makes the FailPoints of a node (given the node, to name it in log lines; the node
/// outlives its fail points).
using FailPointsFactory = std::function<std::unique_ptr<FailPoints>(const Node&)>;

/// Every node this process makes from now on gets its FailPoints from `factory`
/// (null: the no-op base class again). For test programs: the library never calls it.
void InstallFailPoints(FailPointsFactory factory);

/// The FailPoints of a node being made: the installed factory's, else the no-op one.
std::unique_ptr<FailPoints> MakeFailPoints(const Node& node);

}  // namespace pskv
