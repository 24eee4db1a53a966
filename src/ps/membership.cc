// Node, part 3: membership — who is in the job as this node sees it: the address it
// advertises, node names, groups, the identities of the node table (the scheduler
// collects the registrations and sends the table: ps/scheduler.h; a node adopts
// it), the wait at a barrier (the scheduler counts the arrivals and releases it),
// and, with replicated servers (docs/fault-tolerance.md), the range table: every
// node applies the scheduler's newer table, counts the dead server out of barriers
// and commands, and tells its range table handlers (the KV layer re-routes
// requests, servers take over ranges); a server this node lost that the scheduler
// keeps is a partition, which fails this node within a bound.
#include "ps/node.h"

#include <algorithm>

#include "common/logging.h"
#include "common/net.h"
#include "common/rate_limit.h"
#include "common/stall.h"
#include "ps/node_internal.h"
#include "ps/scheduler.h"
#include "pskv/error.h"
#include "transport/data_path_name.h"

namespace pskv {

using namespace std::chrono_literals;
using node_internal::SecsStr;

std::string Node::PickHost() const {
  if (!options_.node_host.empty()) return options_.node_host;
  if (!options_.interface.empty()) return InterfaceAddress(options_.interface);
  if (IsLoopback(options_.root_uri)) return "127.0.0.1";
  return DefaultAddress();
}

std::string Node::NameLocked(int id) const {
  if (id == kSchedulerId)
    return "scheduler at " + options_.root_uri + ":" + std::to_string(options_.root_port);
  auto it = nodes_.find(id);
  std::string role = IsServerId(id) ? "server" : "worker";
  if (id == kStandbyId) return "standby scheduler at " + options_.standby_scheduler;
  std::string n = role + "[" + std::to_string(RankOfId(id)) + "]";
  if (it != nodes_.end()) n += " at " + it->second.host + ":" + std::to_string(it->second.port);
  return n;
}

NodeRef NodeRefOf(int id) {
  if (id == kSchedulerId) return {"scheduler", 0};
  return {IsServerId(id) ? "server" : "worker", RankOfId(id)};
}

std::string Node::NodeName(int id) const {
  std::lock_guard<std::mutex> lk(mu_);
  return NameLocked(id);
}

std::string Node::HostOf(int id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = nodes_.find(id);
  return it == nodes_.end() ? std::string() : it->second.host;
}

void Node::SetPacingRate(int id, uint64_t bytes_per_s) {
  transport_->SetPacingRate(id, bytes_per_s);
}

bool Node::SendStats(int id, TcpSendStats* out) {
  return transport_->SendStats(id, out);
}

std::string Node::DataPathTo(int id) {
  return transport_ ? DataPath(*transport_, id) : "zmq";
}

std::vector<int> Node::ServerIds() const {
  std::vector<int> v;
  for (int r = 0; r < options_.num_servers; ++r) v.push_back(ServerId(r));
  return v;
}

std::vector<int> Node::AllServerIds() const {
  std::vector<int> v;
  for (int r = 0; r < num_server_processes(); ++r) v.push_back(ServerId(r));
  return v;
}

std::vector<int> Node::WorkerIds() const {
  std::vector<int> v;
  for (int r = 0; r < options_.num_workers; ++r) v.push_back(WorkerId(r));
  return v;
}

int Node::GroupSize(int group) const {
  const int servers = num_server_processes() - static_cast<int>(departed_.size());
  const int workers = options_.num_workers - static_cast<int>(departed_workers_.size());
  return ((group & kSchedulerGroup) ? 1 : 0) + ((group & kServerGroup) ? servers : 0) +
         ((group & kWorkerGroup) ? workers : 0);
}

std::vector<int> Node::GroupMembers(int group) const {
  std::vector<int> v;
  if (group & kSchedulerGroup) v.push_back(kSchedulerId);
  if (group & kServerGroup)
    for (int id : AllServerIds())
      if (!departed_.count(id)) v.push_back(id);
  if (group & kWorkerGroup)
    for (int id : WorkerIds())
      if (!departed_workers_.count(id)) v.push_back(id);
  return v;
}

std::vector<int> Node::LiveWorkerIds() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int> v;
  for (int id : WorkerIds())
    if (!departed_workers_.count(id)) v.push_back(id);
  return v;
}

int Node::IdOfToken(uint64_t token) const {
  auto it = id_of_token_.find(token);
  return it == id_of_token_.end() ? 0 : it->second;
}

