// Scheduler, part 1: registration — one registration per node is collected; a
// registrant the job has no room for is refused (on a temporary connection, rate
// limited); settings every node must share are compared; once everyone registered,
// ranks are assigned and the node table sent (ps/scheduler.h).
#include <algorithm>

#include "common/logging.h"
#include "common/rate_limit.h"
#include "ps/node.h"
#include "ps/node_internal.h"
#include "ps/scheduler.h"
#include "pskv/error.h"

namespace pskv {

using namespace std::chrono_literals;
using node_internal::SecsStr;

void Scheduler::ReplyTo(const NodeDesc& d, int tid) {
  if (!state_.temp_ids.count(d.token)) {
    node_->transport_->Connect(tid, d.host + ":" + std::to_string(d.port), d.token);
    state_.temp_ids[d.token] = tid;
  }
}

// A refusal is sent on a temporary connection that is closed right after (it lingers
// a second for the message); at most kMaxRefusalsPerSecond of them, so that
// registrations cannot make the scheduler hold sockets (in open mode, anyone can
// register).
void Scheduler::Refuse(const NodeDesc& d, const std::string& why) {
  const auto now = Clock::now();
  if (now - refusal_window_ > 1s) {
    refusal_window_ = now;
    refusals_ = 0;
  }
  if (++refusals_ > kMaxRefusalsPerSecond) {
    PSKV_LOG_LIMITED(node_->limiter_, "refusals", "WARN",
                     "scheduler: refused a registration from " << d.host << ":" << d.port
                                                               << " without telling it: " << why);
    return;
  }
  // A registrant already answered (an elastic worker waiting to join) has its channel.
  auto known = state_.temp_ids.find(d.token);
  const int tid = known != state_.temp_ids.end() ? known->second : state_.next_temp_id++;
  ReplyTo(d, tid);
  node_->SendControl(tid, Control::kRefuse, 0, why);
  node_->transport_->Disconnect(tid);
  state_.temp_ids.erase(d.token);
}

void Scheduler::OnRegister(const Message& m) {
  std::vector<NodeDesc> ds = DecodeNodes(m.body);
  if (ds.size() != 1) throw ProtocolError("registration must describe exactly one node");
  const NodeDesc d = ds[0];
  const Options& o = node_->options_;
  // A second scheduler registers only as the standby the job was told of.
  // (A standby that took over before the job formed expects none; after the job
  // formed, a fresh standby may register: AdmitStandby.)
  if (d.role == static_cast<int>(Role::kScheduler) && !node_->ready_ &&
      (o.standby_scheduler.empty() || o.standby))
    throw ProtocolError("a second scheduler tried to register (no PSKV_SCHEDULER_STANDBY)");
  if (node_->ready_) {
    // Already complete: a retry of a registered node (its table was lost) gets the
    // table again; anyone else is refused.
    for (auto& [id, n] : node_->members_.nodes_) {
      if (n.token == d.token) {
        std::vector<NodeDesc> all;
        for (auto& [i, x] : node_->members_.nodes_) all.push_back(x);
        node_->SendControl(id, Control::kNodeTable, 0, EncodeNodes(all));
        Settled(id);  // after a takeover: it has this table now
        return;
      }
    }
    if (o.elastic && d.role == static_cast<int>(Role::kWorker))
      return elastic_.OnJoinRequest(d, m);  // in place of a worker that left (elastic_workers.h)
    if (d.role == static_cast<int>(Role::kScheduler))
      return AdmitStandby(d, m);  // a fresh standby (scheduler_standby.cc)
    Refuse(d, "the job already has all its " + std::to_string(o.num_workers) + " workers and " +
                  std::to_string(node_->num_server_processes()) +
                  " servers (is this node from another job? set PSKV_JOB_ID to tell jobs apart)");
    return;
  }
  if (!state_.temp_ids.count(d.token) && !Admit(d, m)) return;
  node_->SendControl(state_.temp_ids[d.token], Control::kHeartbeat);  // "registration received"
  const int standbys = o.standby_scheduler.empty() || o.standby ? 0 : 1;
  if (static_cast<int>(state_.pending.size()) <
      node_->num_server_processes() + o.num_workers + standbys)
    return;
  if (state_.mismatch.empty() && static_cast<int>(state_.spare_tokens.size()) != o.spare_servers)
    state_.mismatch = std::to_string(state_.spare_tokens.size()) +
                      " server processes registered as spares (PSKV_SPARE_SERVER=1) in a "
                      "job of PSKV_SPARE_SERVERS=" +
                      std::to_string(o.spare_servers) +
                      " (start exactly that many servers as spares, besides DMLC_NUM_SERVER)";
  if (!state_.mismatch.empty()) {
    // Every node has registered: all of them are told (Start refuses them with it).
    PSKV_ERROR("scheduler: " << state_.mismatch);
    node_->failure_ = std::make_exception_ptr(ConfigError(state_.mismatch));
    node_->cv_.notify_all();
    return;
  }
  CompleteRegistration();
}

bool Scheduler::Admit(const NodeDesc& d, const Message& m) {
  const Options& o = node_->options_;
  int same_role = 0;
  for (auto& [t, x] : state_.pending) same_role += x.role == d.role;
  const bool server = d.role == static_cast<int>(Role::kServer);
  const bool standby = d.role == static_cast<int>(Role::kScheduler);
  const int limit = standby ? 1 : server ? node_->num_server_processes() : o.num_workers;
  if (standby && same_role >= limit) {
    Refuse(d, "the job already has its standby scheduler (PSKV_SCHEDULER_STANDBY)");
    return false;
  }
  if (same_role >= limit) {
    Refuse(d, "too many " + RoleName(static_cast<Role>(d.role)) + "s: the job expects " +
                  std::to_string(limit) + " (DMLC_NUM_" + (server ? "SERVER" : "WORKER") + ")");
    return false;
  }
  ReplyTo(d, state_.next_temp_id++);
  state_.pending[d.token] = d;
  CheckSettings(d, m);
  if (o.verbose >= 1)
    PSKV_INFO("scheduler: " << RoleName(static_cast<Role>(d.role)) << " at " << d.host << ":"
                            << d.port << " registered (" << state_.pending.size() << " of "
                            << node_->num_server_processes() + o.num_workers << ")");
  return true;
}

void Scheduler::CheckSettings(const NodeDesc& d, const Message& m) {
  const Options& o = node_->options_;
  const RegisterHead head = RegisterHead::Decode(m.h.head);
  auto differs = [&](const char* var, int theirs, int ours) {
    if (theirs == ours || !state_.mismatch.empty()) return;
    state_.mismatch =
        std::string(var) +
        " differs between the nodes of this job: " + RoleName(static_cast<Role>(d.role)) + " at " +
        d.host + ":" + std::to_string(d.port) + " set " + std::to_string(theirs) +
        ", the scheduler " + std::to_string(ours) + " (set the same " + var + " on every node)";
  };
  differs("PSKV_REPLICAS", head.replicas, o.replicas);
  differs("PSKV_SPARE_SERVERS", head.spares, o.spare_servers);
  differs("PSKV_ELASTIC", head.elastic ? 1 : 0, o.elastic ? 1 : 0);
  if (head.spare) state_.spare_tokens.insert(d.token);
  // Workers that cut keys differently would push chunks no other worker pushes:
  // rounds that never complete. Refused with both settings named.
  if (d.role != static_cast<int>(Role::kWorker) || !state_.mismatch.empty()) return;
  if (state_.worker_layout.empty()) {
    state_.worker_layout = d.layout;
    state_.worker_layout_from = d.host + ":" + std::to_string(d.port);
  } else if (d.layout != state_.worker_layout) {
    state_.mismatch = "the workers of this job cut their keys differently: the worker at " +
                      d.host + ":" + std::to_string(d.port) + " has " + d.layout +
                      ", the worker at " + state_.worker_layout_from + " " + state_.worker_layout +
                      " (set the same on every worker)";
  }
}

void Scheduler::CompleteRegistration() {
  std::vector<NodeDesc> servers, workers, standby;
  for (auto& [t, d] : state_.pending)
    (d.role == static_cast<int>(Role::kServer)      ? servers
     : d.role == static_cast<int>(Role::kScheduler) ? standby
                                                    : workers)
        .push_back(d);
  // Deterministic ranks: by the launcher's rank hint (DMLC_TASK_ID), then address;
  // spare servers after the others (ranks S .. S + spares - 1: they hold no range).
  auto order = [this](const NodeDesc& a, const NodeDesc& b) {
    auto ha = a.rank_hint < 0 ? INT64_MAX : a.rank_hint,
         hb = b.rank_hint < 0 ? INT64_MAX : b.rank_hint;
    const bool sa = state_.spare_tokens.count(a.token) > 0,
               sb = state_.spare_tokens.count(b.token) > 0;
    return std::tie(sa, ha, a.host, a.port, a.token) < std::tie(sb, hb, b.host, b.port, b.token);
  };
  std::sort(servers.begin(), servers.end(), order);
  std::sort(workers.begin(), workers.end(), order);
  std::vector<NodeDesc> all;
  for (auto& d : standby) {  // first: it has the table before any node (scheduler_standby.cc)
    d.rank = 0;
    d.id = kStandbyId;
    all.push_back(d);
  }
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
  me.host = node_->host_;
  me.port = node_->port_;
  me.token = node_->token_;
  all.push_back(me);
  for (auto& d : all) {
    node_->members_.nodes_[d.id] = d;
    node_->members_.id_of_token_[d.token] = d.id;
    if (d.id == kSchedulerId) continue;
    node_->transport_->Disconnect(state_.temp_ids[d.token]);
    node_->transport_->Connect(d.id, d.host + ":" + std::to_string(d.port), d.token);
  }
  state_.temp_ids.clear();
  std::string table = EncodeNodes(all);
  for (auto& d : all)
    if (d.id != kSchedulerId) node_->SendControl(d.id, Control::kNodeTable, 0, table);
  node_->ready_ = true;
  if (node_->options_.verbose >= 1)
    PSKV_INFO("scheduler: all " << all.size() - 1 << " nodes registered");
  node_->cv_.notify_all();
}

void Scheduler::RefuseRegistered(const std::string& why) {
  for (auto& [tok, tid] : state_.temp_ids) {
    try {
      node_->SendControl(tid, Control::kRefuse, 0, why);
    } catch (...) {
    }
  }
}

std::string Scheduler::RegistrationTimeout() const {
  const Options& o = node_->options_;
  int s = 0, w = 0, standby = 0;
  for (auto& [t, d] : state_.pending)
    (d.role == static_cast<int>(Role::kServer)      ? s
     : d.role == static_cast<int>(Role::kScheduler) ? standby
                                                    : w)++;
  return "registration timed out: " + std::to_string(w) + " of " + std::to_string(o.num_workers) +
         " workers and " + std::to_string(s) + " of " + std::to_string(o.num_servers) +
         " servers registered after " + SecsStr(o.register_timeout) + " (PSKV_REGISTER_TIMEOUT)" +
         (o.standby_scheduler.empty() || o.standby || standby
              ? std::string()
              : "; the standby scheduler at " + o.standby_scheduler +
                    " (PSKV_SCHEDULER_STANDBY) did not register: is it started?");
}

}  // namespace pskv
