// ReplicaHost (distributed/server/replicated_server.h).
#include "kvstore/distributed/server/replicated_server.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/kv_payload.h"

namespace pskv {

using dist::Kind;

std::string PeerRefusal(Kind kind, bool push, bool pull, int sender, bool is_primary) {
  const bool change = kind == Kind::kReplicate || kind == Kind::kReplicateAsync ||
                      kind == Kind::kReplicateSparse || kind == Kind::kReplicateEmbedding;
  if (!IsServerId(sender))
    return change ? "a replicated change from a node that is not a server" : std::string();
  // From a server: replicated changes, and inits and states loads forwarded, all
  // pushes, all down from the range's primary to its copies.
  const bool forwarded = kind == Kind::kInit || kind == Kind::kSparseInit ||
                         kind == Kind::kStates || kind == Kind::kEmbeddingCreate;
  if (!(change || forwarded) || !push || pull)
    return "a request of kind " + std::to_string(static_cast<int>(kind)) +
           (push ? (pull ? " (push-pull)" : " (push)") : " (pull)") +
           " from a server: servers send each other only replicated changes and forwarded "
           "inits (and embedding-table creates)";
  if (!is_primary)
    return std::string(change ? "a replicated change"
                              : "a forwarded init or optimizer-states load") +
           " from a server that is not the primary of its key range (only the primary sends "
           "them, down to the range's other copies)";
  return {};
}

uint64_t MaxRangeTableVersion(int num_servers, int spares) {
  const auto s = static_cast<uint64_t>(std::max(num_servers, 0));
  const auto k = static_cast<uint64_t>(std::max(spares, 0));
  return 1 + (s + k) + k + k * s;
}

ReplicaHost::ReplicaHost(Node* node)
    : node_(node),
      server_(
          node, [this](KVRequest&& r, KVServer*) { Handle(std::move(r)); },
          [this](int sender, int head, const std::string& body) {
            return Command(sender, head, body);
          }),
      replicator_(node),
      held_(node->options().held_request_bytes),
      ahead_(node->options().held_request_bytes) {
  server_.SetReplyHandler([this](Message&& m) { replicator_.OnReply(std::move(m)); });
  node_->AddRangeTableHandler([this](const RangeTable& t) { OnRangeTable(t); });
  node_->AddFailureHandler([this](std::exception_ptr e) { OnFailure(e); });
}

ReplicaHost::~ReplicaHost() {
  if (const uint64_t n = refused_.load())
    PSKV_WARN(
        node_->Tag() << ": refused " << n
                     << " request(s) of other nodes that only a worker, or only the primary "
                        "of a key range, may send (docs/security.md, \"Replicated servers\")");
  if (const uint64_t n = held_refused_.load())
    PSKV_WARN(node_->Tag() << ": refused " << n
                           << " worker request(s) for key ranges this server did not lead (held "
                              "past PSKV_HELD_REQUEST_BYTES, led by another server, or held when "
                              "the job failed; docs/fault-tolerance.md, \"Promotion on the "
                              "servers\")");
}

void ReplicaHost::Hold(int range, KVRequest&& req) {
  std::string why;
  {
    std::lock_guard<std::mutex> lk(held_mu_);
    if (!node_->failure())
      why = held_.Hold(range, std::move(req), node_->Tag());
    else
      why = "the job failed";
  }
  if (why.empty()) return;
  ++held_refused_;
  PSKV_LOG_LIMITED(limiter_, "held" + std::to_string(req.sender), "WARN",
                   node_->Tag() << ": refused a request of " << node_->NodeName(req.sender)
                                << " for key range " << range << ": " << why);
  try {
    server_.RespondError(req, ErrorKind::kUsage, why);
  } catch (const std::exception& e) {
    PSKV_WARN(node_->Tag() << ": " << e.what());
  }
}

void ReplicaHost::RefuseHeld(std::vector<KVRequest> reqs, const std::string& why) {
  for (auto& req : reqs) {
    ++held_refused_;
    try {
      server_.RespondError(req, ErrorKind::kUsage, why);
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": " << e.what());
    }
  }
}

void ReplicaHost::ResendDone(int range) {
  {
    std::lock_guard<std::mutex> lk(held_mu_);
    resending_.erase(range);
    if (in_table_) return resent_.push_back(range);  // OnRangeTable runs them at its end
  }
  RunHeld(range);
}

void ReplicaHost::RunHeld(int range) {
  std::vector<KVRequest> reqs;
  {
    std::lock_guard<std::mutex> lk(held_mu_);
    reqs = held_.Release(range);
  }
  if (reqs.empty()) return;
  if (std::exception_ptr e = node_->failure()) {  // possibly not the receive thread
    std::string why = "the job failed";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      why += std::string(": ") + ex.what();
    }
    return RefuseHeld(std::move(reqs), why);
  }
  auto it = ranges_.find(range);
  if (it == ranges_.end()) return;
  for (auto& req : reqs) it->second->HandleRequest(std::move(req));
}