void Node::HandleNodeTable(const Message& m) {
  if (ready_ && m.h.head == kNodeTableStandby) return AddStandby(m);  // scheduler_standby.cc
  if (ready_) return;                                                 // a resent table
  std::vector<NodeDesc> all = DecodeNodes(m.body);
  const NodeDesc* self = nullptr;
  for (auto& d : all)
    if (d.token == token_) self = &d;
  if (!self) throw ProtocolError("node table without this node");
  for (auto& d : all)
    if (d.id == kSchedulerId && d.token != scheduler_token_)
      throw ProtocolError("node table not sent by the scheduler it names");
  id_ = self->id;
  rank_ = self->rank;
  // Elastic workers: a table sent at an epoch barrier's release to a worker that joins
  // the running job (it passes no start barrier: Start awaits that release).
  joined_ = m.h.head == kNodeTableJoined && options_.elastic && role() == Role::kWorker;
  if (standby_linked_) transport_->Disconnect(kStandbyId);  // registration's link only
  for (auto& d : all) {
    // A standby that took over before the job formed sent it: "the scheduler" is there.
    const std::string at = d.host + ":" + std::to_string(d.port);
    if (d.id == kSchedulerId && !registration_moved_ &&
        at != options_.root_uri + ":" + std::to_string(options_.root_port)) {
      transport_->Disconnect(kSchedulerId);
      transport_->Connect(kSchedulerId, at, d.token);
      registration_moved_ = true;
    }
  }
  status_.SetRank(rank_);
  for (auto& d : all) {
    nodes_[d.id] = d;
    id_of_token_[d.token] = d.id;
    if (d.id == kSchedulerId || d.id == kStandbyId || d.id == id_) continue;
    if (standby_) {  // the standby's links for a takeover (scheduler_standby.cc)
      transport_->Connect(d.id, d.host + ":" + std::to_string(d.port), d.token);
      continue;
    }
    // Replicated servers also send to each other (their ranges' copies).
    const bool talks = role() == Role::kWorker
                           ? IsServerId(d.id)
                           : IsWorkerId(d.id) || (replicated_ && IsServerId(d.id));
    if (talks) transport_->Connect(d.id, d.host + ":" + std::to_string(d.port), d.token);
  }
  ready_ = true;
  cv_.notify_all();
}

// ------------------------------------------------------------------ barriers

void Node::Barrier(int group, std::chrono::milliseconds timeout) {
  BarrierImpl(group, timeout, false);
}

void Node::BarrierImpl(int group, std::chrono::milliseconds timeout, bool final) {
  std::unique_lock<std::mutex> lk(mu_);
  if (failure_) std::rethrow_exception(failure_);
  // The epoch barrier goes to the scheduler even for a worker left alone: a worker
  // joins a running elastic job at its release.
  if (GroupSize(group) <= 1 && group != kEpochGroup) return;
  const uint64_t gen = barrier_gen_[group];
  if (final) at_final_barrier_ = true;
  if (IsScheduler()) {
    scheduler_->OnBarrier(kSchedulerId, group);
  } else {
    // With the releases of this group seen so far: resent to a standby that takes
    // over (scheduler_standby.cc), it tells a missed release from a new barrier.
    SendControl(kSchedulerId, Control::kBarrier, group, {}, gen);
    waiting_group_ = group;
  }
  struct Left {  // whatever way the wait ends (lk is held then)
    int& group;
    ~Left() { group = 0; }
  } left{waiting_group_};
  auto done = [&] { return barrier_gen_[group] != gen || failure_ != nullptr; };
  // Bounded by `timeout` (0: none — then by failure detection); says what it is
  // waiting for after PSKV_STALL_WARNING, backing off (common/stall.h).
  // The scheduler and servers wait at the final barrier for the whole job: that
  // is no stall. A worker there has finished and waits for the others.
  const bool quiet = IsScheduler() || (final && role() != Role::kWorker);
  const WaitPlan plan{timeout.count() > 0 ? timeout : WaitPlan::kForever,
                      quiet ? std::chrono::milliseconds(0) : options_.stall_warning};
  // The record names no node: only the scheduler knows who is missing (its own
  // record names them).
  StatusWait stall_status(&status_);
  const bool reached = WaitReporting(
      plan, [&](Clock::time_point until) { return cv_.wait_until(lk, until, done); },
      [&](std::chrono::milliseconds waited) {
        stall_status.Report(final ? "final barrier" : "barrier", {}, 0, waited);
        if (final)
          PSKV_WARN(Tag() << ": finished; waiting for the rest of the job for " << SecsStr(waited)
                          << " (the scheduler's log names the workers still running)");
        else
          PSKV_WARN(Tag() << ": waiting at a barrier for " << SecsStr(waited)
                          << " (the scheduler's log names the nodes it waits for)");
      });
  if (!reached) {
    const std::string why = Tag() + ": barrier timed out after " + SecsStr(timeout) +
                            " (some nodes did not reach it; the scheduler's log names them; "
                            "raise PSKV_TIMEOUT if they are just slow)";
    stall_status.Fail("TimeoutError", why);
    throw TimeoutError(why);
  }
  if (barrier_gen_[group] == gen && failure_) std::rethrow_exception(failure_);
}

