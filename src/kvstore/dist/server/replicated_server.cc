// ReplicaHost (dist/server/replicated_server.h).
#include "kvstore/dist/server/replicated_server.h"

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "protocol/payload.h"

namespace pskv {

ReplicaHost::ReplicaHost(Node* node)
    : node_(node),
      server_(
          node, [this](KVRequest&& r, KVServer*) { Handle(std::move(r)); },
          [this](int sender, int head, const std::string& body) {
            return Command(sender, head, body);
          }),
      replicator_(node) {
  server_.SetReplyHandler([this](Message&& m) { replicator_.OnReply(std::move(m)); });
}

ReplicaHost::~ReplicaHost() = default;

void ReplicaHost::Ensure() {
  std::call_once(made_, [this] {
    const RangeTable table = node_->range_table();
    const int self = node_->id();
    for (int r : table.PrimaryOf(self))
      ranges_[r] = std::make_unique<DistServer>(node_, &server_, r, &replicator_);
    for (int r : table.ReplicaOf(self))
      ranges_[r] = std::make_unique<DistServer>(node_, &server_, r, &replicator_);
  });
}

DistServer* ReplicaHost::ForKey(uint64_t ps_key) {
  const int S = node_->num_servers();
  for (auto& [r, server] : ranges_) {
    auto [begin, end] = KVWorker::ServerRange(r, S);
    if (ps_key >= begin && (ps_key < end || r + 1 == S)) return server.get();
  }
  return nullptr;
}

void ReplicaHost::Handle(KVRequest&& req) {
  Ensure();
  const Message& m = req.msg;
  DistServer* to = m.num_keys() > 0 ? ForKey(m.key_ptr()[0]) : nullptr;
  if (!to) {
    // Keys of a range this node holds no copy of (or none): the own range's server
    // refuses them with its usual message.
    to = ranges_.count(node_->rank()) ? ranges_[node_->rank()].get() : nullptr;
    if (!to) return server_.RespondError(req, ErrorKind::kInvalid, "no key range here");
  }
  to->HandleRequest(std::move(req));
}

std::string ReplicaHost::Command(int sender, int head, const std::string& body) {
  Ensure();
  if ((head & 0xff) == dist::kStatesSize) return StatesSizes(sender, head, body);
  std::string own;
  std::exception_ptr own_error;
  for (auto& [r, server] : ranges_) {
    try {
      std::string reply = server->RunCommand(sender, head, body);
      if (r == node_->rank()) own = std::move(reply);
    } catch (...) {
      if (r == node_->rank()) own_error = std::current_exception();
    }
  }
  if (own_error) std::rethrow_exception(own_error);
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

}  // namespace pskv
