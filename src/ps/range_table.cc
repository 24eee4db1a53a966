// RangeTable (ps/range_table.h).
#include "ps/range_table.h"

#include <algorithm>
#include <set>

#include "protocol/message.h"
#include "pskv/error.h"

namespace pskv {

RangeTable RangeTable::Initial(int num_servers, int replicas, int spares) {
  RangeTable t;
  for (int k = 0; k < spares; ++k) t.spares_.push_back(ServerId(num_servers + k));
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

RangeTable RangeTable::FromData(const payload::RangeTableData& data, int num_servers, int spares) {
  auto bad = [](const std::string& why) { throw ProtocolError("range table: " + why); };
  if (static_cast<int>(data.ranges.size()) != num_servers)
    bad(std::to_string(data.ranges.size()) + " ranges for " + std::to_string(num_servers) +
        " servers");
  auto is_server = [&](int id) {
    return IsServerId(id) && RankOfId(id) < num_servers + std::max(spares, 0);
  };
  std::set<int> holders;
  for (const auto& r : data.ranges) {
    if (!is_server(r.primary)) bad("primary " + std::to_string(r.primary) + " is not a server");
    std::set<int> seen{r.primary};
    for (const auto* list : {&r.replicas, &r.joining})
      for (int id : *list)
        if (!is_server(id) || !seen.insert(id).second)
          bad("replica " + std::to_string(id) + " is not a server or is listed twice");
    holders.insert(seen.begin(), seen.end());
  }
  std::set<int> idle;
  for (int id : data.spares)
    if (!is_server(id) || holders.count(id) || !idle.insert(id).second)
      bad("spare " + std::to_string(id) + " is not a server, holds a range or is listed twice");
  RangeTable t;
  t.version_ = data.version;
  t.ranges_ = data.ranges;
  t.spares_ = data.spares;
  return t;
}

payload::RangeTableData RangeTable::ToData() const {
  return {version_, ranges_, spares_};
}

bool RangeTable::IsSpare(int id) const {
  return std::find(spares_.begin(), spares_.end(), id) != spares_.end();
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
  if (!PrimaryOf(id).empty() || !ReplicaOf(id).empty()) return true;
  for (const auto& r : ranges_)
    if (std::find(r.joining.begin(), r.joining.end(), id) != r.joining.end()) return true;
  return false;
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
    auto j = std::find(r.joining.begin(), r.joining.end(), id);
    if (j != r.joining.end()) {
      r.joining.erase(j);
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
  if (auto s = std::find(spares_.begin(), spares_.end(), id); s != spares_.end()) {
    spares_.erase(s);
    out.changed = true;
  }
  if (out.changed) ++version_;
  return out;
}

int RangeTable::AssignSpare(int replicas) {
  if (spares_.empty()) return 0;
  const int spare = spares_.front();
  bool assigned = false;
  for (auto& r : ranges_) {
    if (static_cast<int>(r.replicas.size() + r.joining.size()) >= replicas) continue;
    r.joining.push_back(spare);
    assigned = true;
  }
  if (!assigned) return 0;
  spares_.erase(spares_.begin());
  ++version_;
  return spare;
}

bool RangeTable::Joined(int range, int id) {
  if (range < 0 || range >= num_ranges()) return false;
  auto& r = ranges_[static_cast<size_t>(range)];
  auto it = std::find(r.joining.begin(), r.joining.end(), id);
  if (it == r.joining.end()) return false;
  r.joining.erase(it);
  r.replicas.push_back(id);
  ++version_;
  return true;
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
    if (ranges_[i].replicas.empty() && ranges_[i].joining.empty()) s += " -";
    for (int id : ranges_[i].replicas) s += " " + name(id);
    for (int id : ranges_[i].joining) s += " " + name(id) + " (copying)";
    s += ")";
  }
  if (!spares_.empty()) {
    s += "; spares:";
    for (int id : spares_) s += " " + name(id);
  }
  return s;
}

}  // namespace pskv