void ReplicaHost::OnFailure(std::exception_ptr e) {
  std::string why = "the job failed";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    why += std::string(": ") + ex.what();
  }
  std::vector<KVRequest> reqs, ahead;
  {
    std::lock_guard<std::mutex> lk(held_mu_);
    reqs = held_.TakeAll();
    ahead = ahead_.TakeAll();
  }
  RefuseHeld(std::move(reqs), why);
  RefuseHeld(std::move(ahead), why);
}

void ReplicaHost::Refused(int sender, const std::string& why) {
  ++refused_;
  PSKV_LOG_LIMITED(limiter_, std::to_string(sender), "WARN",
                   node_->Tag() << ": refused " << why << " (" << node_->NodeName(sender) << ")");
}

void ReplicaHost::Ensure() {
  std::call_once(made_, [this] {
    const RangeTable table = node_->range_table();
    const int self = node_->id();
    for (int r : table.PrimaryOf(self)) {
      ranges_[r] = std::make_unique<DistServer>(node_, &server_, r, &replicator_);
      leads_.insert(r);
    }
    for (int r : table.ReplicaOf(self))
      ranges_[r] = std::make_unique<DistServer>(node_, &server_, r, &replicator_);
    if (node_->rank() >= node_->num_servers())  // a spare
      standby_ = std::make_unique<DistServer>(node_, &server_, node_->rank(), &replicator_);
  });
}

std::unique_ptr<DistServer> ReplicaHost::MakeRange(int range) {
  auto server = std::make_unique<DistServer>(node_, &server_, range, &replicator_);
  for (const auto& c : config_) {
    try {
      server->RunCommand(c.sender, c.head, c.body);
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": key range " << range << ": command " << (c.head & 0xff)
                             << " failed again: " << e.what());
    }
  }
  return server;
}

void ReplicaHost::HandleCopy(KVRequest&& req) {
  if (!IsServerId(req.sender)) {  // only a range's primary sends one (TakenByCopy)
    const std::string why = "a copy of a key range from a node that is not a server";
    Refused(req.sender, why);
    return server_.RespondError(req, ErrorKind::kInvalid, why);
  }
  dist::replication_wire::CopyHead head;
  try {
    head = dist::replication_wire::ParseCopyHead(req.msg.body);
  } catch (const ProtocolError&) {
    return server_.RespondError(req, ErrorKind::kInvalid, "a malformed copy of a key range");
  }
  const int32_t range = head.range;
  const dist::CopyPart part = head.part;
  if (range < 0 || range >= node_->num_servers())
    return server_.RespondError(req, ErrorKind::kInvalid, "a copy of no key range");
  {
    // Only the range's primary sends it, only to a spare the range table makes join
    // the range (this node's table is at least as new as the sender's: FromServer).
    // Checked for every part, before anything is made or reserved.
    const RangeTable t = node_->range_table();
    const auto& joining = t.Joining(range);
    std::string why;
    if (std::find(joining.begin(), joining.end(), node_->id()) == joining.end())
      why = "a copy of key range " + std::to_string(range) +
            ", which this server does not join in range table v" + std::to_string(t.version());
    else if (req.sender != t.Primary(range))
      why = "a copy of key range " + std::to_string(range) +
            " from a server that is not its primary in range table v" + std::to_string(t.version());
    if (!why.empty()) {
      Refused(req.sender, why);
      return server_.RespondError(req, ErrorKind::kInvalid, why);
    }
  }
  if (part == dist::CopyPart::kBegin) {
    // A copy starts afresh (again, if the range's primary changed during the last).
    ranges_[range] = MakeRange(range);
  }
  auto it = ranges_.find(range);
  if (it == ranges_.end())
    return server_.RespondError(req, ErrorKind::kInvalid, "a part of a copy that did not begin");
  it->second->HandleRequest(std::move(req));
}

