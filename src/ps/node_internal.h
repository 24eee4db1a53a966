// Helpers shared by the files that implement Node (node.cc: lifecycle, sending,
// failures; node_receive.cc: receiving; membership.cc: node table, identities,
// groups, barrier waits, range table) and its Scheduler (scheduler.cc,
// scheduler_registration.cc). Not part of any API.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace pskv::node_internal {

/// "1.5 s" for log lines and messages.
inline std::string SecsStr(std::chrono::milliseconds d) {
  char b[32];
  std::snprintf(b, sizeof b, "%g s", static_cast<double>(d.count()) / 1000.0);
  return b;
}

}  // namespace pskv::node_internal
