// ReplicaHost: a server process of a job with replicated servers (PSKV_REPLICAS >= 1;
// docs/fault-tolerance.md). It runs one DistServer per key range it holds — its own
// range as primary, the ranges it replicates as their copy — over one KVServer:
//  * a data request goes to the DistServer of the range its first key belongs to
//    (a worker's request for a range this node has become primary of, after a
//    failover, included);
//  * a command runs on every range's DistServer (each keeps its own optimizer,
//    mode, ...) and is answered with its own range's reply (kStatesSize: with the
//    sizes of every range it is primary of; kRoundStatus: with every range's open
//    rounds), or with the error of any range that failed it (its own range's first);
//  * answers to this node's replication requests go to the Replicator.
// Trust between servers (docs/security.md, "Replicated servers"): another server may
// send only what its role in the range table allows — replicated changes
// (kReplicate*) and inits, embedding-table creates or optimizer-states loads
// forwarded down from the range's primary, and a copy of a range (kRangeCopy) from
// its primary to a spare joining it; a worker may send no replicated change. Every
// message of a server carries the sender's range-table version: one newer than this
// node's table is held (bounded per sender, like held requests) until the scheduler's
// table of that version arrives here, and checked then — a member's claim of a newer
// table is never taken on trust; a version no table of the job can reach is refused
// at once. Anything else (a server posing as a worker: pushes, pulls, commands; a
// replica sending a states load up to its primary; a copy to a server that does not
// join the range) is refused with an error reply, counted, and named in one warning
// at exit (PeerRefusal, FromServer).
// The DistServers are made when the first message arrives (the node's rank, hence
// its ranges, is known only once it started).
//
// Promotion (docs/fault-tolerance.md, "Promotion on the servers"): a worker sends a
// range's requests to the primary of its newest range table, which may reach the
// worker before this node. A worker's request of a range this node holds but does not
// lead (yet) is held until the table that makes it the primary arrives; then the
// range's DistServer sends the last changes it applied as a replica to the range's
// other copies (ResendLastRounds: with R >= 2 another copy may have missed them), a
// spare joining the range is sent its copy, and once the other copies acknowledged
// the changes sent again the held requests run, in arrival order (later ones are held
// meanwhile too). Range tables and requests both arrive on the node's receive thread,
// in order. Held requests are bounded per sender (HeldRequests,
// PSKV_HELD_REQUEST_BYTES: past it a request is refused with an error saying so); a
// range table that names another server the range's primary refuses the range's
// held requests (a worker whose table says so sent them there already), and so does
// the job's failure. Refusals are counted and logged at exit.
//
// Spare servers (PSKV_SPARE_SERVERS; docs/fault-tolerance.md, "Back to full
// strength"): a spare holds no range at first; its commands run on a standby
// DistServer that holds no keys (and answers them). When a range's primary sends it a
// copy of the range (Kind::kRangeCopy), a DistServer for the range is made and given
// every command that configures a range (mode, optimizers, compression, workers
// done) this node received so far, in order; then it installs the copy. On the
// primary's side, a range table that lists a spare joining a range this node is the
// primary of makes that range's DistServer send it the copy (CopyTo).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/rate_limit.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/dist_server.h"
#include "kvstore/distributed/server/held_requests.h"
#include "kvstore/distributed/server/replication.h"
#include "ps/kv_app.h"

namespace pskv {

/// Why a replicated server refuses a data request of `kind` (with its push/pull
/// flags) from `sender`; empty if it is accepted. `is_primary`: the sender is the
/// primary of the request's key range in this node's range table (at least as new as
/// the sender's: ReplicaHost holds newer claims until then).
std::string PeerRefusal(dist::Kind kind, bool push, bool pull, int sender, bool is_primary);

/// The range-table version no table of a job of `num_servers` servers and `spares`
/// spare servers can pass: each server's removal, each spare's assignment and each
/// range a spare joins counts one version.
uint64_t MaxRangeTableVersion(int num_servers, int spares);

class ReplicaHost {
 public:
  /// Installs itself as `node`'s request handler; call before node->Start().
  explicit ReplicaHost(Node* node);
  ~ReplicaHost();

