// Liveness: decides that a peer is gone, from two signals.
//  * Silence: nothing received from a watched peer (the scheduler watches every
//    node; a node watches the scheduler) for `timeout`. Silence is counted only
//    while this node's receive thread listens: time it spends inside a data
//    handler (a big merge, a slow optimizer) is not the peer's silence, so a busy
//    node never declares its healthy peers dead.
//  * Connection down: the transport lost its connection to a peer this node
//    sends to (ZMTP heartbeats on every connection catch half-open ones and
//    worker<->server partitions the scheduler cannot see) for longer than
//    `timeout` + `interval` (longer than silence, so that when a node died the
//    scheduler's verdict, which names the cause, arrives first).
// Thread-safe: Heard/Busy* from the receive thread, Check from the timer thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace pskv {

class Liveness {
 public:
  using Clock = std::chrono::steady_clock;
  Liveness(std::chrono::milliseconds interval, std::chrono::milliseconds timeout)
      : interval_(interval), timeout_(timeout) {}

  /// Starts watching `silent_watch` for silence and `connected` for connection loss.
  void Start(const std::vector<int>& silent_watch, const std::vector<int>& connected);
  void Stop() { on_ = false; }
  void Heard(int id);
  /// Around a data handler on the receive thread.
  void BusyBegin();
  void BusyEnd();
  /// First peer found gone at `now` with the reason, or {0, ""}. `name(id)`
  /// describes a node ("worker[1] at host:port").
  std::pair<int, std::string> Check(Clock::time_point now, Transport& transport,
                                    const std::function<std::string(int)>& name);

 private:
  std::chrono::milliseconds interval_, timeout_;
  std::atomic<bool> on_{false};
  std::atomic<int64_t> busy_since_{0};  // steady ns; 0 when not in a handler
  std::mutex mu_;
  std::map<int, Clock::time_point> last_heard_;
  std::vector<int> connected_;
};

}  // namespace pskv
