// Membership (ps/membership.h): who is in the job as this node sees it — the node
// table and the identities it binds, groups, the departed servers and workers, the
// suspects, and the range table with replicated servers (docs/fault-tolerance.md).
// Node applies what the scheduler sends through it; the Scheduler decides it.
#include "ps/membership.h"

#include <algorithm>

namespace pskv {

Membership::Membership(const Options& o)
    : num_workers_(o.num_workers),
      num_servers_(o.num_servers),
      spare_servers_(o.spare_servers),
      scheduler_at_(o.root_uri + ":" + std::to_string(o.root_port)),
      standby_at_(o.standby_scheduler),
      replicated_(o.replicas > 0 && o.num_servers >= 2) {
  if (replicated_) ranges_ = RangeTable::Initial(o.num_servers, o.replicas, o.spare_servers);
}

std::vector<int> Membership::ServerIds() const {
  std::vector<int> v;
  for (int r = 0; r < num_servers_; ++r) v.push_back(ServerId(r));
  return v;
}

std::vector<int> Membership::AllServerIds() const {
  std::vector<int> v;
  for (int r = 0; r < num_servers_ + spare_servers_; ++r) v.push_back(ServerId(r));
  return v;
}

std::vector<int> Membership::WorkerIds() const {
  std::vector<int> v;
  for (int r = 0; r < num_workers_; ++r) v.push_back(WorkerId(r));
  return v;
}

std::vector<int> Membership::LiveServerIds() const {
  std::vector<int> v;
  for (int id : AllServerIds())
    if (!departed_.count(id)) v.push_back(id);
  return v;
}

std::vector<int> Membership::LiveWorkerIds() const {
  std::vector<int> v;
  for (int id : WorkerIds())
    if (!departed_workers_.count(id)) v.push_back(id);
  return v;
}

int Membership::GroupSize(int group) const {
  const int servers = num_servers_ + spare_servers_ - static_cast<int>(departed_.size());
  const int workers = num_workers_ - static_cast<int>(departed_workers_.size());
  return ((group & kSchedulerGroup) ? 1 : 0) + ((group & kServerGroup) ? servers : 0) +
         ((group & kWorkerGroup) ? workers : 0);
}

std::vector<int> Membership::GroupMembers(int group) const {
  std::vector<int> v;
  if (group & kSchedulerGroup) v.push_back(kSchedulerId);
  if (group & kServerGroup)
    for (int id : LiveServerIds()) v.push_back(id);
  if (group & kWorkerGroup)
    for (int id : LiveWorkerIds()) v.push_back(id);
  return v;
}

int Membership::IdOfToken(uint64_t token) const {
  auto it = id_of_token_.find(token);
  return it == id_of_token_.end() ? 0 : it->second;
}

std::string Membership::Name(int id) const {
  if (id == kSchedulerId) return "scheduler at " + scheduler_at_;
  if (id == kStandbyId) return "standby scheduler at " + standby_at_;
  std::string n =
      std::string(IsServerId(id) ? "server" : "worker") + "[" + std::to_string(RankOfId(id)) + "]";
  auto it = nodes_.find(id);
  if (it != nodes_.end()) n += " at " + it->second.host + ":" + std::to_string(it->second.port);
  return n;
}

std::string Membership::HostOf(int id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? std::string() : it->second.host;
}

std::pair<int, uint64_t> Membership::RangePrimary(int range) const {
  if (range < 0 || range >= ranges_.num_ranges()) return {-1, ranges_.version()};
  return {ranges_.Primary(range), ranges_.version()};
}

bool Membership::ServerLost(int id) const {
  if (!replicated_ || !IsServerId(id)) return false;
  return departed_.count(id) || suspects_.count(id);
}

void Membership::AdoptTable(const std::vector<NodeDesc>& all) {
  for (auto& d : all) {
    nodes_[d.id] = d;
    id_of_token_[d.token] = d.id;
  }
}

void Membership::Clear() {
  nodes_.clear();
  id_of_token_.clear();
}

NodeDesc Membership::PromoteStandby() {
  for (auto it = id_of_token_.begin(); it != id_of_token_.end();)
    it = it->second == kSchedulerId || it->second == kStandbyId ? id_of_token_.erase(it)
                                                                : std::next(it);
  NodeDesc sd = nodes_[kStandbyId];
  sd.id = kSchedulerId;
  nodes_.erase(kStandbyId);
  nodes_[kSchedulerId] = sd;
  id_of_token_[sd.token] = kSchedulerId;
  return sd;
}

bool Membership::DropStandby() {
  auto it = nodes_.find(kStandbyId);
  if (it == nodes_.end()) return false;
  id_of_token_.erase(it->second.token);
  nodes_.erase(it);
  return true;
}

bool Membership::SetStandby(const NodeDesc& d) {
  auto it = nodes_.find(kStandbyId);
  if (it != nodes_.end() && it->second.token == d.token) return false;  // resent
  if (it != nodes_.end()) id_of_token_.erase(it->second.token);
  nodes_[kStandbyId] = d;
  id_of_token_[d.token] = kStandbyId;
  return true;
}

bool Membership::ApplyRanges(const RangeTable& next, std::vector<int>* gone) {
  if (!ranges_.Apply(next)) return false;  // not newer
  for (int id : AllServerIds())
    if (ranges_.Gone(id) && departed_.insert(id).second) gone->push_back(id);
  return true;
}

bool Membership::Suspect(int id, const std::string& reason) {
  if (departed_.count(id)) return false;
  suspects_.emplace(id, Suspect_{Clock::now(), reason});
  return true;
}

std::pair<int, std::string> Membership::OverdueSuspect(Clock::time_point now,
                                                       Clock::duration grace) {
  std::pair<int, std::string> lost;
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    if (departed_.count(it->first)) {
      it = suspects_.erase(it);
    } else {
      if (!lost.first && now - it->second.since > grace) lost = {it->first, it->second.reason};
      ++it;
    }
  }
  return lost;
}

bool Membership::WorkerJoined(const NodeDesc& d) {
  auto it = nodes_.find(d.id);
  if (it != nodes_.end() && it->second.token == d.token) return false;  // resent
  if (it != nodes_.end()) id_of_token_.erase(it->second.token);         // the process that left
  nodes_[d.id] = d;
  id_of_token_[d.token] = d.id;
  departed_workers_.erase(d.id);
  return true;
}

}  // namespace pskv
