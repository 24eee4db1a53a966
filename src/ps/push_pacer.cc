#include "ps/push_pacer.h"

#include <algorithm>

namespace pskv {

PushPacer::PushPacer(uint64_t ahead, const std::vector<std::pair<int, uint64_t>>& plan)
    : ahead_(ahead) {
  std::map<int, uint64_t> total;
  uint64_t most = 0;
  for (auto& [server, bytes] : plan) most = std::max(most, total[server] += bytes);
  // Where each message's middle lies in its server's part, as a fraction.
  std::vector<std::pair<long double, size_t>> at;
  std::map<int, uint64_t> before;
  for (size_t i = 0; i < plan.size(); ++i) {
    const auto [server, bytes] = plan[i];
    const long double mid = static_cast<long double>(before[server]) + bytes / 2.0L;
    before[server] += bytes;
    at.emplace_back(total[server] ? mid / static_cast<long double>(total[server]) : 0.0L, i);
  }
  std::stable_sort(at.begin(), at.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [fraction, i] : at) order_.push_back(i);
  if (most == 0) return;
  for (auto& [server, bytes] : total) {
    // ahead * bytes / most without overflow (both can be large): in long double.
    const long double part = static_cast<long double>(ahead) * static_cast<long double>(bytes) /
                             static_cast<long double>(most);
    lanes_[server].ahead = std::max<uint64_t>(1, static_cast<uint64_t>(part));
  }
}

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
