// The scheduler's part of a standby's takeover (PSKV_SCHEDULER_STANDBY;
// docs/fault-tolerance.md, "The scheduler"): the standby that took over adopts the
// releases it followed, the newest range table a rejoining node reports, and counts
// the rejoins; and admits a fresh standby after the job formed (AdmitStandby: the
// launcher starts one after a takeover). The protocol, and the standby's and the
// nodes' parts of it, are in the Node's Takeover component (ps/takeover.h,
// takeover.cc). Threads: as the Node's (node.h).
#include <algorithm>

#include "common/logging.h"
#include "ps/node.h"
#include "ps/scheduler.h"
#include "pskv/error.h"

namespace pskv {

// ------------------------------------------------------------------ the scheduler's part

void Scheduler::TakeOver(const std::map<int, uint64_t>& released, Clock::time_point at) {
  state_.took_over = true;
  state_.takeover_at = at;
  for (auto& [group, n] : released) state_.released[group] = std::max(state_.released[group], n);
}

void Scheduler::OnRejoin(const Message& m, int sender) {
  Node& n = *node_;
  if (!state_.took_over || !n.takeover_.rejoin_pending_.count(sender)) return;  // repeated
  if (n.members_.replicated_ && !m.body.empty()) {
    RangeTable next;
    try {
      next = RangeTable::FromData(payload::DecodeRangeTable(m.body), n.options_.num_servers,
                                  n.options_.spare_servers);
    } catch (const std::exception& e) {
      PSKV_LOG_LIMITED(n.limiter_, "rejoin", "WARN",
                       n.Tag() << ": dropped the range table of " << n.NameLocked(sender)
                               << "'s rejoin: " << e.what());
      next = RangeTable();
    }
    // What the dead scheduler can have published past this standby's table: the last
    // table or two, never a server back that left (a node's claim is checked, not
    // trusted: it could only be a table this job's scheduler made).
    const char* refused = nullptr;
    if (next.num_ranges() > 0 && next.version() > n.members_.ranges_.version() + 2)
      refused = "it is more than two versions ahead of the last one the scheduler sent here";
    for (int id : n.AllServerIds())
      if (!refused && next.num_ranges() > 0 && n.members_.ranges_.Gone(id) && !next.Gone(id))
        refused = "it lists a server that left the job";
    if (refused) {
      PSKV_LOG_LIMITED(n.limiter_, "rejoin", "WARN",
                       n.Tag() << ": ignored the range table of " << n.NameLocked(sender)
                               << "'s rejoin: " << refused);
      next = RangeTable();
    }
    if (next.num_ranges() > 0 && n.members_.ranges_.Apply(next)) {
      // The dead scheduler published it to some nodes only: everyone gets it now.
      for (int id : n.AllServerIds()) {
        if (!n.members_.ranges_.Gone(id) || !n.members_.departed_.insert(id).second) continue;
        n.ForgetPeer(id, Node::Forgotten::kGone);
        state_.barriers.Depart(id);
        Settled(id);
      }
      PSKV_WARN(n.Tag() << ": adopted the newer range table " << n.NameLocked(sender)
                        << " had: " << n.members_.ranges_.Describe());
      PublishRanges();
      ReleaseCompletedBarriers();
    }
  }
  Settled(sender);
}

void Scheduler::Settled(int id) {
  Node& n = *node_;
  if (!state_.took_over || !n.takeover_.rejoin_pending_.erase(id)) return;
  if (n.members_.departed_.count(id) || n.members_.departed_workers_.count(id))
    ++state_.left_since_takeover;
  if (!n.takeover_.rejoin_pending_.empty()) return;
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - state_.takeover_at);
  const int left = state_.left_since_takeover;
  // The tests measure the takeover by this line: every case must write it.
  PSKV_WARN(n.Tag() << ": every node rejoined, " << ms.count() << " ms after the takeover"
                    << (left ? " (" + std::to_string(left) + " left the job instead)" : ""));
}

void Scheduler::AdmitStandby(const NodeDesc& asked, const Message& m) {
  Node& n = *node_;
  const Options& o = n.options_;
  const RegisterHead head = RegisterHead::Decode(m.h.head);
  const std::string at = asked.host + ":" + std::to_string(asked.port);
  // Not amid a takeover: a node that has not followed it yet would drop the news (from
  // whom it still takes for the standby). The standby repeats its registration.
  if (!n.takeover_.rejoin_pending_.empty()) return;
  // Nor before the scheduler forgot a standby that died (its port closed): the fresh
  // one that replaces it repeats its registration until then.
  if (n.members_.Has(kStandbyId) &&
      n.transport_->GoneSince(kStandbyId) != Node::Clock::time_point{})
    return;
  std::string why;
  if (o.standby_scheduler.empty())
    why = "this job has no standby scheduler (its nodes set no PSKV_SCHEDULER_STANDBY)";
  else if (n.members_.Has(kStandbyId))
    why = "the job already has its standby scheduler (PSKV_SCHEDULER_STANDBY)";
  else if (n.failure_ || n.finished_ || n.takeover_.job_done_)
    why = "the job is ending";
  else if (head.replicas != o.replicas || head.spares != o.spare_servers ||
           head.elastic != o.elastic)
    why = "its PSKV_REPLICAS, PSKV_SPARE_SERVERS or PSKV_ELASTIC differ from the job's";
  if (!why.empty()) {
    PSKV_WARN(n.Tag() << ": refused the standby scheduler at " << at << ": " << why);
    return Refuse(asked, why);
  }
  NodeDesc d = asked;
  d.id = kStandbyId;
  d.rank = 0;
  n.members_.SetStandby(d);
  // A standby before it (the fresh one is watched below; its numbering starts afresh).
  n.ForgetPeer(kStandbyId, Node::Forgotten::kReplaced);
  n.transport_->Disconnect(kStandbyId);
  n.transport_->Connect(kStandbyId, at, d.token);
  // What a standby following from the start would have: the node table, the range
  // table, the workers that left and how many releases of each group there were (a
  // takeover tells a missed release from a new barrier by them). Barrier arrivals in
  // progress are not copied: after a takeover every node resends its own.
  std::vector<NodeDesc> all;
  for (auto& [i, x] : n.members_.nodes()) all.push_back(x);
  n.SendControl(kStandbyId, Control::kNodeTable, kNodeTableStart, EncodeNodes(all));
  if (n.members_.replicated())
    n.SendControl(kStandbyId, Control::kRangeTable, 0,
                  payload::EncodeRangeTable(n.members_.ranges().ToData()));
  for (int gone : n.members_.departed_workers_)
    n.SendControl(kStandbyId, Control::kWorkerLeft, gone, state_.removal_reason[gone]);
  for (auto& [group, count] : state_.released)
    if (count > 0) n.SendControl(kStandbyId, Control::kBarrierDone, group, {}, count);
  // Every node's table names it from now on: it may ask and commit a takeover.
  const std::string body = EncodeNodes({d});
  for (auto& [id, x] : n.members_.nodes()) {
    if (id == kSchedulerId || id == kStandbyId || n.members_.Departed(id)) continue;
    try {
      n.SendControl(id, Control::kNodeTable, kNodeTableStandby, body);
    } catch (const std::exception& e) {
      PSKV_WARN(n.Tag() << ": could not tell " << n.NameLocked(id)
                        << " of the new standby: " << e.what());
    }
  }
  n.liveness_.Watch(kStandbyId);
  PSKV_WARN(n.Tag() << ": the standby scheduler at " << at
                    << " registered: it follows this scheduler as its standby (every node "
                       "was told)");
}

}  // namespace pskv
