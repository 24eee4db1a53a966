// FaultTransport: wraps another transport and drops, duplicates or delays
// outgoing messages at random (leveldb's fault-injecting Env, for networks).
// Only data, barrier and ack messages are disturbed; registration is not (it has
// its own retry and is not what the resend layer protects).
#pragma once

#include <chrono>
#include <memory>
#include <set>

#include "transport/transport.h"

namespace pskv {

struct FaultConfig {
  double drop = 0;       ///< probability a message is dropped
  double duplicate = 0;  ///< probability a message is sent twice
  double delay = 0;      ///< probability a message is delayed by `delay_time`
  std::chrono::milliseconds delay_time{50};
  uint64_t seed = 1;
  /// A partition: every message to these peers (control ones too) is dropped
  /// during [partition_from, partition_from + partition_for).
  std::set<int> partition_peers;
  std::chrono::steady_clock::time_point partition_from{};
  std::chrono::milliseconds partition_for{0};
  /// During the partition, also report the connection to those peers as down
  /// (what the real transport's keep-alive reports for a lost connection).
  bool partition_reports_down = false;
};

std::unique_ptr<Transport> CreateFaultTransport(std::unique_ptr<Transport> inner, FaultConfig cfg);

}  // namespace pskv
