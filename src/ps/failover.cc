// Node, part 5: surviving a server's death when servers replicate their key ranges
// (docs/fault-tolerance.md). The scheduler promotes replicas in its range table
// (ps/range_table.h) and publishes it (kRangeTable); every node applies the newer
// table, counts the dead server out of barriers and commands, and tells its range
// table handlers (the KV layer re-routes requests, servers take over ranges). With
// spare servers the scheduler also makes a spare join the ranges left short of a
// copy, and lists it as their replica once it reports the copy installed
// (kRangeCopied).
#include <algorithm>

#include "common/logging.h"
#include "ps/node.h"
#include "ps/node_internal.h"
#include "pskv/error.h"

namespace pskv {

void Node::AddRangeTableHandler(RangeTableHandler h) {
  std::lock_guard<std::mutex> lk(mu_);
  range_handlers_.push_back(std::move(h));
}

RangeTable Node::range_table() const {
  std::lock_guard<std::mutex> lk(mu_);
  return ranges_;
}

std::pair<int, uint64_t> Node::RangePrimary(int range) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (range < 0 || range >= ranges_.num_ranges()) return {-1, ranges_.version()};
  return {ranges_.Primary(range), ranges_.version()};
}

std::vector<int> Node::LiveServerIds() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int> v;
  for (int id : AllServerIds())
    if (!departed_.count(id)) v.push_back(id);
  return v;
}

bool Node::ServerLost(int id) const {
  if (!replicated_ || !IsServerId(id)) return false;
  std::lock_guard<std::mutex> lk(mu_);
  return departed_.count(id) || suspects_.count(id);
}

void Node::ReportRangeCopied(int range, int from, uint64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  if (failure_ || finished_) return;
  SendControl(kSchedulerId, Control::kRangeCopied, range, std::to_string(bytes),
              static_cast<uint64_t>(from));
}

void Node::HandleRangeCopied(const Message& m, int sender) {
  const int range = m.h.head;
  const int from = static_cast<int>(m.h.timestamp);
  if (!replicated_ || range < 0 || range >= ranges_.num_ranges()) return;
  // Only a copy sent by the range's current primary counts: one sent by a primary
  // that died since is replaced by the new primary's (it sends its own).
  if (ranges_.Primary(range) != from) {
    PSKV_WARN(Tag() << ": " << NameLocked(sender) << " installed key range " << range << " from "
                    << NameLocked(from) << ", which is not its primary any more; "
                    << "waiting for the copy of " << NameLocked(ranges_.Primary(range)));
    return;
  }
  if (!ranges_.Joined(range, sender)) return;  // repeated, or it left
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - copy_lost_at_).count();
  bool copying = false;
  for (int r = 0; r < ranges_.num_ranges(); ++r) copying |= !ranges_.Joining(r).empty();
  PSKV_WARN(Tag() << ": " << NameLocked(sender) << " installed its copy of key range " << range
                  << " (" << m.body << " bytes from " << NameLocked(from)
                  << ") and is now its replica, " << ms << " ms after " << copy_lost_what_
                  << (copying ? "; range table " : "; back to full strength: ")
                  << ranges_.Describe());
  PublishRangesLocked();
  bool still = false;  // joining another range
  for (int r = 0; r < ranges_.num_ranges(); ++r) {
    const auto& j = ranges_.Joining(r);
    still |= std::find(j.begin(), j.end(), sender) != j.end();
  }
  if (!still) status_.Joined(NodeRefOf(sender));  // the launcher reports it
}

void Node::PublishRangesLocked() {
  const std::string body = payload::EncodeRangeTable(ranges_.ToData());
  for (auto& [id, d] : nodes_) {
    if (id == kSchedulerId || departed_.count(id)) continue;
    try {
      SendControl(id, Control::kRangeTable, 0, body);
    } catch (...) {
    }
  }
}