// ------------------------------------------------------------------ range table

void Node::AddRangeTableHandler(RangeTableHandler h) {
  std::lock_guard<std::mutex> lk(mu_);
  range_handlers_.push_back(std::move(h));
}

std::vector<int> Node::LiveWorkersAtRelease(int group) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = live_at_release_.find(group);
  return it == live_at_release_.end() ? std::vector<int>{} : it->second;
}

uint64_t Node::BarriersReleased(int group) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = barrier_gen_.find(group);
  return it == barrier_gen_.end() ? 0 : it->second;
}

void Node::AddWorkerJoinedHandler(WorkerLeftHandler h) {
  std::lock_guard<std::mutex> lk(mu_);
  worker_joined_handlers_.push_back(std::move(h));
}

void Node::AddWorkerLeftHandler(WorkerLeftHandler h) {
  std::lock_guard<std::mutex> lk(mu_);
  worker_left_handlers_.push_back(std::move(h));
}

void Node::HandleWorkerLeft(int id, std::unique_lock<std::mutex>& lk) {
  if (!options_.elastic || !IsWorkerId(id) || RankOfId(id) >= options_.num_workers) return;
  if (id == id_) return;                             // this worker: kNodeFailed naming it stops it
  if (!departed_workers_.insert(id).second) return;  // resent
  held_.erase(id);
  schedule_.Forget(id);
  auto handlers = worker_left_handlers_;
  lk.unlock();
  liveness_.Forget(id);
  resender_.Forget(id);
  if (role() == Role::kServer) transport_->Disconnect(id);  // what it still sends is dropped
  PSKV_WARN(Tag() << ": " << NodeName(id)
                  << " left the job (PSKV_ELASTIC); the job goes on without it");
  for (auto& h : handlers) h(id);
}

void Node::HandleWorkerJoined(const Message& m, std::unique_lock<std::mutex>& lk) {
  const int id = m.h.head;
  if (!options_.elastic || !IsWorkerId(id) || RankOfId(id) >= options_.num_workers || id == id_)
    return;
  std::vector<NodeDesc> ds;
  try {
    ds = DecodeNodes(m.body);
  } catch (const std::exception& e) {
    PSKV_LOG_LIMITED(limiter_, "joined", "WARN",
                     Tag() << ": dropped a worker_joined: " << e.what());
    return;
  }
  if (ds.size() != 1 || ds[0].id != id || ds[0].role != static_cast<int>(Role::kWorker)) {
    PSKV_LOG_LIMITED(limiter_, "joined", "WARN",
                     Tag() << ": dropped a worker_joined that does not describe worker " << id);
    return;
  }
  const NodeDesc d = ds[0];
  const bool server = role() == Role::kServer;
  auto it = nodes_.find(id);
  const bool fresh = it == nodes_.end() || it->second.token != d.token;  // else: resent
  std::vector<WorkerLeftHandler> handlers;
  if (fresh) {
    if (it != nodes_.end()) id_of_token_.erase(it->second.token);  // the process that left
    nodes_[id] = d;
    id_of_token_[d.token] = id;
    departed_workers_.erase(id);
    held_.erase(id);
    schedule_.Forget(id);
    handlers = worker_joined_handlers_;
    lk.unlock();
    resender_.Forget(id);      // its sequence numbers start afresh
    if (server || standby_) {  // a standby links every node, for a takeover
      transport_->Disconnect(id);
      transport_->Connect(id, d.host + ":" + std::to_string(d.port), d.token);
      if (server) liveness_.Watch(id, /*silence=*/false);  // its connection, as for every worker
    }
    PSKV_WARN(Tag() << ": " << NodeName(id)
                    << " joined the job (PSKV_ELASTIC); the rounds from now on expect it");
    for (auto& h : handlers) h(id);
  }
  if (!server) return;
  if (!lk.owns_lock()) lk.lock();
  SendControl(kSchedulerId, Control::kJoinReady, id);  // the scheduler releases the epoch
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
  copies_reported_[range] = {static_cast<uint64_t>(from), bytes};  // resent after a takeover
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

}  // namespace pskv
