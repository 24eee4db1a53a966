// ReplicaHost (dist/server/replicated_server.h).
#include "kvstore/dist/server/replicated_server.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "protocol/payload.h"

namespace pskv {

using dist::Kind;

std::string PeerRefusal(Kind kind, bool push, bool pull, int sender, bool holds_range) {
  const bool change =
      kind == Kind::kReplicate || kind == Kind::kReplicateAsync || kind == Kind::kReplicateSparse;
  if (!IsServerId(sender))
    return change ? "a replicated change from a node that is not a server" : std::string();
  // From a server: replicated changes (their handlers check that the sender is the
  // range's primary), and inits and states loads its primary forwards, all pushes.
  const bool forwarded = kind == Kind::kInit || kind == Kind::kSparseInit || kind == Kind::kStates;
  if (!(change || forwarded) || !push || pull)
    return "a request of kind " + std::to_string(static_cast<int>(kind)) +
           (push ? (pull ? " (push-pull)" : " (push)") : " (pull)") +
           " from a server: servers send each other only replicated changes and forwarded "
           "inits";
  if (forwarded && !holds_range)
    return "a forwarded init from a server that holds no copy of its key range";
  return {};
}

ReplicaHost::ReplicaHost(Node* node)
    : node_(node),
      server_(
          node, [this](KVRequest&& r, KVServer*) { Handle(std::move(r)); },
          [this](int sender, int head, const std::string& body) {
            return Command(sender, head, body);
          }),
      replicator_(node) {
  server_.SetReplyHandler([this](Message&& m) { replicator_.OnReply(std::move(m)); });
  node_->AddRangeTableHandler([this](const RangeTable& t) { OnRangeTable(t); });
}

ReplicaHost::~ReplicaHost() {
  if (const uint64_t n = refused_.load())
    PSKV_WARN(
        node_->Tag() << ": refused " << n
                     << " request(s) of other nodes that only a worker, or only the primary "
                        "of a key range, may send (docs/security.md, \"Replicated servers\")");
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
  const std::string& body = req.msg.body;
  constexpr size_t kRangeAt = sizeof(uint64_t) + sizeof(uint8_t);  // dist_protocol.h
  if (body.size() < kRangeAt + sizeof(int32_t))
    return server_.RespondError(req, ErrorKind::kInvalid, "a malformed copy of a key range");
  int32_t range = 0;
  std::memcpy(&range, body.data() + kRangeAt, sizeof range);
  const auto part = static_cast<dist::CopyPart>(static_cast<uint8_t>(body[sizeof(uint64_t)]));
  if (range < 0 || range >= node_->num_servers())
    return server_.RespondError(req, ErrorKind::kInvalid, "a copy of no key range");
  if (part == dist::CopyPart::kBegin) {
    // A copy starts afresh (again, if the range's primary changed during the last).
    const auto [primary, version] = node_->RangePrimary(range);
    (void)version;
    const bool holds = primary == node_->id() || [&] {
      const RangeTable t = node_->range_table();
      const auto& reps = t.Replicas(range);
      return std::find(reps.begin(), reps.end(), node_->id()) != reps.end();
    }();
    if (holds)
      return server_.RespondError(
          req, ErrorKind::kInvalid,
          "a copy of key range " + std::to_string(range) + ", which this server already holds");
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
  for (int r : promoted) {
    auto it = ranges_.find(r);
    if (it == ranges_.end()) continue;
    const size_t resent = it->second->ResendLastRounds();
    const size_t held = held_.count(r) ? held_[r].size() : 0;
    PSKV_WARN(node_->Tag() << ": now the primary of key range " << r << " (range table v"
                           << table.version() << ")" << (resent ? ": sent the last round of " : "")
                           << (resent ? std::to_string(resent) + " key(s) again to its other copies"
                                      : std::string())
                           << (held ? "; " + std::to_string(held) +
                                          " request(s) of workers held until this table run now"
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
  for (int r : promoted) {
    auto held = held_.extract(r);
    auto it = ranges_.find(r);
    if (held.empty() || it == ranges_.end()) continue;
    for (auto& req : held.mapped()) it->second->HandleRequest(std::move(req));
  }
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
  if (dist::CmdKind(req.cmd) == dist::Kind::kRangeCopy) return HandleCopy(std::move(req));
  const Message& m = req.msg;
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
                  IsServerId(req.sender) && replicator_.Holds(range, req.sender));
  if (!why.empty()) {
    Refused(req.sender, why);
    return server_.RespondError(req, ErrorKind::kInvalid, why);
  }
  if (IsWorkerId(req.sender) && ranges_.count(range) && !leads_.count(range)) {
    // Sent by a worker whose range table (newer than this node's) makes this node the
    // range's primary: runs once that table arrived here (OnRangeTable).
    held_[range].push_back(std::move(req));
    return;
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
