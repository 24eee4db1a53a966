// Replicator (distributed/server/replication.h).
#include "kvstore/distributed/server/replication.h"

#include <algorithm>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "ps/kv_app.h"

namespace pskv {

Replicator::Replicator(Node* node) : node_(node), table_(node->range_table()) {
  node_->AddRangeTableHandler([this](const RangeTable& t) { OnRangeTable(t); });
  node_->AddFailureHandler([this](std::exception_ptr e) { OnFailure(e); });
}

std::vector<int> Replicator::Targets(int range) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int> out;
  if (range < 0 || range >= table_.num_ranges()) return out;
  const int self = node_->id();
  if (table_.Primary(range) != self) out.push_back(table_.Primary(range));
  for (int id : table_.Replicas(range))
    if (id != self) out.push_back(id);
  if (auto it = copying_.find(range); it != copying_.end()) {
    const auto& joining = table_.Joining(range);
    for (int id : it->second)
      if (std::find(joining.begin(), joining.end(), id) != joining.end()) out.push_back(id);
  }
  return out;
}

void Replicator::AddCopying(int range, int id) {
  std::lock_guard<std::mutex> lk(mu_);
  copying_[range].insert(id);
}

uint64_t Replicator::version() const {
  std::lock_guard<std::mutex> lk(mu_);
  return table_.version();
}

bool Replicator::Holds(int range, int id) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (range < 0 || range >= table_.num_ranges()) return false;
  if (table_.Primary(range) == id) return true;
  for (int r : table_.Replicas(range))
    if (r == id) return true;
  return false;
}

size_t Replicator::Pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return pending_.size();
}

void Replicator::Send(const std::vector<int>& to, Message m, Done done) {
  uint64_t ts;
  std::vector<int> live;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // `to` was chosen from an earlier look at the table (Targets): a server that a
    // newer table removed meanwhile is left out here, under the lock that OnRangeTable
    // takes, or this request would wait for its answer forever (OnRangeTable releases
    // only the requests pending when the table arrives).
    for (int id : to)
      if (table_.Holds(id)) live.push_back(id);
    if (!live.empty()) {
      ts = next_ts_++;
      Request r;
      r.waiting.insert(live.begin(), live.end());
      r.done = std::move(done);
      if (live.size() > 1) {
        // A test may send the change to one of them only (FailPoints::ReplicationFanout).
        const dist::Kind kind = dist::CmdKind(m.h.head);
        node_->fail_points().ReplicationFanout(
            &live, kind == dist::Kind::kReplicateSparse  ? "a row_sparse round"
                   : kind == dist::Kind::kReplicateAsync ? "async pushes"
                   : kind == dist::Kind::kReplicate      ? "a dense round"
                                                         : "another change");
        r.narrowed = live.size() < r.waiting.size();
      }
      pending_.emplace(ts, std::move(r));
    }
  }
  if (live.empty()) return done(nullptr);
  m.h.flags |= kRequest;
  m.h.timestamp = ts;
  for (int id : live) {
    try {
      node_->Send(id, m);
    } catch (const std::exception& e) {
      // A replica that is gone is dropped by the next range table; the job's failure
      // fails every request (OnFailure).
      PSKV_WARN(node_->Tag() << ": replication to " << node_->NodeName(id) << ": " << e.what());
    }
  }
}

void Replicator::OnReply(Message&& m) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = pending_.find(m.h.timestamp);
  if (it == pending_.end() || !it->second.waiting.erase(m.h.sender)) return;  // duplicate
  if (it->second.narrowed) node_->fail_points().NarrowedChangeAnswered(m.h.sender);
  if ((m.h.flags & kError) && !it->second.error)
    it->second.error = MakeError(static_cast<ErrorKind>(m.h.head),
                                 "replica " + node_->NodeName(m.h.sender) + ": " + m.body);
  FinishReady(lk);
}

void Replicator::OnRangeTable(const RangeTable& t) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!table_.Apply(t)) return;
  // A spare that joined (now a replica) or left no longer needs its own entry.
  for (auto& [range, ids] : copying_) {
    const auto& joining = range < table_.num_ranges() ? table_.Joining(range) : std::vector<int>{};
    for (auto it = ids.begin(); it != ids.end();)
      it = std::find(joining.begin(), joining.end(), *it) != joining.end() ? std::next(it)
                                                                           : ids.erase(it);
  }
  for (auto& [ts, r] : pending_)
    for (auto it = r.waiting.begin(); it != r.waiting.end();)
      it = table_.Holds(*it) ? std::next(it) : r.waiting.erase(it);
  FinishReady(lk);
}

void Replicator::OnFailure(std::exception_ptr e) {
  std::unique_lock<std::mutex> lk(mu_);
  for (auto& [ts, r] : pending_) {
    r.waiting.clear();
    if (!r.error) r.error = e;
  }
  FinishReady(lk);
}

void Replicator::FinishReady(std::unique_lock<std::mutex>& lk) {
  std::vector<Request> ready;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.waiting.empty()) {
      ready.push_back(std::move(it->second));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  lk.unlock();
  for (auto& r : ready) r.done(r.error);
  lk.lock();
}

}  // namespace pskv
