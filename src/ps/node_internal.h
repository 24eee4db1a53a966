// Helpers shared by the files that implement Node (node.cc: lifecycle, failures;
// node_start.cc: the start phases; node_receive.cc: receiving) and its components
// (takeover.cc, barriers.cc, the Scheduler's files). Not part of any API.
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
