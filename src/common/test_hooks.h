// Hooks that let tests disturb a node, kept out of the public Options.
//
// Production never sets them (all zero), and no message of a production node looks at
// them: processes started by tests get them from the environment (the kTest variables
// of common/env_table.cc: PSKV_TEST_*), read when a Node is made; in-process tests set
// them on a node (Node::set_test_hooks) before it starts. They are applied around the
// production code, chosen once: a Node's Start wraps its transport in the
// disturbances of ps/test_disturbance.h, a DistServer picks its request path when it
// is made. Drops, delays and duplicates of any message on the wire are the
// FaultTransport decorator's (transport/fault); interleavings inside the ZeroMQ
// backend are TransportConfig::Seams.
#pragma once

#include <chrono>
#include <cstdint>

namespace pskv {

struct TestHooks {
  /// PSKV_TEST_REPLY_DELAY (ms): a dist server sleeps this long before handling each
  /// data request (replies then arrive after a worker's timeout).
  std::chrono::milliseconds reply_delay{0};
  /// PSKV_TEST_DUPLICATE_REPLIES: a server sends every data reply twice.
  bool duplicate_replies = false;
  /// PSKV_TEST_BOGUS_CREDITS: with every send-window credit a node also sends one for
  /// far more messages than it received (which the peer must drop).
  bool bogus_credits = false;
  /// PSKV_TEST_EXIT_AFTER_REPLICATED_ROUNDS: a primary server process exits at once
  /// (status 137, as if killed) when its replicas have acknowledged this many key
  /// rounds, before any push of that round is answered (0: never).
  int64_t exit_after_replicated_rounds = 0;
  /// PSKV_TEST_COPY_HOLD_CHANGES: a spare server installs a copy of a key range only
  /// once it holds this many changes of the range that followed the copy (every part
  /// arrived or not; 0: as soon as every part arrived), so that a test exercises the
  /// changes applied after the install.
  int64_t copy_hold_changes = 0;
  /// PSKV_TEST_HOLD_REPLICATION_ROUND: a primary server chooses the replicas of each
  /// key's sync round n as always, but sends the round to them only once its range
  /// table changed from the first (waiting at most 10 s, off the key's shard): a server
  /// killed meanwhile is one of the round's chosen replicas when the table removing it
  /// arrives (0: never).
  int64_t hold_replication_round = 0;
  /// PSKV_TEST_EXIT_AMID_REPLICATION: a server process sends its n-th replicated change
  /// that has two or more targets to the first of them only, and exits at once (status
  /// 137, as if killed) when that one acknowledged it: the replica promoted in its place
  /// is then a change ahead of the others (0: never). -n: the n-th change to the last
  /// target only: a copy is then a change ahead of the promoted replica.
  int64_t exit_amid_replication = 0;
  /// PSKV_TEST_EXIT_BEFORE_DELEGATED_ANSWER: a replica server process acknowledges the
  /// n-th replicated round whose primary left it answers to workers on its host, waits
  /// 300 ms (the acknowledgement reaches the primary) and exits at once (status 137, as
  /// if killed) without answering them (0: never).
  int64_t exit_before_delegated_answer = 0;
  /// PSKV_TEST_EXIT_AFTER_FORWARDED_INITS: a primary server process exits at once
  /// (status 137, as if killed) when its replicas acknowledged the n-th init it
  /// forwarded to them, before that init is answered (0: never).
  int64_t exit_after_forwarded_inits = 0;
  /// PSKV_TEST_EXIT_AT_START: a server process exits at once (status 137, as if
  /// killed) when its node table arrived, before the job's start barrier.
  bool exit_at_start = false;

  /// The PSKV_TEST_* variables of this process's environment; ConfigError naming a
  /// malformed one.
  static TestHooks FromEnv();
};

}  // namespace pskv
