// IncomingPaths: the receiving side (A) of the upgrade negotiation of
// data_path.h — the direct paths other nodes write to this one, by the writer's
// token: OFFERs accepted or declined, SWITCHes activating them, data read from
// active paths round robin, paths dropped when their writer gave them up.
//
// Owned by the UpgradingTransport's Recv thread (the transport serialises every
// call; Clear may come from Close under the same lock). The transport keeps the
// epoll set, ZeroMQ's descriptor and the wake-up pipes; the paths add their own
// descriptors to the set and this class maps them back to their path.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/rate_limit.h"
#include "transport/transport.h"
#include "transport/upgrade/data_path.h"

namespace pskv::upgrade {

class IncomingPaths {
 public:
  /// Incoming paths, at most (further offers are declined).
  static constexpr size_t kMaxPaths = 128;
  /// Data on a path whose SWITCH has not come after this: the SWITCH was lost
  /// (ZeroMQ drops what is in flight when its connection breaks); the path is
  /// dropped, the writer's next write fails or finds the reader gone, and it goes
  /// back to ZeroMQ.
  static constexpr auto kSwitchGrace = std::chrono::seconds(5);

  /// `kinds`: the transport's paths (outlive this object).
  IncomingPaths(const std::vector<std::unique_ptr<DataPath>>& kinds, RateLimiter& limiter)
      : kinds_(kinds), limiter_(limiter) {}

  /// Handles `in` if it is an OFFER or SWITCH (from the authenticated in.peer):
  /// true then, and the message is consumed.
  bool HandleControl(const Received& in);
  /// A message from `in.peer` came over ZeroMQ: if that connection's path is
  /// active, the writer gave it up (unread messages are lost, never reordered).
  void CameOverControl(const Received& in);
  /// An epoll event on descriptor `fd`; false if no path owns it.
  bool OnEvent(int fd, uint32_t events);
  /// One complete message from any active path (round robin), with its peer,
  /// connection and address; looks at paths still waiting for their SWITCH too.
  bool Pump(Received* out);
  /// Whether an active path has data visible without a system call (spinning).
  bool AnyReady() const;
  /// Before the Recv thread sleeps: asks every path for a wake-up; true if data
  /// arrived meanwhile (then do not sleep; already disarmed).
  bool Arm();
  void Disarm();
  /// Every path stops reading (a ring is marked closed).
  void Clear();
  size_t size() const { return in_.size(); }

 private:
  struct In {
    uint64_t token = 0;
    uint64_t conn = 0;  // the writer's ZeroMQ connection that made the offer
    uint64_t seq = 0;   // the offer's number (Offer::seq)
    std::string addr;
    Nonce nonce{};
    bool active = false;                  // SWITCH arrived: the writer uses this path now
    Clock::time_point data_waiting_at{};  // data waits for its SWITCH since then
    std::unique_ptr<InPath> path;
  };
  using Map = std::map<uint64_t, std::unique_ptr<In>>;
  void Drop(Map::iterator it, const char* why);
  void Accept(const Received& in, const Offer& offer, Map::iterator existing);

  const std::vector<std::unique_ptr<DataPath>>& kinds_;
  RateLimiter& limiter_;
  Map in_;                       // by the writer's token
  std::map<int, uint64_t> fds_;  // a path's descriptor -> token
  uint64_t last_token_ = 0;      // round robin
};

}  // namespace pskv::upgrade
