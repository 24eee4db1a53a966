// Small helpers shared by the transport and data-path conformance suites.
#pragma once

#include <chrono>
#include <string>

#include "transport/transport.h"

namespace pskv::testing {

/// Receives one message within `limit` (bounded polling).
inline bool RecvWithin(Transport& t, Received* in, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end)
    if (t.Recv(in, std::chrono::milliseconds(50))) return true;
  return false;
}

/// A frame's bytes as a string.
inline std::string Str(const Frame& f) {
  return std::string(f.data, f.size);
}

}  // namespace pskv::testing
