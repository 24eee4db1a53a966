// HeldRequests: workers' requests a replicated server keeps until it leads their key
// range (ReplicaHost, replicated_server.h; docs/fault-tolerance.md, "Promotion on the
// servers"), bounded per sender (docs/security.md, "Replicated servers").
//
// A request is held while the range table of this node does not (yet) make it the
// primary of the request's range, or while the range's promotion is still sending its
// last changes again. Each sender may have at most `max_bytes` held (a request counts
// its keys, lens, values and body, at least kMinCharge bytes, so the bound also bounds
// the number of requests); past it Hold refuses the request and says why, and
// the caller answers it with that error. Release and Take hand requests back in the
// order they arrived. Not thread-safe: the owner locks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ps/kv_app.h"

namespace pskv {

class HeldRequests {
 public:
  /// What one request counts against its sender's bound at least.
  static constexpr uint64_t kMinCharge = 1024;

  /// `max_bytes`: the most one sender may have held (Options::held_request_bytes).
  explicit HeldRequests(int64_t max_bytes) : max_bytes_(static_cast<uint64_t>(max_bytes)) {}

  /// The bytes `req` counts against its sender's bound.
  static uint64_t ChargeOf(const KVRequest& req);
  /// Holds `req` for `range`, or returns why not (the sender's bound would be passed;
  /// `req` is then untouched). `who`: names this node in the message.
  std::string Hold(int range, KVRequest&& req, const std::string& who);
  /// Every request held for `range`, in arrival order; none is held for it afterwards.
  std::vector<KVRequest> Release(int range);
  /// Every request held, in arrival order per range; none is held afterwards.
  std::vector<KVRequest> TakeAll();
  /// Requests held for `range`.
  size_t Count(int range) const;
  /// Bytes `sender` has held (as charged).
  uint64_t BytesOf(int sender) const;
  /// Requests refused so far (Hold returned a reason).
  uint64_t refused() const { return refused_; }

 private:
  uint64_t max_bytes_;
  std::map<int, std::vector<KVRequest>> by_range_;
  std::map<int, uint64_t> bytes_;  // sender -> bytes held
  uint64_t refused_ = 0;
};

}  // namespace pskv
