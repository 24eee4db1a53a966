// FaultTransport: wraps another transport and drops, duplicates or delays
// outgoing messages at random (leveldb's fault-injecting Env, for networks).
// Only data, barrier and ack messages are disturbed; registration is not (it has
// its own retry and is not what the resend layer protects).
#pragma once

#include <chrono>
#include <memory>

#include "transport/transport.h"

namespace pskv {

struct FaultConfig {
  double drop = 0;       ///< probability a message is dropped
  double duplicate = 0;  ///< probability a message is sent twice
  double delay = 0;      ///< probability a message is delayed by `delay_time`
  std::chrono::milliseconds delay_time{50};
  uint64_t seed = 1;
};

std::unique_ptr<Transport> CreateFaultTransport(std::unique_ptr<Transport> inner, FaultConfig cfg);

}  // namespace pskv
