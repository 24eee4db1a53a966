// Liveness: decides that a peer is gone, from two signals.
//  * Silence: nothing received from a watched peer (the scheduler watches every
//    node; a node watches the scheduler) for `timeout` of *listening* time. Time
//    this node was not listening is not the peer's silence, so a busy or starved
//    node never declares its healthy peers dead:
//      - the receive thread is deaf from the moment Recv returns a message until it
//        calls Recv again (a big merge, a slow optimizer, a full shard queue, many
//        short handlers back to back): what peers sent meanwhile is still queued;
//      - the process was not scheduled (an overloaded host, SIGSTOP, a VM pause):
//        the timer thread sees its own sleep overrun and counts the overrun as deaf
//        time too (without counting twice what the receive thread already did).
//    Silence is measured on a "listening clock" that stops while the node is deaf.
//  * Connection down: the transport lost its connection to a peer this node
//    sends to (ZMTP heartbeats on every connection catch half-open ones and
//    worker<->server partitions the scheduler cannot see) for longer than
//    `timeout` + `interval` (longer than silence, so that when a node died the
//    scheduler's verdict, which names the cause, arrives first).
//  * Gone (only where Start was asked to trust it: the scheduler): the transport
//    saw the connection to a peer close and a new one fail (Transport::GoneSince:
//    nothing listens on its port any more): the process exited or was killed, and
//    it is declared dead at once, without waiting for its silence. A killed
//    process's connections close with it, so its death is known within ZeroMQ's
//    first reconnection attempt (100-200 ms), not the heartbeat timeout.
// What no node can tell apart: a peer that is starved for longer than `timeout`
// is silent to everyone else, exactly like a hung one (docs/design.md, "Failure
// detection": raise PS_HEARTBEAT_TIMEOUT on hosts that are overloaded on purpose).
// Thread-safe: Heard/Deaf/Listening from the receive thread, Starved/Check from the
// timer thread.
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

  /// Starts watching `silent_watch` for silence and `connected` for connection loss
  /// (and, with `trust_gone`, for being gone).
  void Start(const std::vector<int>& silent_watch, const std::vector<int>& connected,
             bool trust_gone = false);
  void Stop() { on_ = false; }
  /// Stops watching peer `id` (it left the job and the job goes on without it).
  void Forget(int id);
  /// Watches peer `id` again (silence, unless `silence` is false, and connection), as
  /// if just heard from.
  void Watch(int id, bool silence = true);
  void Heard(int id);
  /// The receive thread got a message (stops listening) / calls Recv again.
  void Deaf(Clock::time_point now = Clock::now());
  void Listening(Clock::time_point now = Clock::now());
  /// The timer thread's sleep ending at `now` overran by `lag`: the process was not
  /// scheduled for about that long.
  void Starved(Clock::time_point now, Clock::duration lag);
  /// First peer found gone at `now` with the reason, or {0, ""}. `name(id)`
  /// describes a node ("worker[1] at host:port").
  std::pair<int, std::string> Check(Clock::time_point now, Transport& transport,
                                    const std::function<std::string(int)>& name);

 private:
  /// Listening time elapsed at `now` (under mu_).
  Clock::duration ListenClock(Clock::time_point now) const;

  std::chrono::milliseconds interval_, timeout_;
  std::atomic<bool> on_{false};
  std::mutex mu_;
  Clock::time_point deaf_since_{};             // epoch (zero) while listening
  Clock::duration deaf_total_{};               // finished deaf periods and starvation
  std::map<int, Clock::duration> last_heard_;  // listening clock at the last message
  std::vector<int> connected_;
  bool trust_gone_ = false;
};

}  // namespace pskv
