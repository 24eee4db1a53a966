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
#include <functional>
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
  /// Whether the writer proving `token` is known cut off: this node's own control
  /// connection to it has been down for a while (the transport's answer; false
  /// when it holds none). Then a SWITCH that has not come never will.
  using CutOff = std::function<bool(uint64_t token)>;

  /// `kinds`: the transport's paths (outlive this object).
  IncomingPaths(const std::vector<std::unique_ptr<DataPath>>& kinds, RateLimiter& limiter,
                CutOff cut_off)
      : kinds_(kinds), limiter_(limiter), cut_off_(std::move(cut_off)) {}

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
  /// Data that came ahead of its SWITCH waits for it as long as the writer may still
  /// send it — however late ZeroMQ delivers it (a flooded or starved node), since
  /// dropping the path would lose the data. It is dropped only when the writer
  /// is cut off (CutOff: its SWITCH was lost with a broken connection) or gives the
  /// path up (its new OFFER replaces it).
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
    bool active = false;  // SWITCH arrived: the writer uses this path now
    std::unique_ptr<InPath> path;
  };
  using Map = std::map<uint64_t, std::unique_ptr<In>>;
  void Drop(Map::iterator it, const char* why);
  void Accept(const Received& in, const Offer& offer, Map::iterator existing);

  const std::vector<std::unique_ptr<DataPath>>& kinds_;
  RateLimiter& limiter_;
  CutOff cut_off_;
  Map in_;                       // by the writer's token
  std::map<int, uint64_t> fds_;  // a path's descriptor -> token
  uint64_t last_token_ = 0;      // round robin
};

}  // namespace pskv::upgrade
