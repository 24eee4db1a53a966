// Hooks that let tests disturb a node, kept out of the public Options.
//
// Production never sets them (all zero). Real processes started by tests get them from
// the environment (the kTest variables of common/env_table.cc: PSKV_TEST_*), read when
// a Node is made; in-process tests set them on a node or a TransportConfig directly.
// Message drops, delays and duplicates on the wire are the FaultTransport decorator's
// job (transport/fault), not a hook's.
#pragma once

#include <chrono>

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
  /// Transport: Connect pauses this long after its socket started connecting (a
  /// connecting thread preempted at the worst moment).
  std::chrono::milliseconds connect_pause{0};
  /// Transport: the ROUTER's connection events are handled this long after they came
  /// (ZAP requests meanwhile at once): a guard thread behind a backlog of events.
  std::chrono::milliseconds monitor_lag{0};

  /// The PSKV_TEST_* variables of this process's environment; ConfigError naming a
  /// malformed one.
  static TestHooks FromEnv();
};

}  // namespace pskv
