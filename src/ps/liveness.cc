#include "ps/liveness.h"

#include <cstdio>

namespace pskv {

namespace {
std::string Secs(std::chrono::nanoseconds d) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", static_cast<double>(d.count()) / 1e9);
  return b;
}
}  // namespace

void Liveness::Start(const std::vector<int>& silent_watch, const std::vector<int>& connected) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto now = Clock::now();
  for (int id : silent_watch) last_heard_[id] = now;
  connected_ = connected;
  on_ = timeout_.count() > 0;
}

void Liveness::Heard(int id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = last_heard_.find(id);
  if (it != last_heard_.end()) it->second = Clock::now();
}

void Liveness::BusyBegin() {
  busy_since_ = Clock::now().time_since_epoch().count();
}

void Liveness::BusyEnd() {
  // Under mu_, so that Check never sees "not busy" with times not yet shifted.
  std::lock_guard<std::mutex> lk(mu_);
  const auto since = Clock::time_point(Clock::duration(busy_since_.exchange(0)));
  const auto now = Clock::now();
  // We were not listening: what peers sent meanwhile is still queued. Count their
  // silence as if the handler had taken no time — also for short handlers, which
  // back to back can keep the thread from listening as long as one long one.
  for (auto& [id, t] : last_heard_) t += now - since;
}

std::pair<int, std::string> Liveness::Check(Clock::time_point now, Transport& transport,
                                            const std::function<std::string(int)>& name) {
  if (!on_) return {0, {}};
  int silent = 0;
  Clock::duration quiet{};
  std::vector<int> connected;
  {
    // Never call out (name() takes the node's lock) while holding ours.
    std::lock_guard<std::mutex> lk(mu_);
    if (busy_since_.load() != 0) return {0, {}};  // not listening: decide nothing now
    for (auto& [id, t] : last_heard_)
      if (now - t > timeout_) {
        silent = id;
        quiet = now - t;
        break;
      }
    connected = connected_;
  }
  if (silent)
    return {silent, name(silent) + " is dead: nothing heard from it for " + Secs(quiet) +
                        " (PS_HEARTBEAT_TIMEOUT)"};
  for (int id : connected) {
    const auto down = transport.DownSince(id);
    if (down != Clock::time_point{} && now - down > timeout_ + interval_)
      return {id, "cannot reach " + name(id) + ": no connection for " + Secs(now - down) +
                      " (if it is alive: a network partition or a firewall between the two)"};
  }
  return {0, {}};
}

}  // namespace pskv
