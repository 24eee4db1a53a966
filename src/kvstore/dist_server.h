// DistServer: the server side of the dist KVStore (spec 4.6), and the entry point
// that runs a scheduler or server process to the end of a job.
//
// Per key (its slice on this server): the value, an optional merge buffer, and the
// open sync round (which workers pushed, and their requests). All of it is touched
// only by the node's customer thread, which handles one message at a time — so
// updates of one key never run concurrently and arrive in arrival order.
//
// Sync mode: a round of key K completes when every worker pushed K exactly once;
// then the optimizer runs on the sum (or, without an optimizer, the sum becomes
// the value) and every request of the round is answered. A second push by the same
// worker in one round is an error; so is a round that can no longer complete
// because a worker already declared itself done (kWorkerDone): its waiting pushes
// fail with a message naming that worker, instead of hanging (MXNet hung).
// Async mode: every push is applied at once (an optimizer is required).
//
// A request is validated whole (every key: ownership, existence, dtype, size, sync
// rules) before any key of it is applied, so a bad multi-key request changes nothing.
//
// Summation order (PSKV_SUM_ORDER): by default a sync round's pushes are summed in
// worker-rank order, so a job's weights are bit-identical from run to run for any
// number of workers: a push is added as soon as the pushes of all lower ranks are in,
// the others wait (their receive buffers are held until the round is answered
// anyway, so this costs no memory). "arrival" adds each push on arrival.
//
// Stall inspector: a timer thread (under mu_, like the handlers) logs every sync round
// open longer than PSKV_STALL_WARNING with the workers it waits for, again at 2x, 4x,
// .... Workers announce Barrier() entry and exit (kBarrierState); a worker stalled in
// a wait asks for the round status (kRoundStatus) and learns when a round it waits
// for needs a worker that is in Barrier() — a deadlock, which it reports.
//
// Threads: handlers run on the node's receive thread, the inspector on its own; both
// take mu_, which guards everything below (uncontended in steady state).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "kvstore/compression.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/reduce.h"
#include "kvstore/sparse_server.h"
#include "ps/kv_app.h"
#include "pskv/optimizer.h"

namespace pskv {

class DistServer {
 public:
  /// Installs itself as `node`'s request handler; call before node->Start().
  explicit DistServer(Node* node);
  ~DistServer();

 private:
  using Clock = std::chrono::steady_clock;
  struct KeyState {
    NDArray value;
    NDArray merge;  // float32 when compressed or multi-precision, else value's dtype
    std::set<int> pushed;
    std::vector<KVRequest> waiting;
    std::shared_ptr<int> token = std::make_shared<int>(0);  // held by in-flight replies
    int64_t rounds = 0;
    int merged = 0;            // rank order: pushes of ranks [0, merged) are in `merge`
    Clock::time_point opened;  // first push of the open round
    std::chrono::milliseconds next_report{0};
    int64_t wire_key = 0;  // (store id << 32) | key
  };
  struct InitRecord {
    std::string name, dtype, shape;
    int worker = 0;
  };
  void Handle(KVRequest&& req, KVServer* srv);
  void HandleStates(KVRequest&& req, KVServer* srv);
  void HandleSparse(KVRequest&& req, KVServer* srv);
  std::string Command(int sender, int head, const std::string& body);
  std::string ReportInit(int sender, const std::string& body);
  void Merge(KeyState& st, const KVRequest& req, bool first);
  void ApplyRound(int64_t key, KeyState& st);
  void Reply(KVServer* srv, const KVRequest& req,
             const std::vector<std::pair<int64_t, KeyState*>>& keys);
  /// The optimizer of the store that `wire_key` belongs to, or null.
  Optimizer* OptimizerOf(int64_t wire_key) const;
  void FailRound(KeyState& st, ErrorKind kind, const std::string& why);
  /// Workers the open round of `st` waits for, by name.
  std::string MissingWorkers(const KeyState& st) const;
  void InspectLoop();
  void Inspect(Clock::time_point now);
  /// Before modifying a value: if a reply still references its memory, move to a copy.
  void Detach(KeyState& st);
  std::string WorkerName(int id) const;

  Node* node_;
  std::mutex mu_;  // guards everything below; see the header comment
  KVServer server_;
  Reducer reducer_;
  bool sync_ = false;
  // Keys are wire keys: (store id << 32) | key (dist_protocol.h); one optimizer
  // per store of the worker processes (store 0 for single-store jobs).
  std::map<int, std::unique_ptr<Optimizer>> optimizers_;
  std::unique_ptr<GradientCompressor> compressor_;
  std::map<int64_t, KeyState> store_;
  SparseServer sparse_;  // row_sparse keys (they are never in store_)
  std::set<int> done_workers_;
  std::map<int64_t, InitRecord> init_reports_;     // wire key -> first report (bounded by #keys)
  std::map<int64_t, std::string> init_conflicts_;  // wire key -> first disagreement
  std::map<int, Clock::time_point> in_barrier_;    // worker id -> since when
  std::shared_ptr<const std::string> states_snapshot_;  // taken by kStatesSize
  int states_store_ = 0;                                // the store of states_snapshot_

  std::condition_variable inspect_cv_;
  bool stop_ = false;
  std::thread inspector_;
};

/// Runs this process's role (options.role must be server or scheduler) until the
/// job ends. Returns the process exit status: 0 on a clean end, 1 on a failure
/// (which is printed).
int RunServerOrScheduler(const Options& options);

}  // namespace pskv
