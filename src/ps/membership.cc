// Node, part 2: membership — the address a node advertises, node names, groups,
// the identities of the node table, and registration (the scheduler collects one
// registration per node, assigns ranks and sends the table; a node adopts it).
#include "ps/node.h"

#include <algorithm>

#include "common/logging.h"
#include "common/net.h"
#include "common/rate_limit.h"
#include "ps/node_internal.h"
#include "pskv/error.h"

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
  return ((group & kSchedulerGroup) ? 1 : 0) + ((group & kServerGroup) ? servers : 0) +
         ((group & kWorkerGroup) ? options_.num_workers : 0);
}

std::vector<int> Node::GroupMembers(int group) const {
  std::vector<int> v;
  if (group & kSchedulerGroup) v.push_back(kSchedulerId);
  if (group & kServerGroup)
    for (int id : AllServerIds())
      if (!departed_.count(id)) v.push_back(id);
  if (group & kWorkerGroup)
    for (int id : WorkerIds()) v.push_back(id);
  return v;
}

int Node::IdOfToken(uint64_t token) const {
  auto it = id_of_token_.find(token);
  return it == id_of_token_.end() ? 0 : it->second;
}

void Node::HandleRegister(const Message& m) {
  std::vector<NodeDesc> ds = DecodeNodes(m.body);
  if (ds.size() != 1) throw ProtocolError("registration must describe exactly one node");
  NodeDesc d = ds[0];
  if (d.role == static_cast<int>(Role::kScheduler))
    throw ProtocolError("a second scheduler tried to register");
  auto reply_to = [&](int tid) {
    if (!temp_ids_.count(d.token)) {
      transport_->Connect(tid, d.host + ":" + std::to_string(d.port), d.token);
      temp_ids_[d.token] = tid;
    }
  };
  // A refusal is sent on a temporary connection that is closed right after (it
  // lingers a second for the message); at most kMaxRefusalsPerSecond of them, so
  // that registrations cannot make the scheduler hold sockets (in open mode,
  // anyone can register).
  auto refuse = [&](const std::string& why) {
    const auto now = Clock::now();
    if (now - refusal_window_ > 1s) {
      refusal_window_ = now;
      refusals_ = 0;
    }
    if (++refusals_ > kMaxRefusalsPerSecond) {
      PSKV_LOG_LIMITED(limiter_, "refusals", "WARN",
                       "scheduler: refused a registration from " << d.host << ":" << d.port
                                                                 << " without telling it: " << why);
      return;
    }
    const int tid = next_temp_id_++;
    reply_to(tid);
    SendControl(tid, Control::kRefuse, 0, why);
    transport_->Disconnect(tid);
    temp_ids_.erase(d.token);
  };
  if (ready_) {
    // Already complete: a retry of a registered node (its table was lost) gets the
    // table again; anyone else is refused.
    for (auto& [id, n] : nodes_) {
      if (n.token == d.token) {
        SendControl(id, Control::kNodeTable, 0, EncodeNodes([&] {
                      std::vector<NodeDesc> v;
                      for (auto& [i, x] : nodes_) v.push_back(x);
                      return v;
                    }()));
        return;
      }
    }
    refuse("the job already has all its " + std::to_string(options_.num_workers) + " workers and " +
           std::to_string(num_server_processes()) +
           " servers (is this node from another job? set PSKV_JOB_ID to tell jobs apart)");
    return;
  }
  if (!temp_ids_.count(d.token)) {
    int same_role = 0;
    for (auto& [t, x] : pending_) same_role += x.role == d.role;
    const int limit =
        d.role == static_cast<int>(Role::kServer) ? num_server_processes() : options_.num_workers;
    if (same_role >= limit) {
      refuse("too many " + RoleName(static_cast<Role>(d.role)) + "s: the job expects " +
             std::to_string(limit) + " (DMLC_NUM_" +
             (d.role == static_cast<int>(Role::kServer) ? "SERVER" : "WORKER") + ")");
      return;
    }
    reply_to(next_temp_id_++);
    pending_[d.token] = d;
    const RegisterHead head = RegisterHead::Decode(m.h.head);
    auto differs = [&](const char* var, int theirs, int ours) {
      if (theirs == ours || !replicas_mismatch_.empty()) return;
      replicas_mismatch_ =
          std::string(var) +
          " differs between the nodes of this job: " + RoleName(static_cast<Role>(d.role)) +
          " at " + d.host + ":" + std::to_string(d.port) + " set " + std::to_string(theirs) +
          ", the scheduler " + std::to_string(ours) + " (set the same " + var + " on every node)";
    };
    differs("PSKV_REPLICAS", head.replicas, options_.replicas);
    differs("PSKV_SPARE_SERVERS", head.spares, options_.spare_servers);
    if (head.spare) spare_tokens_.insert(d.token);
    // Workers that cut keys differently would push chunks no other worker pushes:
    // rounds that never complete. Refused with both settings named.
    if (d.role == static_cast<int>(Role::kWorker) && replicas_mismatch_.empty()) {
      if (worker_layout_.empty()) {
        worker_layout_ = d.layout;
        worker_layout_from_ = d.host + ":" + std::to_string(d.port);
      } else if (d.layout != worker_layout_) {
        replicas_mismatch_ = "the workers of this job cut their keys differently: the worker at " +
                             d.host + ":" + std::to_string(d.port) + " has " + d.layout +
                             ", the worker at " + worker_layout_from_ + " " + worker_layout_ +
                             " (set the same on every worker)";
      }
    }
    if (options_.verbose >= 1)
      PSKV_INFO("scheduler: " << RoleName(static_cast<Role>(d.role)) << " at " << d.host << ":"
                              << d.port << " registered (" << pending_.size() << " of "
                              << num_server_processes() + options_.num_workers << ")");
  }
  SendControl(temp_ids_[d.token], Control::kHeartbeat);  // "registration received"
  if (static_cast<int>(pending_.size()) < num_server_processes() + options_.num_workers) return;
  if (replicas_mismatch_.empty() &&
      static_cast<int>(spare_tokens_.size()) != options_.spare_servers)
    replicas_mismatch_ = std::to_string(spare_tokens_.size()) +
                         " server processes registered as spares (PSKV_SPARE_SERVER=1) in a "
                         "job of PSKV_SPARE_SERVERS=" +
                         std::to_string(options_.spare_servers) +
                         " (start exactly that many servers as spares, besides DMLC_NUM_SERVER)";
  if (!replicas_mismatch_.empty()) {
    // Every node has registered: all of them are told (Start refuses them with it).
    PSKV_ERROR("scheduler: " << replicas_mismatch_);
    failure_ = std::make_exception_ptr(ConfigError(replicas_mismatch_));
    cv_.notify_all();
    return;
  }
  SchedulerCompleteRegistration();
}

