// RangeTable (ps/range_table.h).
#include "ps/range_table.h"

#include <algorithm>
#include <set>

#include "protocol/message.h"
#include "pskv/error.h"

namespace pskv {

RangeTable RangeTable::Initial(int num_servers, int replicas) {
  RangeTable t;
  t.version_ = 1;
  const int r = std::clamp(replicas, 0, std::max(num_servers - 1, 0));
  for (int i = 0; i < num_servers; ++i) {
    payload::RangeHolders h;
    h.primary = ServerId(i);
    for (int k = 1; k <= r; ++k) h.replicas.push_back(ServerId((i + k) % num_servers));
    t.ranges_.push_back(std::move(h));
  }
  return t;
}

RangeTable RangeTable::FromData(const payload::RangeTableData& data, int num_servers) {
  auto bad = [](const std::string& why) { throw ProtocolError("range table: " + why); };
  if (static_cast<int>(data.ranges.size()) != num_servers)
    bad(std::to_string(data.ranges.size()) + " ranges for " + std::to_string(num_servers) +
        " servers");
  auto is_server = [&](int id) { return IsServerId(id) && RankOfId(id) < num_servers; };
  for (const auto& r : data.ranges) {
    if (!is_server(r.primary)) bad("primary " + std::to_string(r.primary) + " is not a server");
    std::set<int> seen{r.primary};
    for (int id : r.replicas)
      if (!is_server(id) || !seen.insert(id).second)
        bad("replica " + std::to_string(id) + " is not a server or is listed twice");
  }
  RangeTable t;
  t.version_ = data.version;
  t.ranges_ = data.ranges;
  return t;
}

payload::RangeTableData RangeTable::ToData() const {
  return {version_, ranges_};
}

std::vector<int> RangeTable::PrimaryOf(int id) const {
  std::vector<int> out;
  for (size_t i = 0; i < ranges_.size(); ++i)
    if (ranges_[i].primary == id) out.push_back(static_cast<int>(i));
  return out;
}

std::vector<int> RangeTable::ReplicaOf(int id) const {
  std::vector<int> out;
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const auto& reps = ranges_[i].replicas;
    if (std::find(reps.begin(), reps.end(), id) != reps.end()) out.push_back(static_cast<int>(i));
  }
  return out;
}

bool RangeTable::Holds(int id) const {
  return !PrimaryOf(id).empty() || !ReplicaOf(id).empty();
}

RangeTable::Removal RangeTable::Remove(int id) {
  Removal out;
  for (size_t i = 0; i < ranges_.size(); ++i) {
    auto& r = ranges_[i];
    auto it = std::find(r.replicas.begin(), r.replicas.end(), id);
    if (it != r.replicas.end()) {
      r.replicas.erase(it);
      out.changed = true;
    }
    if (r.primary != id) continue;
    if (r.replicas.empty()) {
      out.lost.push_back(static_cast<int>(i));
      continue;
    }
    r.primary = r.replicas.front();
    r.replicas.erase(r.replicas.begin());
    out.changed = true;
  }
  if (out.changed) ++version_;
  return out;
}

bool RangeTable::Apply(const RangeTable& newer) {
  if (newer.version_ <= version_) return false;
  *this = newer;
  return true;
}

std::string RangeTable::Describe() const {
  auto name = [](int id) { return "server[" + std::to_string(RankOfId(id)) + "]"; };
  std::string s = "v" + std::to_string(version_) + ":";
  for (size_t i = 0; i < ranges_.size(); ++i) {
    s += (i ? ", range " : " range ") + std::to_string(i) + " " + name(ranges_[i].primary) +
         " (replicas:";
    if (ranges_[i].replicas.empty()) s += " -";
    for (int id : ranges_[i].replicas) s += " " + name(id);
    s += ")";
  }
  return s;
}

}  // namespace pskv
