// Scheduler, part 3: elastic workers (PSKV_ELASTIC; docs/fault-tolerance.md, "Elastic
// workers"). A worker that dies, is silent or leaves before the end is dropped from the
// job: every node hears kWorkerLeft (servers close the rounds it did not push with the
// pushes that arrived), barriers count it out, the launcher lets the job go on
// (status: departed) — unless fewer than PSKV_MIN_WORKERS would be left.
//
// Joining: a worker that registers after the job formed (a new or restarted process,
// authenticated like any node: only a connection that passed the transport's handshake
// gets here) takes the place of one that left. It waits until the workers' next epoch
// barrier (kEpochGroup: KVStore::EpochPartition) completes; then, before releasing it,
// the scheduler gives it the rank that left (its DMLC_TASK_ID's if that one left, else
// the lowest), sends it the node table (head 1: "joined"), the range table and the
// workers still gone, tells every node (kWorkerJoined) and holds the release until
// every live server answered kJoinReady: no push of the newcomer can reach a server
// that does not expect it, and every round after the release expects it. All workers
// count it in that release's partition (Node::LiveWorkersAtRelease).
#include <algorithm>
#include <iterator>

#include "common/logging.h"
#include "protocol/payload.h"
#include "ps/node.h"
#include "ps/scheduler.h"