 private:
  /// The DistServers of the ranges this node holds (made on first use).
  void Ensure();
  /// The DistServer of `ps_key`'s range (its number in *range), or null.
  DistServer* ForKey(uint64_t ps_key, int* range);
  /// A DistServer for `range`, given the configuring commands received so far.
  std::unique_ptr<DistServer> MakeRange(int range);
  /// A kRangeCopy: to the range's DistServer (a new one for a copy's first part).
  void HandleCopy(KVRequest&& req);
  /// A newer range table: sends a copy of each range this node is primary of to the
  /// spares joining it that have not been sent one.
  void OnRangeTable(const RangeTable& table);
  void Handle(KVRequest&& req);
  /// A request of another server, before anything else: true if it was answered
  /// (refused) or held, its sender's range-table version being newer than this node's
  /// (RunAhead runs it once the table arrived). Receive thread.
  bool FromServer(KVRequest& req, int range);
  /// Runs again the server requests held for a newer range table, in arrival order
  /// (those still ahead are held again). Receive thread.
  void RunAhead();
  std::string Command(int sender, int head, const std::string& body);
  /// kStatesSize: every range snapshots its states; the reply is the sizes of the
  /// ranges this node is primary of (payload::RangeStatesSizes).
  std::string StatesSizes(int sender, int head, const std::string& body);
  /// kRoundStatus: the open rounds of every range this node holds, joined.
  std::string RoundStatus(int sender, int head, const std::string& body);
  /// Counts and logs (rate-limited) a refused request of another server.
  void Refused(int sender, const std::string& why);
  /// Holds a worker's request of `range` (or refuses it: HeldRequests).
  void Hold(int range, KVRequest&& req);
  /// Answers `reqs` (held) with an error: `why`.
  void RefuseHeld(std::vector<KVRequest> reqs, const std::string& why);
  /// The re-sent changes of promoted `range` were acknowledged: its held requests run
  /// (receive thread), or are refused if the job failed.
  void ResendDone(int range);
  /// Runs (or, once the job failed, refuses) the requests held for `range`. Receive thread.
  void RunHeld(int range);
  void OnFailure(std::exception_ptr e);

  Node* node_;
  KVServer server_;
  Replicator replicator_;
  std::once_flag made_;
  // By range. Receive thread only after Ensure (requests, commands and range tables
  // all arrive there): a spare adds ranges when it is sent their copies.
  std::map<int, std::unique_ptr<DistServer>> ranges_;
  std::unique_ptr<DistServer> standby_;  // a spare's: commands while it holds no range
  struct ConfigCommand {
    int sender, head;
    std::string body;
  };
  std::vector<ConfigCommand> config_;     // commands that configure a range, in order
  std::set<std::pair<int, int>> copied_;  // (range, spare) sent a copy by this node
  std::set<int> leads_;                   // ranges this node is the primary of
  std::map<int, int> primary_of_;         // range -> its primary in the last table here
  std::atomic<uint64_t> refused_{0};      // requests refused (PeerRefusal)
  // Workers' requests held until this node leads their range (and its re-sent changes
  // were acknowledged). ResendDone may run on another thread (the job's failure).
  std::mutex held_mu_;
  HeldRequests held_;                      // under held_mu_
  std::set<int> resending_;                // under held_mu_: promoted ranges re-sending changes
  bool in_table_ = false;                  // under held_mu_: OnRangeTable is running
  std::vector<int> resent_;                // under held_mu_: ranges done re-sending during it
  HeldRequests ahead_;                     // under held_mu_: servers' requests ahead of the table
  std::atomic<uint64_t> held_refused_{0};  // held requests refused (bound, table, failure)
  RateLimiter limiter_;                    // refusal warnings per sender
};

}  // namespace pskv
