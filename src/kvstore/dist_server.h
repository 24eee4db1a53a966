// DistServer: the server side of the dist KVStore (spec 4.6), and the entry point
// that runs a scheduler or server process to the end of a job.
//
// Per key (its slice on this server): the value, an optional merge buffer, and the
// open sync round (which workers pushed, and their requests).
//
// Sync mode: a round of key K completes when every worker pushed K exactly once;
// then the optimizer runs on the sum (or, without an optimizer, the sum becomes
// the value) and every request of the round is answered. A sync push of several
// keys (a fused message of small keys, kvstore_dist.cc) joins each key's round and
// is answered once, when the last of them completed (or with the first failure). A second push by
// the same worker in one round is an error; so is a round that can no longer complete because a
// worker already declared itself done (kWorkerDone): its waiting pushes fail with a message naming
// that worker, instead of hanging (MXNet hung). Async mode: every push is applied at once (an
// optimizer is required).
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
// Stall inspector: a timer thread logs every sync round open longer than
// PSKV_STALL_WARNING with the workers it waits for, again at 2x, 4x, .... Workers
// announce Barrier() entry and exit (kBarrierState); a worker stalled in a wait asks
// for the round status (kRoundStatus) and learns when a round it waits for needs a
// worker that is in Barrier() — a deadlock, which it reports.
//
// Threads (PSKV_SERVER_THREADS, Options::server_threads): the keys are sharded over
// a pool of shard threads by a hash of the wire key; each shard owns its keys'
// states and a FIFO queue of requests. The node's receive thread only dispatches: a
// data request whose keys all belong to one shard is queued there, so requests for
// different shards are merged, updated and answered in parallel, and the requests of
// one key are handled one at a time in arrival order (same key -> same shard ->
// FIFO). Everything else runs *exclusively* on the receive thread: multi-shard data
// requests (validated whole, as before), optimizer-state requests, commands, and the
// inspector's passes. An exclusive section takes excl_mu_ and waits until every
// shard's queue is empty and idle (they hold finite work: no handler waits), so it
// sees all earlier requests applied and no shard thread runs during it; since only
// excl_mu_ holders enqueue, nothing new starts either. Shared state written only in
// exclusive sections (sync_, optimizers_, compressor_, done_workers_, init reports,
// snapshots) is read freely by the shards; in_barrier_ (erased by pushes) has its
// own lock. Optimizer::Update is safe for different keys at once. Replies are sent
// from the shard threads (Node::Send is thread-safe). A shard's queue is bounded
// (kMaxQueued requests, kMaxQueuedBytes of values): when full, the receive thread waits
// for room, so a fast sender meets back-pressure (as with a single thread) instead of
// growing the server's memory. With one thread
// (PSKV_SERVER_THREADS=1) there is no shard thread: the receive thread handles every
// request itself under excl_mu_, as the single-threaded server did.
//
// row_sparse keys (issue 15) live in sparse_ (sparse_server.h), never in the shards'
// key maps: their requests carry one key, so they run on that key's shard like any
// one-shard request; SparseServer guards each key with its own mutex as well.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "kvstore/compression.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/reduce.h"
#include "kvstore/sparse_server.h"
#include "kvstore/worker_set.h"
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
  /// Keeps a value's memory (and its key's reply token) alive while a reply is sent.
  struct ReplyOwner {
    NDArray value;
    std::shared_ptr<int> token;
  };
  /// A sync push (or push-pull) waiting for the rounds of its keys: one key, or
  /// several (a fused message of independent pushes, possibly of different shards).
  struct RoundReq {
    KVRequest req;
    std::vector<int64_t> keys;  // wire keys, in message order
    std::vector<uint64_t> offs, lens;
    std::mutex mu;  // guards the fields below (keys of several shards complete it)
    size_t left = 0;
    // Per key of a push-pull, once its round completed: the value the answer points at
    // (no copy; its token makes a later update of the key copy the value first, Detach).
    std::vector<std::pair<int64_t, ReplyOwner>> done;
    bool failed = false;
    ErrorKind kind = ErrorKind::kGeneric;
    std::string why;
  };
  /// Key `index` of a RoundReq, waiting in its key's round.
  struct Waiter {
    std::shared_ptr<RoundReq> r;
    size_t index = 0;
  };
  struct KeyState {
    NDArray value;
    NDArray merge;  // float32 when compressed or multi-precision, else value's dtype
    WorkerSet pushed;
    std::vector<Waiter> waiting;
    std::shared_ptr<int> token = std::make_shared<int>(0);  // held by in-flight replies
    int64_t rounds = 0;
    int merged = 0;            // rank order: pushes of ranks [0, merged) are in `merge`
    Clock::time_point opened;  // first push of the open round
    std::chrono::milliseconds next_report{0};
    int64_t wire_key = 0;  // (store id << 32) | key
    // The state of the next key in its shard's map (keys are never removed): the keys
    // of a request ascend, so this finds the next one without a tree search.
    KeyState* next = nullptr;
  };
  struct InitRecord {
    std::string name, dtype, shape;
    int worker = 0;
  };
  /// A FIFO of requests and the states of the keys it owns (see the header comment).
  struct Shard {
    std::mutex mu;  // guards tasks, queued_bytes, busy, stop
    std::condition_variable cv, idle_cv, space_cv;
    std::deque<KVRequest> tasks;
    uint64_t queued_bytes = 0;  // value bytes of `tasks`
    bool busy = false, stop = false;
    std::map<int64_t, KeyState> keys;  // its thread's, or an exclusive section's
    std::thread thread;
  };
  /// Receive thread: dispatches a data request to its shard, or runs it exclusively.
  void Handle(KVRequest&& req, KVServer* srv);
  /// Validates and applies one data request (on its shard's thread, or exclusively).
  void Process(KVRequest&& req, KVServer* srv);
  void HandleStates(KVRequest&& req, KVServer* srv);
  void HandleSparse(KVRequest&& req, KVServer* srv);
  void StartShards();
  void ShardLoop(Shard* sh);
  size_t ShardOf(int64_t wire_key) const;
  /// Runs fn with every shard idle and nothing else dispatched (see the header).
  template <typename F>
  auto Exclusive(F&& fn);
  /// The key's state, or null. Only from the key's shard or an exclusive section.
  KeyState* FindKey(int64_t wire_key);
  /// Every key's state, in key order (exclusive sections only).
  template <typename F>
  void ForEachKey(F&& fn);
  std::string Command(int sender, int head, const std::string& body);
  std::string CommandLocked(int sender, int head, const std::string& body);
  std::string ReportInit(int sender, const std::string& body);
  void Merge(KeyState& st, const Waiter& w, bool first);
  /// `now`: when the request arrived at its handler (opens the round if it is the first).
  void JoinRound(int64_t key, KeyState& st, Waiter w, Clock::time_point now);
  void Finish(const Waiter& w, KeyState* st, ErrorKind kind, const std::string& why);
  void ApplyRound(int64_t key, KeyState& st);
  void Reply(KVServer* srv, const KVRequest& req,
             const std::vector<std::pair<int64_t, KeyState*>>& keys);
  /// Answers `req` with the values of `keys` (for a pull), pointing at them: one key
  /// as a plain frame, several as a gathered one (transport.h): no copy either way.
  void ReplyValues(KVServer* srv, const KVRequest& req,
                   std::vector<std::pair<int64_t, ReplyOwner>> keys);
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
  KVServer server_;
  Reducer reducer_;  // its pool is shared by the shards (calls are serialised)
  Reducer serial_;   // no pool: for work already running on reducer_'s pool
  bool sync_ = false;
  // Keys are wire keys: (store id << 32) | key (dist_protocol.h); one optimizer
  // per store of the worker processes (store 0 for single-store jobs).
  std::map<int, std::unique_ptr<Optimizer>> optimizers_;
  std::unique_ptr<GradientCompressor> compressor_;
  SparseServer sparse_;  // row_sparse keys (never in the shards' keys; own locks)
  std::vector<std::unique_ptr<Shard>> shards_;
  std::set<int> done_workers_;
  std::map<int64_t, InitRecord> init_reports_;     // wire key -> first report (bounded by #keys)
  std::map<int64_t, std::string> init_conflicts_;  // wire key -> first disagreement
  std::mutex barrier_mu_;                          // guards in_barrier_
  std::map<int, Clock::time_point> in_barrier_;    // worker id -> since when
  std::shared_ptr<const std::string> states_snapshot_;  // taken by kStatesSize
  int states_store_ = 0;                                // the store of states_snapshot_

  std::mutex excl_mu_;  // held to dispatch, and by exclusive sections
  std::mutex inspect_mu_;
  std::condition_variable inspect_cv_;
  bool stop_ = false;  // under inspect_mu_
  std::thread inspector_;
};

/// Runs this process's role (options.role must be server or scheduler) until the
/// job ends. Returns the process exit status: 0 on a clean end, 1 on a failure
/// (which is printed).
int RunServerOrScheduler(const Options& options);

}  // namespace pskv
