// FaultTransport: wraps another transport and drops, duplicates or delays
// outgoing messages at random (leveldb's fault-injecting Env, for networks), or
// sends extra messages derived from them. Which messages may be disturbed is the
// caller's to say (FaultConfig::disturb, FaultConfig::also_send): the decorator
// knows nothing of the protocol above it. Tests install it; production code
// never branches on a fault (the Node wraps its transport once, at Start, when a
// test asks for disturbances: ps/test_disturbance.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>

#include "transport/transport.h"

namespace pskv {

struct FaultConfig {
  double drop = 0;       ///< probability a message is dropped
  double duplicate = 0;  ///< probability a message is sent twice
  double delay = 0;      ///< probability a message is delayed by `delay_time`
  std::chrono::milliseconds delay_time{50};
  uint64_t seed = 1;
  /// Which outgoing messages drop/duplicate/delay apply to (e.g. the protocol's
  /// CoveredByResend, protocol/message.h); unset: none of them. Partitions apply
  /// to every message regardless.
  std::function<bool(const std::vector<Frame>&)> disturb;
  /// A partition: every message to these peers (control ones too) is dropped
  /// during [partition_from, partition_from + partition_for).
  std::set<int> partition_peers;
  std::chrono::steady_clock::time_point partition_from{};
  std::chrono::milliseconds partition_for{0};
  /// During the partition, also report the connection to those peers as down
  /// (what the real transport's keep-alive reports for a lost connection).
  bool partition_reports_down = false;
  /// A partition the caller starts and ends at will: every message to a peer for
  /// which `cut(peer)` is true is dropped (called on each send). Unset: none.
  std::function<bool(int peer)> cut;
  /// Before each outgoing message (outside a partition), `also_send` may return
  /// another message, which is sent first: a forged or renumbered variant the
  /// layer above derives from it (ps/test_disturbance.h). Unset: nothing extra.
  std::function<std::optional<std::vector<Frame>>(const std::vector<Frame>&)> also_send;
};

/// The wrapped transport. Close(linger) still sends the delayed messages that fall
/// due within `linger` (in order), then closes the inner transport with what is
/// left of `linger`.

std::unique_ptr<Transport> CreateFaultTransport(std::unique_ptr<Transport> inner, FaultConfig cfg);

}  // namespace pskv