void Node::SchedulerCompleteRegistration() {
  std::vector<NodeDesc> servers, workers;
  for (auto& [t, d] : pending_)
    (d.role == static_cast<int>(Role::kServer) ? servers : workers).push_back(d);
  // Deterministic ranks: by the launcher's rank hint (DMLC_TASK_ID), then address;
  // spare servers after the others (ranks S .. S + spares - 1: they hold no range).
  auto order = [this](const NodeDesc& a, const NodeDesc& b) {
    auto ha = a.rank_hint < 0 ? INT64_MAX : a.rank_hint,
         hb = b.rank_hint < 0 ? INT64_MAX : b.rank_hint;
    const bool sa = spare_tokens_.count(a.token) > 0, sb = spare_tokens_.count(b.token) > 0;
    return std::tie(sa, ha, a.host, a.port, a.token) < std::tie(sb, hb, b.host, b.port, b.token);
  };
  std::sort(servers.begin(), servers.end(), order);
  std::sort(workers.begin(), workers.end(), order);
  std::vector<NodeDesc> all;
  for (size_t r = 0; r < servers.size(); ++r) {
    servers[r].rank = static_cast<int>(r);
    servers[r].id = ServerId(static_cast<int>(r));
    all.push_back(servers[r]);
  }
  for (size_t r = 0; r < workers.size(); ++r) {
    workers[r].rank = static_cast<int>(r);
    workers[r].id = WorkerId(static_cast<int>(r));
    all.push_back(workers[r]);
  }
  NodeDesc me;
  me.id = kSchedulerId;
  me.role = static_cast<int>(Role::kScheduler);
  me.host = host_;
  me.port = port_;
  me.token = token_;
  all.push_back(me);
  for (auto& d : all) {
    nodes_[d.id] = d;
    id_of_token_[d.token] = d.id;
    if (d.id == kSchedulerId) continue;
    transport_->Disconnect(temp_ids_[d.token]);
    transport_->Connect(d.id, d.host + ":" + std::to_string(d.port), d.token);
  }
  temp_ids_.clear();
  std::string table = EncodeNodes(all);
  for (auto& d : all)
    if (d.id != kSchedulerId) SendControl(d.id, Control::kNodeTable, 0, table);
  ready_ = true;
  if (options_.verbose >= 1) PSKV_INFO("scheduler: all " << all.size() - 1 << " nodes registered");
  cv_.notify_all();
}

void Node::HandleNodeTable(const Message& m) {
  if (ready_) return;  // a resent table
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
  status_.SetRank(rank_);
  for (auto& d : all) {
    nodes_[d.id] = d;
    id_of_token_[d.token] = d.id;
    if (d.id == kSchedulerId || d.id == id_) continue;
    // Replicated servers also send to each other (their ranges' copies).
    const bool talks = role() == Role::kWorker
                           ? IsServerId(d.id)
                           : IsWorkerId(d.id) || (replicated_ && IsServerId(d.id));
    if (talks) transport_->Connect(d.id, d.host + ":" + std::to_string(d.port), d.token);
  }
  ready_ = true;
  cv_.notify_all();
}

}  // namespace pskv
