// ElasticWorkers: the scheduler's elastic-worker component (PSKV_ELASTIC; docs/fault-tolerance.md,
// "Elastic workers"). A worker that dies, is silent or leaves before the end is dropped from the
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
#include "ps/elastic_workers.h"
#include "ps/node.h"
#include "ps/scheduler.h"

namespace pskv {

bool ElasticWorkers::SurviveWorker(int dead_id, std::string* reason) {
  Node& n = n_;
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
    s_.state_.removal_reason[dead_id] = *reason;
    s_.TellRemoved(dead_id);  // in case it still runs (frozen, cut off)
    n.ForgetPeer(dead_id, Node::Forgotten::kGone);
    s_.state_.barriers.Depart(dead_id);
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
    s_.ReleaseCompletedBarriers();
  }
  n.status_.Departed(NodeRefOf(dead_id));  // the launcher lets the job go on without it
  return true;
}

std::string ElasticWorkers::JoinRefusal(const NodeDesc& d, const Message& m) const {
  const Node& n = n_;
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
  if (!s_.state_.worker_layout.empty() && d.layout != s_.state_.worker_layout)
    return "the worker cuts its keys differently from the job's workers: it has " + d.layout +
           ", they " + s_.state_.worker_layout + " (set the same on every worker)";
  return {};  // a place is looked for at the epoch barrier (the death may not be known yet)
}

void ElasticWorkers::OnJoinRequest(const NodeDesc& d, const Message& m) {
  Node& n = n_;
  if (joiners_.count(d.token)) {  // its registration, repeated while it waits
    n.SendControl(s_.state_.temp_ids[d.token], Control::kHeartbeat, 1);
    return;
  }
  if (const std::string why = JoinRefusal(d, m); !why.empty()) {
    PSKV_WARN(n.Tag() << ": refused the worker at " << d.host << ":" << d.port
                      << " that asked to join the running job: " << why);
    return s_.Refuse(d, why);
  }
  s_.ReplyTo(d, s_.state_.next_temp_id++);
  joiners_[d.token] = d;
  n.SendControl(s_.state_.temp_ids[d.token], Control::kHeartbeat, 1);  // "wait for the epoch"
  PSKV_WARN(n.Tag() << ": the worker at " << d.host << ":" << d.port
                    << " asks to join the running job (PSKV_ELASTIC); it joins at the workers' "
                       "next epoch barrier");
}

bool ElasticWorkers::HoldRelease() {
  if (join_held_) {
    for (auto it = join_acks_.begin(); it != join_acks_.end();)
      it = n_.members_.departed_.count(*it) ? join_acks_.erase(it) : std::next(it);
    if (!join_acks_.empty()) return true;
    join_held_ = false;
    return false;
  }
  return !joiners_.empty() && AdmitJoiners();
}

int ElasticWorkers::PlaceFor(const NodeDesc& asked) const {
  const Membership& m = n_.members_;
  // Its launcher's rank (DMLC_TASK_ID) if that worker left, else the lowest that left.
  if (asked.rank_hint >= 0 && asked.rank_hint < n_.options_.num_workers &&
      m.departed_workers_.count(WorkerId(static_cast<int>(asked.rank_hint))))
    return WorkerId(static_cast<int>(asked.rank_hint));
  return m.departed_workers_.empty() ? 0 : *m.departed_workers_.begin();
}

void ElasticWorkers::Seat(int id, uint64_t token, NodeDesc d) {
  Node& n = n_;
  d.id = id;
  d.rank = RankOfId(id);
  if (auto old = n.members_.nodes_.find(id); old != n.members_.nodes_.end())
    n.members_.id_of_token_.erase(old->second.token);
  n.members_.nodes_[id] = d;
  n.members_.id_of_token_[d.token] = id;
  n.members_.departed_workers_.erase(id);
  s_.state_.removal_reason.erase(id);
  s_.state_.removed_told.erase(id);
  // The process that left; the newcomer numbers its messages afresh (PS_RESEND) and is
  // watched below.
  n.ForgetPeer(id, Node::Forgotten::kReplaced);
  if (auto t = s_.state_.temp_ids.find(token); t != s_.state_.temp_ids.end()) {
    n.transport_->Disconnect(t->second);
    s_.state_.temp_ids.erase(t);
  }
  n.transport_->Disconnect(id);
  n.transport_->Connect(id, d.host + ":" + std::to_string(d.port), d.token);
  n.liveness_.Watch(id);
  n.status_.Returned(NodeRefOf(id));  // the launcher counts that rank in again
}

