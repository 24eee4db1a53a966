// RangeTransfer: a key range copied to a spare server that joins it
// (docs/fault-tolerance.md, "Back to full strength").
//
//  * Primary side (CopyTo, range_copy.cc): sends spare `to` a copy of the range's
//    state taken in an exclusive section (a round boundary of every key) and, from
//    then on, every change as to a replica (Replicator::AddCopying).
//  * Spare side (TakenByCopy, range_install.cc): installs the parts of a copy in any
//    order, holds the range's changes that follow it, and once every part arrived
//    installs it, applies the held changes (through `rehandle`, the owner's request
//    path) and reports the install to the scheduler.
//
// State: the copy being installed (copy_in_), on the node's receive thread only; the
// keys themselves are the RangeStore's, written in exclusive sections of the pool.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/range_store.h"
#include "kvstore/distributed/server/replication.h"
#include "kvstore/distributed/server/shard_pool.h"

namespace pskv {

class RangeTransfer {
 public:
  /// `rehandle`: runs a request as the owner's Handle does (the changes held while a
  /// copy was installed).
  RangeTransfer(Node* node, RangeOf range, Replicator* replicator, RangeStore* store,
                ShardPool<KVRequest>* pool, std::function<void(KVRequest&&)> rehandle)
      : node_(node),
        range_(range),
        replicator_(replicator),
        store_(store),
        pool_(pool),
        rehandle_(std::move(rehandle)) {}

  /// Primary of a replicated range: sends spare `to`, which joins the range, a copy
  /// of the range's state and from then on every change. Receive thread.
  void CopyTo(int to);
  /// True while a copy is being installed here. Receive thread.
  bool installing() const { return copy_in_ != nullptr; }
  /// Receive thread: true if `req` was taken by the copy being installed (a part of
  /// it, or a change of the range that waits for it).
  bool TakenByCopy(KVRequest& req);

 private:
  using Clock = std::chrono::steady_clock;
  /// What a spare receives of a copy until it is installed.
  struct CopyIn {
    int from = 0;  // the primary sending it
    bool sync = false;
    uint64_t keys = 0, value_bytes = 0, got_keys = 0, got_values = 0, bytes = 0;
    // Store -> its states blob, grown as its parts arrive (never reserved ahead: the
    // announced sizes are the sender's word), the size announced at kBegin, and the
    // parts that arrived ahead of the blob's end (by offset) until it reaches them.
    std::map<int, std::string> states;
    std::map<int, uint64_t> states_size;
    std::map<int, std::map<uint64_t, std::string>> states_ahead;
    std::map<int, uint64_t> states_got;
    std::vector<KVRequest> held;     // other servers' requests meanwhile, acknowledged
    std::unique_ptr<KVRequest> end;  // kEnd, answered once the copy is installed
    Clock::time_point started;
    bool failed = false;  // the copy was refused: what follows is acknowledged, dropped
  };
  /// Installs the copy if every part arrived (and the changes a test holds it back
  /// for, FailPoints::CopyHoldChanges), answers its kEnd, applies the changes that
  /// followed it and reports the install to the scheduler.
  void InstallIfComplete();
  /// Exclusive: installs one part of a copy; "" or why it is refused.
  std::string InstallPart(const KVRequest& req, dist::CopyPart part);
  std::string InstallBegin(const KVRequest& req);
  std::string InstallKeys(const KVRequest& req);
  std::string InstallStates(const KVRequest& req);
  std::string InstallEnd();

  Node* node_;
  RangeOf range_;
  Replicator* replicator_;
  RangeStore* store_;
  ShardPool<KVRequest>* pool_;
  std::function<void(KVRequest&&)> rehandle_;
  std::unique_ptr<CopyIn> copy_in_;
};

}  // namespace pskv
