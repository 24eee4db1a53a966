#include "ps/liveness.h"

#include <algorithm>
#include <cstdio>

namespace pskv {

namespace {
std::string Secs(std::chrono::nanoseconds d) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", static_cast<double>(d.count()) / 1e9);
  return b;
}
}  // namespace

Liveness::Clock::duration Liveness::ListenClock(Clock::time_point now) const {
  const Clock::time_point upto = deaf_since_ != Clock::time_point{} ? deaf_since_ : now;
  return upto.time_since_epoch() - deaf_total_;
}

void Liveness::Start(const std::vector<int>& silent_watch, const std::vector<int>& connected,
                     bool trust_gone) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto at = ListenClock(Clock::now());
  for (int id : silent_watch) last_heard_[id] = at;
  connected_ = connected;
  trust_gone_ = trust_gone;
  on_ = timeout_.count() > 0;
}

void Liveness::Forget(int id) {
  std::lock_guard<std::mutex> lk(mu_);
  last_heard_.erase(id);
  connected_.erase(std::remove(connected_.begin(), connected_.end(), id), connected_.end());
}

void Liveness::Watch(int id, bool silence) {
  std::lock_guard<std::mutex> lk(mu_);
  if (silence) last_heard_[id] = ListenClock(Clock::now());
  if (std::find(connected_.begin(), connected_.end(), id) == connected_.end())
    connected_.push_back(id);
}

void Liveness::Heard(int id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = last_heard_.find(id);
  if (it != last_heard_.end()) it->second = ListenClock(Clock::now());
}

void Liveness::Deaf(Clock::time_point now) {
  std::lock_guard<std::mutex> lk(mu_);
  if (deaf_since_ == Clock::time_point{}) deaf_since_ = now;
}

void Liveness::Listening(Clock::time_point now) {
  std::lock_guard<std::mutex> lk(mu_);
  if (deaf_since_ == Clock::time_point{}) return;
  // What peers sent meanwhile is still queued: count their silence as if handling
  // had taken no time — also for short handlers, which back to back keep the
  // thread from listening as long as one long one.
  if (now > deaf_since_) deaf_total_ += now - deaf_since_;
  deaf_since_ = {};
}

void Liveness::Starved(Clock::time_point now, Clock::duration lag) {
  if (lag <= Clock::duration::zero()) return;
  std::lock_guard<std::mutex> lk(mu_);
  // The part of the overrun during which the receive thread was deaf anyway is
  // counted when it listens again.
  Clock::duration overlap{};
  if (deaf_since_ != Clock::time_point{} && now > deaf_since_)
    overlap = std::min<Clock::duration>(lag, now - deaf_since_);
  deaf_total_ += lag - overlap;
}

std::pair<int, std::string> Liveness::Check(Clock::time_point now, Transport& transport,
                                            const std::function<std::string(int)>& name) {
  if (!on_) return {0, {}};
  int silent = 0;
  Clock::duration quiet{};
  std::vector<int> connected;
  bool trust_gone = false;
  {
    // Never call out (name() takes the node's lock) while holding ours.
    std::lock_guard<std::mutex> lk(mu_);
    const auto at = ListenClock(now);
    for (auto& [id, t] : last_heard_)
      if (at - t > timeout_) {
        silent = id;
        quiet = at - t;
        break;
      }
    connected = connected_;
    trust_gone = trust_gone_;
  }
  if (trust_gone)
    for (int id : connected) {
      const auto gone = transport.GoneSince(id);
      if (gone != Clock::time_point{})
        return {id, name(id) +
                        " is dead: its connection closed and a new one was refused "
                        "(its process exited or was killed)"};
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