void ElasticWorkers::Announce(const std::vector<int>& admitted) {
  Node& n = n_;
  std::vector<NodeDesc> all;
  for (auto& [i, x] : n.members_.nodes_) all.push_back(x);
  const std::string table = EncodeNodes(all);
  for (int id : admitted) {
    try {  // a newcomer that died meanwhile is dropped again (liveness)
      n.SendControl(id, Control::kNodeTable, kNodeTableJoined, table);
      if (n.members_.replicated_)
        n.SendControl(id, Control::kRangeTable, 0,
                      payload::EncodeRangeTable(n.members_.ranges_.ToData()));
      for (int gone : n.members_.departed_workers_)
        n.SendControl(id, Control::kWorkerLeft, gone, s_.state_.removal_reason[gone]);
    } catch (const std::exception& e) {
      PSKV_WARN(n.Tag() << ": could not send " << n.NameLocked(id) << " the job: " << e.what());
    }
  }
  join_acks_.clear();
  for (int id : admitted) {
    const std::string body = EncodeNodes({n.members_.nodes_[id]});
    for (auto& [peer, x] : n.members_.nodes_) {
      if (peer == kSchedulerId || n.members_.departed_.count(peer) ||
          n.members_.departed_workers_.count(peer) ||
          std::find(admitted.begin(), admitted.end(), peer) != admitted.end())
        continue;
      try {
        n.SendControl(peer, Control::kWorkerJoined, id, body);
        if (IsServerId(peer)) join_acks_.insert(peer);
      } catch (...) {
      }
    }
    const int workers = n.options_.num_workers;
    PSKV_WARN(n.Tag() << ": " << n.NameLocked(id) << " joined the running job (PSKV_ELASTIC): "
                      << workers - static_cast<int>(n.members_.departed_workers_.size()) << " of "
                      << workers << " workers from this epoch on");
  }
}

bool ElasticWorkers::AdmitJoiners() {
  std::vector<int> admitted;
  for (auto& [token, asked] : joiners_) {
    if (const int id = PlaceFor(asked)) {
      Seat(id, token, asked);
      admitted.push_back(id);
      continue;
    }
    const std::string why = "the job has all its " + std::to_string(n_.options_.num_workers) +
                            " workers (DMLC_NUM_WORKER); with PSKV_ELASTIC a worker joins in "
                            "place of one that left";
    PSKV_WARN(n_.Tag() << ": refused the worker at " << asked.host << ":" << asked.port
                       << " that asked to join the running job: " << why);
    try {
      s_.Refuse(asked, why);
    } catch (const std::exception& e) {  // it left meanwhile: nothing to tell
      PSKV_WARN(n_.Tag() << ": could not tell it: " << e.what());
    }
  }
  joiners_.clear();
  if (admitted.empty()) return false;
  Announce(admitted);
  join_held_ = !join_acks_.empty();
  return join_held_;
}

void ElasticWorkers::RefuseWaiting(const std::string& why) {
  for (auto& [token, d] : joiners_) s_.Refuse(d, why);
  joiners_.clear();
}

void ElasticWorkers::OnJoinReady(int sender) {
  if (!join_held_) return;
  join_acks_.erase(sender);
  ReleaseHeld();
}

void ElasticWorkers::ReleaseHeld() {
  for (int id : join_acks_)
    if (!n_.members_.departed_.count(id)) return;
  s_.Release(kEpochGroup);  // HoldRelease lets it go now
}

}  // namespace pskv
