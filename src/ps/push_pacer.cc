#include "ps/push_pacer.h"

namespace pskv {

bool PushPacer::Add(size_t index, int server, uint64_t bytes) {
  Lane& lane = lanes_[server];
  if (!lane.queue.empty() || !Fits(lane, bytes)) {  // never overtakes a waiting one
    lane.queue.emplace_back(index, bytes);
    return false;
  }
  lane.in_flight += bytes;
  sent_.emplace(index, std::make_pair(server, bytes));
  return true;
}

std::vector<size_t> PushPacer::Answered(size_t index) {
  std::vector<size_t> go;
  auto it = sent_.find(index);
  if (it == sent_.end()) return go;  // not sent through the pacer (or answered already)
  const int server = it->second.first;
  Lane& lane = lanes_[server];
  lane.in_flight -= it->second.second;
  sent_.erase(it);
  while (!lane.queue.empty() && Fits(lane, lane.queue.front().second)) {
    auto [next, bytes] = lane.queue.front();
    lane.queue.pop_front();
    lane.in_flight += bytes;
    sent_.emplace(next, std::make_pair(server, bytes));
    go.push_back(next);
  }
  return go;
}

size_t PushPacer::Held() const {
  size_t n = 0;
  for (auto& [server, lane] : lanes_) n += lane.queue.size();
  return n;
}

}  // namespace pskv