void ReplicaHost::OnRangeTable(const RangeTable& table) {
  Ensure();
  const int self = node_->id();
  std::vector<int> promoted;
  for (int r : table.PrimaryOf(self))
    if (leads_.insert(r).second) promoted.push_back(r);
  {
    std::lock_guard<std::mutex> lk(held_mu_);
    in_table_ = true;
    for (int r : promoted)
      if (ranges_.count(r)) resending_.insert(r);
  }
  for (int r : promoted) {
    auto it = ranges_.find(r);
    if (it == ranges_.end()) continue;
    size_t held = 0;
    {
      std::lock_guard<std::mutex> lk(held_mu_);
      held = held_.Count(r);
    }
    const size_t resent = it->second->ResendLastRounds([this, r] { ResendDone(r); });
    PSKV_WARN(node_->Tag() << ": now the primary of key range " << r << " (range table v"
                           << table.version() << ")"
                           << (resent ? ": sent the last changes of " + std::to_string(resent) +
                                            " key(s) again to its other copies"
                                      : std::string())
                           << (held ? "; " + std::to_string(held) +
                                          " request(s) of workers held until this table run " +
                                          (resent ? "once they acknowledged them" : "now")
                                    : std::string()));
  }
  for (int r : table.PrimaryOf(self)) {
    for (int spare : table.Joining(r)) {
      if (!copied_.insert({r, spare}).second) continue;
      auto it = ranges_.find(r);
      if (it == ranges_.end()) continue;
      it->second->CopyTo(spare);
    }
  }
  // Requests held for a range this table moved to another server: every worker sends
  // its unanswered messages again to a range's new primary when its table says so
  // (KVWorker), so these are dropped unanswered (an error answer would fail a request
  // whose worker has not applied this table yet). A table that keeps the range's
  // previous primary (one older than the worker's that promoted this node, arriving
  // first) keeps them held.
  size_t dropped = 0;
  std::vector<int> ready;
  {
    std::lock_guard<std::mutex> lk(held_mu_);
    for (auto& [r, server] : ranges_) {
      if (r >= table.num_ranges()) continue;
      const int primary = table.Primary(r);
      auto before = primary_of_.find(r);
      const bool moved = before == primary_of_.end() || before->second != primary;
      if (primary != self && moved && held_.Count(r)) dropped += held_.Release(r).size();
    }
    in_table_ = false;
    ready.swap(resent_);
  }
  for (int r = 0; r < table.num_ranges(); ++r) primary_of_[r] = table.Primary(r);
  if (dropped)
    PSKV_WARN(node_->Tag() << ": dropped " << dropped
                           << " held request(s) of range(s) that range table v" << table.version()
                           << " gives to another server (their workers send them there)");
  for (int r : ready) RunHeld(r);
  RunAhead();
}

bool ReplicaHost::FromServer(KVRequest& req, int range) {
  auto refuse = [&](const std::string& why) {
    Refused(req.sender, why);
    server_.RespondError(req, ErrorKind::kInvalid, why);
    return true;
  };
  // Every message of a server starts with its sender's range-table version.
  uint64_t claimed = 0;
  if (req.msg.body.size() < sizeof claimed)
    return refuse("a request of a server without its range-table version");
  std::memcpy(&claimed, req.msg.body.data(), sizeof claimed);
  const auto [primary, known] = node_->RangePrimary(range);
  (void)primary;
  if (claimed <= known) return false;  // the handlers check the sender's role now
  if (claimed > MaxRangeTableVersion(node_->num_servers(), node_->options().spare_servers))
    return refuse("a request of a server claiming range table v" + std::to_string(claimed) +
                  ", which no table of this job reaches");
  // The sender says the scheduler made a newer table than this node has: it may (a
  // promotion reaches the promoted server first), but only that table says what the
  // sender may do. Held until it arrives here.
  std::string why;
  {
    std::lock_guard<std::mutex> lk(held_mu_);
    why = node_->failure() ? "the job failed" : ahead_.Hold(0, std::move(req), node_->Tag());
  }
  if (why.empty()) return true;
  ++held_refused_;
  return refuse("a request of a server claiming range table v" + std::to_string(claimed) +
                " (this server has v" + std::to_string(known) + "): " + why);
}

void ReplicaHost::RunAhead() {
  std::vector<KVRequest> reqs;
  {
    std::lock_guard<std::mutex> lk(held_mu_);
    reqs = ahead_.Release(0);
  }
  for (auto& req : reqs) Handle(std::move(req));
}

DistServer* ReplicaHost::ForKey(uint64_t ps_key, int* range) {
  const int S = node_->num_servers();
  for (auto& [r, server] : ranges_) {
    auto [begin, end] = KVWorker::ServerRange(r, S);
    if (ps_key >= begin && (ps_key < end || r + 1 == S)) {
      *range = r;
      return server.get();
    }
  }
  return nullptr;
}

