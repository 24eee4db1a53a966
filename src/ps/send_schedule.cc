#include "ps/send_schedule.h"

namespace pskv {

bool SendSchedule::Enqueue(int to, Message& m) {
  Lane& lane = lanes_[to];
  if (lane.queue.size() >= kMaxQueued) return false;
  lane.queue.emplace(std::make_pair(-static_cast<int64_t>(m.h.priority), order_++), std::move(m));
  return true;
}

bool SendSchedule::Credit(int from, uint64_t count) {
  auto it = lanes_.find(from);
  if (it == lanes_.end() || count > it->second.sent) return false;
  Lane& lane = it->second;
  while (lane.credited < count) {  // cumulative: a stale or repeated credit changes nothing
    lane.in_flight -= lane.unacked.front();
    lane.unacked.pop_front();
    ++lane.credited;
  }
  return true;
}

uint64_t SendSchedule::InFlight(int to) const {
  auto it = lanes_.find(to);
  return it == lanes_.end() ? 0 : it->second.in_flight;
}

size_t SendSchedule::Queued(int to) const {
  auto it = lanes_.find(to);
  return it == lanes_.end() ? 0 : it->second.queue.size();
}

}  // namespace pskv
