// ReplicaHost: a server process of a job with replicated servers (PSKV_REPLICAS >= 1;
// docs/fault-tolerance.md). It runs one DistServer per key range it holds — its own
// range as primary, the ranges it replicates as their copy — over one KVServer:
//  * a data request goes to the DistServer of the range its first key belongs to
//    (a worker's request for a range this node has become primary of, after a
//    failover, included);
//  * a command runs on every range's DistServer (each keeps its own optimizer,
//    mode, ...) and is answered with its own range's reply (kStatesSize: with the
//    sizes of every range it is primary of);
//  * answers to this node's replication requests go to the Replicator.
// The DistServers are made when the first message arrives (the node's rank, hence
// its ranges, is known only once it started).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kvstore/dist/server/dist_server.h"
#include "kvstore/dist/server/replication.h"
#include "ps/kv_app.h"

namespace pskv {

class ReplicaHost {
 public:
  /// Installs itself as `node`'s request handler; call before node->Start().
  explicit ReplicaHost(Node* node);
  ~ReplicaHost();

 private:
  /// The DistServers of the ranges this node holds (made on first use).
  void Ensure();
  DistServer* ForKey(uint64_t ps_key);
  void Handle(KVRequest&& req);
  std::string Command(int sender, int head, const std::string& body);
  /// kStatesSize: every range snapshots its states; the reply is the sizes of the
  /// ranges this node is primary of (payload::RangeStatesSizes).
  std::string StatesSizes(int sender, int head, const std::string& body);

  Node* node_;
  KVServer server_;
  Replicator replicator_;
  std::once_flag made_;
  std::map<int, std::unique_ptr<DistServer>> ranges_;  // by range; fixed once made
};

}  // namespace pskv
