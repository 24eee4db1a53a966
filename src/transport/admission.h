// Admission of connections that have not proven themselves yet (a ZeroMQ
// connection before its handshake, a direct TCP connection before its HELLO):
// one policy for every listener of a node, so that a stranger can hold neither
// door shut for the job's nodes (docs/security.md).
//
//  * at most `cap` such connections wait at once;
//  * one source address holds at most `per_source` of them: a quarter of the cap,
//    and at least kMinPerSource (a host running many nodes connects them all at
//    once: 12 receivers on one host must all get in);
//  * over either limit, the oldest waiting connection of the address that holds
//    the most goes first — so a stranger that holds many loses its own.
// Connections that proved themselves are never counted nor closed by it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <string>

namespace pskv {

class AdmissionPolicy {
 public:
  static constexpr size_t kMinPerSource = 16;

  /// `cap`: connections waiting at once, at most (at least 1).
  explicit AdmissionPolicy(size_t cap)
      : cap_(std::max<size_t>(1, cap)), per_source_(std::max(kMinPerSource, cap_ / 4)) {}

  size_t cap() const { return cap_; }
  size_t per_source() const { return per_source_; }

  /// `waiting`: how many connections wait per source address (a new one counted).
  /// The address whose oldest waiting connection must be closed now, or nothing
  /// when all may stay; call again after closing one. Ties between addresses
  /// holding the most go to the first in the map's order (deterministic).
  std::optional<std::string> Victim(const std::map<std::string, size_t>& waiting) const {
    size_t total = 0;
    auto top = waiting.end();
    for (auto it = waiting.begin(); it != waiting.end(); ++it) {
      total += it->second;
      if (top == waiting.end() || it->second > top->second) top = it;
    }
    if (top == waiting.end() || top->second == 0) return std::nullopt;
    if (top->second > per_source_ || total > cap_) return top->first;
    return std::nullopt;
  }

 private:
  size_t cap_, per_source_;
};

}  // namespace pskv
