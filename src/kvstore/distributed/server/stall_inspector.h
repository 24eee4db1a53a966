// StallInspector: stalled sync rounds of a key range (docs/design.md, "Stalls").
//
// A timer thread (started when PSKV_STALL_WARNING > 0) logs every sync round open
// longer than PSKV_STALL_WARNING with the workers it waits for, again at 2x, 4x, ...,
// and keeps the node's status record saying so. Workers announce Barrier() entry and
// exit (kBarrierState, kept on the BarrierBoard); a worker stalled in a wait asks for
// the round status (RoundStatus, kRoundStatus) and learns when a round it waits for
// needs a worker that is in Barrier() — a deadlock, which it reports.
//
// Threads: its own timer thread, which reads the rounds in an exclusive section of
// the pool; RoundStatus runs in one too (a command). Stop() before the pool stops.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "kvstore/distributed/server/range_store.h"
#include "kvstore/distributed/server/shard_pool.h"

namespace pskv {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;
  /// `replicated`: a range of a replicated server (the status lines name the range).
  StallInspector(Node* node, RangeStore* store, ShardPool<KVRequest>* pool,
                 const BarrierBoard* barriers, bool replicated)
      : node_(node), store_(store), pool_(pool), barriers_(barriers), replicated_(replicated) {}
  ~StallInspector() { Stop(); }

  /// Starts the timer thread (if PSKV_STALL_WARNING > 0).
  void Start();
  /// Stops and joins the timer thread.
  void Stop();
  /// kRoundStatus (exclusive section): lines describing open rounds; for a round
  /// `sender` has pushed (it waits for it) and that waits for a worker in Barrier(), a
  /// deadlock entry. payload::RoundStatus, encoded.
  std::string RoundStatus(int sender);
  /// One pass of the timer thread (exclusive section): logs stalled rounds.
  void Inspect(Clock::time_point now);

 private:
  void Loop();
  /// Workers the open round of `st` waits for, by name.
  std::string MissingWorkers(const KeyState& st) const;

  Node* node_;
  RangeStore* store_;
  ShardPool<KVRequest>* pool_;
  const BarrierBoard* barriers_;
  const bool replicated_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // under mu_
  std::thread thread_;
};

}  // namespace pskv