bool Node::SurviveServer(int dead_id, std::string* reason) {
  std::vector<RangeTableHandler> handlers;
  RangeTable table;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failure_ || finished_) return false;
    if (departed_.count(dead_id)) return true;  // handled already
    RangeTable next = ranges_;
    const auto removal = next.Remove(dead_id);
    if (!removal.lost.empty()) {
      std::string lost;
      for (int r : removal.lost) lost += (lost.empty() ? "" : ", ") + std::to_string(r);
      *reason += " (no live copy left of key range" +
                 std::string(removal.lost.size() > 1 ? "s " : " ") + lost + ")";
      return false;
    }
    if (const int spare = next.AssignSpare(options_.replicas)) {
      copy_lost_at_ = Clock::now();
      copy_lost_what_ = NameLocked(dead_id) + " was lost";
      PSKV_WARN(Tag() << ": spare " << NameLocked(spare)
                      << " joins the key ranges left short of a copy; their primaries send it "
                         "their state");
    }
    ranges_ = next;
    departed_.insert(dead_id);
    removal_reason_[dead_id] = *reason;
    TellRemovedLocked(dead_id);
    held_.erase(dead_id);
    schedule_.Forget(dead_id);
    for (auto& [group, arrived] : barrier_arrived_) arrived.erase(dead_id);
    PSKV_WARN(Tag() << ": " << *reason
                    << "; its key ranges continue on their replicas: " << ranges_.Describe());
    PublishRangesLocked();
    ReleaseCompletedBarriers();
    handlers = range_handlers_;
    table = ranges_;
  }
  liveness_.Forget(dead_id);
  resender_.Forget(dead_id);
  status_.Departed(NodeRefOf(dead_id));  // the launcher lets the job go on without it
  for (auto& h : handlers) h(table);
  return true;
}

void Node::CheckSuspects(Clock::time_point now) {
  // A server this node lost that the scheduler keeps (it still hears from it): a
  // partition between the two. Waiting for a table that never comes would end only
  // at PSKV_TIMEOUT; after as long again as this node's own detection took, fail.
  const auto grace = options_.heartbeat_timeout + options_.heartbeat_interval;
  std::pair<int, std::string> lost;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = suspects_.begin(); it != suspects_.end();) {
      if (departed_.count(it->first)) {
        it = suspects_.erase(it);
      } else if (!lost.first && now - it->second.since > grace) {
        lost = {it->first, it->second.reason};
        ++it;
      } else {
        ++it;
      }
    }
  }
  if (!lost.first) return;
  const std::string why = lost.second + ", yet the scheduler still counts " + NodeName(lost.first) +
                          " in the job " + node_internal::SecsStr(grace) +
                          " later: a network partition between this node and that server "
                          "(check the network between the two hosts)";
  Fail(std::make_exception_ptr(NodeFailure(why)), lost.first);
}

void Node::HandleRangeTable(const Message& m, std::unique_lock<std::mutex>& lk) {
  if (!replicated_) return;
  RangeTable next;
  try {
    next = RangeTable::FromData(payload::DecodeRangeTable(m.body), options_.num_servers,
                                options_.spare_servers);
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(limiter_, "range table", "WARN", Tag() << ": dropped: " << e.what());
    return;
  }
  if (!ranges_.Apply(next)) return;  // not newer
  std::vector<int> gone;
  for (int id : AllServerIds())
    if (ranges_.Gone(id) && departed_.insert(id).second) gone.push_back(id);
  for (int id : gone) {
    held_.erase(id);
    schedule_.Forget(id);
  }
  if (options_.verbose >= 1) PSKV_INFO(Tag() << ": range table " << ranges_.Describe());
  auto handlers = range_handlers_;
  RangeTable table = ranges_;
  lk.unlock();
  for (int id : gone) {
    liveness_.Forget(id);
    resender_.Forget(id);
    transport_->Disconnect(id);  // what it still sends is dropped (Handle)
  }
  for (auto& h : handlers) h(table);
}

void Node::TellRemovedLocked(int id) {
  // Repeated for what the removed node sends later (it may have missed the first
  // notice: a partition), at most once a second. Unsequenced, so that it is never
  // held back behind messages the resender forgot when the node was removed.
  const auto now = Clock::now();
  auto& last = removed_told_[id];
  if (last != Clock::time_point{} && now - last < std::chrono::seconds(1)) return;
  last = now;
  Message m;
  m.h.control = static_cast<uint8_t>(Control::kNodeFailed);
  m.h.head = id;
  m.h.sender = id_;
  m.h.recver = id;
  m.h.job = job_;
  m.body = removal_reason_[id];
  try {
    transport_->Send(id, Encode(m));
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(limiter_, "removed", "WARN",
                     Tag() << ": could not tell " << NameLocked(id)
                           << " that it was removed from the job: " << e.what());
  }
}

void Node::ReleaseCompletedBarriers() {
  for (auto& [group, arrived] : barrier_arrived_)
    if (!arrived.empty() && static_cast<int>(arrived.size()) >= GroupSize(group))
      HandleBarrier(*arrived.begin(), group);
}

}  // namespace pskv