void ReplicaHost::Handle(KVRequest&& req) {
  Ensure();
  const Message& m = req.msg;
  if (IsServerId(req.sender)) {
    int range = -1;
    if (m.num_keys() > 0) {
      const int S = node_->num_servers();
      for (int r = 0; r < S && range < 0; ++r) {
        auto [begin, end] = KVWorker::ServerRange(r, S);
        if (m.key_ptr()[0] >= begin && (m.key_ptr()[0] < end || r + 1 == S)) range = r;
      }
    }
    if (range < 0) {
      Refused(req.sender, "a request of a server for no key range");
      return server_.RespondError(req, ErrorKind::kInvalid, "a request for no key range");
    }
    if (FromServer(req, range)) return;
  }
  if (dist::CmdKind(req.cmd) == dist::Kind::kRangeCopy) return HandleCopy(std::move(req));
  int range = -1;
  DistServer* to = m.num_keys() > 0 ? ForKey(m.key_ptr()[0], &range) : nullptr;
  if (!to) {
    // Keys of a range this node holds no copy of (or none): the own range's server
    // refuses them with its usual message.
    range = node_->rank();
    to = ranges_.count(range) ? ranges_[range].get() : standby_.get();
    if (!to) return server_.RespondError(req, ErrorKind::kInvalid, "no key range here");
  }
  const std::string why =
      PeerRefusal(dist::CmdKind(req.cmd), req.push, req.pull, req.sender,
                  IsServerId(req.sender) && node_->RangePrimary(range).first == req.sender);
  if (!why.empty()) {
    Refused(req.sender, why);
    return server_.RespondError(req, ErrorKind::kInvalid, why);
  }
  if (IsWorkerId(req.sender) && ranges_.count(range)) {
    // Sent by a worker whose range table (newer than this node's) makes this node the
    // range's primary: runs once that table arrived here and the range's changes sent
    // again were acknowledged (OnRangeTable, ResendDone).
    bool hold = !leads_.count(range);
    if (!hold) {
      std::lock_guard<std::mutex> lk(held_mu_);
      hold = resending_.count(range) > 0;
    }
    if (hold) return Hold(range, std::move(req));
  }
  to->HandleRequest(std::move(req));
}

std::string ReplicaHost::Command(int sender, int head, const std::string& body) {
  Ensure();
  if (!IsWorkerId(sender)) {
    const std::string why =
        "a command from a node that is not a worker (commands come from workers only)";
    Refused(sender, why);
    throw InvalidArgument(why);
  }
  if ((head & 0xff) == dist::kStatesSize) return StatesSizes(sender, head, body);
  if ((head & 0xff) == dist::kRoundStatus) return RoundStatus(sender, head, body);
  switch (head & 0xff) {
    case dist::kSetMode:
    case dist::kSetOptimizer:
    case dist::kSetCompression:
    case dist::kWorkerDone:
      // A range this node is sent a copy of later gets them too (MakeRange); a few
      // per job.
      config_.push_back({sender, head, body});
      break;
    default:
      break;
  }
  // Every copy runs it; an error of any copy is the answer (its own range's first):
  // a replica that failed a command its primary ran would serve another state once
  // promoted, and after a failover this node is the primary of ranges besides its own.
  // A spare's standby (no range) answers for it.
  std::string own;
  std::exception_ptr error;
  auto run = [&](int r, DistServer& server) {
    try {
      std::string reply = server.RunCommand(sender, head, body);
      if (r == node_->rank()) own = std::move(reply);
    } catch (...) {
      if (!error || r == node_->rank()) error = std::current_exception();
    }
  };
  for (auto& [r, server] : ranges_) run(r, *server);
  if (standby_) run(node_->rank(), *standby_);
  if (error) std::rethrow_exception(error);
  return own;
}

// Every range's DistServer takes its snapshot (a replica's is pulled if it is
// promoted before the pull); the reply lists the sizes of the ranges this node is
// the primary of, so that a save after a failover reads the promoted ranges too.
std::string ReplicaHost::StatesSizes(int sender, int head, const std::string& body) {
  payload::RangeStatesSizes sizes;
  for (auto& [r, server] : ranges_) {
    const bool primary = node_->RangePrimary(r).first == node_->id();
    try {
      std::string reply = server->RunCommand(sender, head, body);
      if (primary) sizes.emplace_back(r, payload::DecodeStatesSize(reply));
    } catch (...) {
      if (primary) throw;
    }
  }
  return payload::EncodeRangeStatesSizes(sizes);
}

// The open rounds of every range this node holds, in one reply: after a failover it
// leads ranges besides its own, whose rounds a stalled worker may wait for.
std::string ReplicaHost::RoundStatus(int sender, int head, const std::string& body) {
  payload::RoundStatus all;
  for (auto& [r, server] : ranges_) {
    payload::RoundStatus s = payload::DecodeRoundStatus(server->RunCommand(sender, head, body));
    for (auto& d : s.deadlocks) all.deadlocks.push_back(std::move(d));
    for (auto& l : s.lines) all.lines.push_back(std::move(l));
  }
  return payload::EncodeRoundStatus(all);
}

}  // namespace pskv