namespace pskv {

bool Scheduler::SurviveWorker(int dead_id, std::string* reason) {
  Node& n = *node_;
  {
    std::lock_guard<std::mutex> lk(n.mu_);
    if (n.failure_ || n.finished_) return false;
    if (RankOfId(dead_id) >= n.options_.num_workers) return false;
    if (n.members_.departed_workers_.count(dead_id)) return true;  // handled already
    const int left =
        n.options_.num_workers - static_cast<int>(n.members_.departed_workers_.size()) - 1;
    if (left < n.options_.min_workers) {
      *reason +=
          "; " + std::to_string(left) + " worker" + (left == 1 ? "" : "s") +
          " would be left, fewer than PSKV_MIN_WORKERS=" + std::to_string(n.options_.min_workers);
      return false;
    }
    n.members_.departed_workers_.insert(dead_id);
    state_.removal_reason[dead_id] = *reason;
    TellRemoved(dead_id);  // in case it still runs (frozen, cut off)
    n.held_.erase(dead_id);
    n.send_.Forget(dead_id);
    state_.barriers.Depart(dead_id);
    PSKV_WARN(n.Tag() << ": " << *reason << "; the job goes on with " << left << " of "
                      << n.options_.num_workers << " workers (PSKV_ELASTIC)");
    for (auto& [id, d] : n.members_.nodes_) {
      if (id == kSchedulerId || id == dead_id || n.members_.departed_.count(id) ||
          n.members_.departed_workers_.count(id))
        continue;
      try {
        n.SendControl(id, Control::kWorkerLeft, dead_id, *reason);
      } catch (...) {
      }
    }
    ReleaseCompletedBarriers();
  }
  n.liveness_.Forget(dead_id);
  n.resender_.Forget(dead_id);
  n.status_.Departed(NodeRefOf(dead_id));  // the launcher lets the job go on without it
  return true;
}

std::string Scheduler::JoinRefusal(const NodeDesc& d, const Message& m) const {
  const Node& n = *node_;
  const Options& o = n.options_;
  const RegisterHead head = RegisterHead::Decode(m.h.head);
  auto differs = [&](const char* var, int theirs, int ours) {
    return std::string(var) + " differs: the worker set " + std::to_string(theirs) + ", the job " +
           std::to_string(ours) + " (set the same " + var + " on every node)";
  };
  if (n.failure_ || n.finished_) return "the job is ending";
  if (!head.elastic) return differs("PSKV_ELASTIC", 0, 1);
  if (head.replicas != o.replicas) return differs("PSKV_REPLICAS", head.replicas, o.replicas);
  if (head.spares != o.spare_servers)
    return differs("PSKV_SPARE_SERVERS", head.spares, o.spare_servers);
  if (!state_.worker_layout.empty() && d.layout != state_.worker_layout)
    return "the worker cuts its keys differently from the job's workers: it has " + d.layout +
           ", they " + state_.worker_layout + " (set the same on every worker)";
  return {};  // a place is looked for at the epoch barrier (the death may not be known yet)
}

void Scheduler::OnJoinRequest(const NodeDesc& d, const Message& m) {
  Node& n = *node_;
  if (state_.joiners.count(d.token)) {  // its registration, repeated while it waits
    n.SendControl(state_.temp_ids[d.token], Control::kHeartbeat, 1);
    return;
  }
  if (const std::string why = JoinRefusal(d, m); !why.empty()) {
    PSKV_WARN(n.Tag() << ": refused the worker at " << d.host << ":" << d.port
                      << " that asked to join the running job: " << why);
    return Refuse(d, why);
  }
  ReplyTo(d, state_.next_temp_id++);
  state_.joiners[d.token] = d;
  n.SendControl(state_.temp_ids[d.token], Control::kHeartbeat, 1);  // "wait for the epoch"
  PSKV_WARN(n.Tag() << ": the worker at " << d.host << ":" << d.port
                    << " asks to join the running job (PSKV_ELASTIC); it joins at the workers' "
                       "next epoch barrier");
}

bool Scheduler::HoldForJoiners() {
  if (state_.join_held) {
    for (auto it = state_.join_acks.begin(); it != state_.join_acks.end();)
      it = node_->members_.departed_.count(*it) ? state_.join_acks.erase(it) : std::next(it);
    if (!state_.join_acks.empty()) return true;
    state_.join_held = false;
    return false;
  }
  return !state_.joiners.empty() && AdmitJoiners();
}

bool Scheduler::AdmitJoiners() {
  Node& n = *node_;
  const Options& o = n.options_;
  std::vector<int> admitted;
  for (auto& [token, asked] : state_.joiners) {
    // Its launcher's rank (DMLC_TASK_ID) if that worker left, else the lowest that left.
    int id = 0;
    if (asked.rank_hint >= 0 && asked.rank_hint < o.num_workers &&
        n.members_.departed_workers_.count(WorkerId(static_cast<int>(asked.rank_hint))))
      id = WorkerId(static_cast<int>(asked.rank_hint));
    else if (!n.members_.departed_workers_.empty())
      id = *n.members_.departed_workers_.begin();
    if (!id) {
      const std::string why = "the job has all its " + std::to_string(o.num_workers) +
                              " workers (DMLC_NUM_WORKER); with PSKV_ELASTIC a worker joins in "
                              "place of one that left";
      PSKV_WARN(n.Tag() << ": refused the worker at " << asked.host << ":" << asked.port
                        << " that asked to join the running job: " << why);
      try {
        Refuse(asked, why);
      } catch (const std::exception& e) {  // it left meanwhile: nothing to tell
        PSKV_WARN(n.Tag() << ": could not tell it: " << e.what());
      }
      continue;
    }
    NodeDesc d = asked;
    d.id = id;
    d.rank = RankOfId(id);
    if (auto old = n.members_.nodes_.find(id); old != n.members_.nodes_.end())
      n.members_.id_of_token_.erase(old->second.token);
    n.members_.nodes_[id] = d;
    n.members_.id_of_token_[d.token] = id;
    n.members_.departed_workers_.erase(id);
    state_.removal_reason.erase(id);
    state_.removed_told.erase(id);
    n.held_.erase(id);
    n.send_.Forget(id);
    n.resender_.Forget(id);
    if (auto t = state_.temp_ids.find(token); t != state_.temp_ids.end()) {
      n.transport_->Disconnect(t->second);
      state_.temp_ids.erase(t);
    }
    n.transport_->Disconnect(id);
    n.transport_->Connect(id, d.host + ":" + std::to_string(d.port), d.token);
    n.liveness_.Watch(id);
    n.status_.Returned(NodeRefOf(id));  // the launcher counts that rank in again
    admitted.push_back(id);
  }
  state_.joiners.clear();
  if (admitted.empty()) return false;
  std::vector<NodeDesc> all;
  for (auto& [i, x] : n.members_.nodes_) all.push_back(x);
  const std::string table = EncodeNodes(all);
  for (int id : admitted) {
    try {  // a newcomer that died meanwhile is dropped again (liveness)
      n.SendControl(id, Control::kNodeTable, 1, table);  // head 1: joined a running job
      if (n.members_.replicated_)
        n.SendControl(id, Control::kRangeTable, 0,
                      payload::EncodeRangeTable(n.members_.ranges_.ToData()));
      for (int gone : n.members_.departed_workers_)
        n.SendControl(id, Control::kWorkerLeft, gone, state_.removal_reason[gone]);
    } catch (const std::exception& e) {
      PSKV_WARN(n.Tag() << ": could not send " << n.NameLocked(id) << " the job: " << e.what());
    }
  }
  state_.join_acks.clear();
  for (int id : admitted) {
    const std::string body = EncodeNodes({n.members_.nodes_[id]});
    for (auto& [peer, x] : n.members_.nodes_) {
      if (peer == kSchedulerId || n.members_.departed_.count(peer) ||
          n.members_.departed_workers_.count(peer) ||
          std::find(admitted.begin(), admitted.end(), peer) != admitted.end())
        continue;
      try {
        n.SendControl(peer, Control::kWorkerJoined, id, body);
        if (IsServerId(peer)) state_.join_acks.insert(peer);
      } catch (...) {
      }
    }
    PSKV_WARN(n.Tag() << ": " << n.NameLocked(id) << " joined the running job (PSKV_ELASTIC): "
                      << o.num_workers - static_cast<int>(n.members_.departed_workers_.size())
                      << " of " << o.num_workers << " workers from this epoch on");
  }
  state_.join_held = !state_.join_acks.empty();
  return state_.join_held;
}

void Scheduler::OnJoinReady(int sender, int /*id*/) {
  if (!state_.join_held) return;
  state_.join_acks.erase(sender);
  ReleaseHeldJoin();
}

void Scheduler::ReleaseHeldJoin() {
  for (int id : state_.join_acks)
    if (!node_->members_.departed_.count(id)) return;
  Release(kEpochGroup);  // HoldForJoiners lets it go now
}

}  // namespace pskv
