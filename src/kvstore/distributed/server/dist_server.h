// DistServer: the server side of the dist KVStore (docs/design.md: "Threads",
// "Waiting, replies and rounds").
//
// Per key (its slice on this server): the value, an optional merge buffer, and the
// open sync round (rounds.h).
//
// Sync mode: a round of key K completes when every worker pushed K exactly once;
// then the optimizer runs on the sum (or, without an optimizer, the sum becomes the
// value) and every request of the round is answered. A sync push of several keys (a
// fused message of small keys) joins each key's round and is answered once, when the
// last of them completed (or with the first failure). A second push by the same
// worker in one round is an error; so is a round that can no longer complete because
// a worker already declared itself done (kWorkerDone): its waiting pushes fail with a
// message naming that worker, instead of hanging. Async mode: every push is applied
// at once (an optimizer is required).
//
// A request is validated whole (every key: ownership, existence, dtype, size, sync
// rules; validate.cc) before any key of it is applied, so a bad multi-key request
// changes nothing.
//
// Summation order (PSKV_SUM_ORDER): by default a sync round's pushes are summed in
// worker-rank order (bit-identical weights from run to run for any number of
// workers); "arrival" adds each push on arrival. Pushes waiting for their turn keep
// their receive buffers, which the round holds until it is answered anyway.
//
// Stall inspector (inspect.cc): a timer thread logs every sync round open longer than
// PSKV_STALL_WARNING with the workers it waits for, again at 2x, 4x, .... Workers
// announce Barrier() entry and exit (kBarrierState); a worker stalled in a wait asks
// for the round status (kRoundStatus) and learns when a round it waits for needs a
// worker that is in Barrier() — a deadlock, which it reports.
//
// Threads (PSKV_SERVER_THREADS): the keys are sharded over a ShardPool
// (shard_pool.h) by a hash of the wire key; each shard owns its keys' states
// (keys_[shard]). The node's receive thread only dispatches: a data request whose keys
// all belong to one shard is submitted there, so requests for different shards are
// merged, updated and answered in parallel, and the requests of one key are handled
// one at a time in arrival order. Everything else runs in an exclusive section of the
// pool: multi-shard data requests, optimizer-state requests, commands, and the
// inspector's passes. State written only in exclusive sections (sync_, optimizers_,
// compressor_, done_workers_, init reports, the states snapshot) is read freely by
// the shards; in_barrier_ (erased by pushes) has its own lock. Optimizer::Update is
// safe for different keys at once. Replies are sent from the shard threads
// (Node::Send is thread-safe).
//
// row_sparse keys live in sparse_ (sparse_server.h), never in keys_: their requests
// carry one key, so they run on that key's shard like any one-shard request.
//
// Replicated servers (PSKV_REPLICAS >= 1, docs/fault-tolerance.md): a DistServer
// holds one key range (its `range`); a server process runs one per range it holds,
// as primary or replica (ReplicaHost, replicated_server.h), sharing its KVServer.
// As primary, a completed dense sync round is sent to the range's replicas as the
// round's sum (kReplicate, replica_rounds.cc), and the round's pushes are answered
// only when every replica acknowledged it; an init is forwarded the same way. A
// replica applies the sum with the same code (same bits). Each key remembers, per
// worker, the count of its last applied push (sent by the worker, kv_app.h), so a
// push retried after a failover that the state already holds is answered from the
// value, never applied twice. Async pushes (replica_async.cc) are applied by the
// primary and sent on as the gradients it applied, each with the key's apply
// sequence and the update count its learning rate came from, so that a replica
// repeats the same updates in the same order with the same rates (same bits); the
// push is answered when every replica acknowledged it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_io.h"
#include "kvstore/compression.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/replication.h"
#include "kvstore/distributed/server/rounds.h"
#include "kvstore/distributed/server/shard_pool.h"
#include "kvstore/distributed/server/sparse_server.h"
#include "kvstore/distributed/server/validate.h"
#include "kvstore/reduce.h"
#include "ps/kv_app.h"
#include "pskv/optimizer.h"

namespace pskv {

/// The refusal of what replicated servers (PSKV_REPLICAS > 0) do not copy to their
/// replicas yet (docs/fault-tolerance.md): `what` is not replicated.
inline std::string NotReplicated(const std::string& what) {
  return what +
         " with PSKV_REPLICAS > 0 is not supported yet (its state would not reach the "
         "replicas, and a promoted replica would serve stale values): set PSKV_REPLICAS=0 for this "
         "job (docs/fault-tolerance.md)";
}

/// Received value bytes as an NDArray of `t`: a view, or a copy if `data` is not
/// aligned for `t`.
NDArray ValueView(const char* data, uint64_t bytes, DType t);

class DistServer {
 public:
  /// Installs itself as `node`'s request handler; call before node->Start().
  explicit DistServer(Node* node);
  /// One key range (`range`) of a replicated server: requests come from `host`
  /// (HandleRequest, RunCommand), which owns `server`; `replicator` sends this
  /// range's rounds to its replicas. Call once the node has started.
  DistServer(Node* node, KVServer* server, int range, Replicator* replicator);
  ~DistServer();

  /// A hosted instance's request (the host's KVServer handler).
  void HandleRequest(KVRequest&& req) { Handle(std::move(req)); }
  /// A hosted instance's command; returns the reply body.
  std::string RunCommand(int sender, int head, const std::string& body) {
    return Command(sender, head, body);
  }
  /// Primary of a replicated range: sends spare `to`, which joins the range, a copy
  /// of the range's state taken in an exclusive section (a round boundary of every
  /// key), and from then on every change as to a replica (range_copy.cc;
  /// docs/fault-tolerance.md, "Back to full strength"). Receive thread.
  void CopyTo(int to);
  /// A replica just promoted to primary of this range (receive thread, before any
  /// request of the range runs here as its primary): sends the last changes of every
  /// key it applied as a replica (a dense or row_sparse sync round; dist_async: the
  /// last num_workers copies) to the range's other copies, which may have missed them
  /// (the dead primary sent them to this node only); a copy that holds one
  /// acknowledges it without applying it again (resend.cc). `done` runs once every
  /// copy acknowledged them (or failed), possibly before this returns; the range's
  /// own changes must wait for it, so that each copy gets a key's changes in order.
  /// Kept only with PSKV_REPLICAS >= 2. Returns the number of keys sent.
  size_t ResendLastRounds(std::function<void()> done);

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
    std::vector<uint64_t> counts;  // per key: the worker's push count (replicated; else empty)
    int answerer = -1;             // replicated: the replica the worker accepts the answer from too
    // Replicated: the worker sent this push again (its answerer left the range): it is
    // answered here, never by the answerer. On the key's shard (one-key requests only).
    bool answer_here = false;
    std::mutex mu;  // guards the fields below (keys of several shards complete it)
    size_t left = 0;
    // Per key of a push-pull, once its round completed: the value the answer points at
    // (no copy; its token makes a later update of the key copy the value first, Detach).
    std::vector<std::pair<int64_t, ReplyOwner>> done;
    std::optional<Failure> failure;
  };
  /// Key `index` of a RoundReq, waiting in its key's round.
  struct Waiter {
    std::shared_ptr<RoundReq> r;
    size_t index = 0;
  };
  using Round = SyncRound<Waiter>;
  struct KeyState {
    NDArray value;
    NDArray merge;  // float32 when compressed or multi-precision, else value's dtype
    Round round;
    std::shared_ptr<int> token = std::make_shared<int>(0);  // held by in-flight replies
    // Held by a replication message that sends `merge` (the round's sum): the next
    // round merges into a new buffer while it is held.
    std::shared_ptr<int> merge_token = std::make_shared<int>(0);
    int64_t wire_key = 0;  // (store id << 32) | key
    // Replicated: per worker id, the push count of its last push applied to this key.
    std::map<int, uint64_t> applied_push;
    // PSKV_REPLICAS >= 2, on a replica: the last round it applied (its kReplicate
    // request, holding the sum's receive buffers), sent again to the range's other
    // copies when this node is promoted (ResendLastRounds).
    std::shared_ptr<const Message> last_round;
    // PSKV_REPLICAS >= 2, on a replica of a dist_async range: the last num_workers
    // kReplicateAsync requests that changed this key (by the order they were applied
    // here, async_applied_), sent again on promotion like last_round.
    std::deque<std::pair<uint64_t, std::shared_ptr<const Message>>> async_copies;
    // The state of the next key in its shard's map (keys are never removed): the keys
    // of a request ascend, so this finds the next one without a tree search.
    KeyState* next = nullptr;
  };
  /// One key of a validated data request.
  struct Item {
    int64_t key;  // a wire key: chunk, store id and key
    uint64_t off, len;
    KeyState* st;  // null for an init (but a retried one: the key holds it already)
  };
  struct InitRecord {
    std::string name, dtype, shape;
    int worker = 0;
  };
  /// What a command handler gets: the sender, the store the command concerns
  /// (bits 8.. of the head) and the body.
  struct Call {
    int sender;
    int store;
    const std::string& body;
  };
  using CommandFn = std::string (DistServer::*)(const Call&);

  // ---- dispatch and data requests (dist_server.cc)
  /// Receive thread: submits a data request to its shard, or runs it exclusively.
  void Handle(KVRequest&& req);
  /// Validates and applies one data request (on its shard, or exclusively).
  void Process(KVRequest&& req);
  void ApplyInit(const KVRequest& req, const std::vector<Item>& items);
  void ApplyAsync(const KVRequest& req, const std::vector<Item>& items);
  void HandleSparse(KVRequest&& req);
  size_t ShardOf(int64_t wire_key) const;
  /// The key's state, or null. Only from the key's shard or an exclusive section.
  KeyState* FindKey(int64_t wire_key);
  /// Every key's state, in key order (exclusive sections only).
  void ForEachKey(const std::function<void(int64_t, KeyState&)>& fn);
  void Reply(const KVRequest& req, const std::vector<std::pair<int64_t, KeyState*>>& keys);
  /// Answers `req` with the values of `keys` (for a pull), pointing at them: one key
  /// as a plain frame, several as a gathered one (transport.h): no copy either way.
  void ReplyValues(const KVRequest& req, std::vector<std::pair<int64_t, ReplyOwner>> keys);
  /// Before modifying a value: if a reply still references its memory, move to a copy.
  void Detach(KeyState& st);
  /// The optimizer of the store that `wire_key` belongs to, or null.
  Optimizer* OptimizerOf(int64_t wire_key) const;
  /// For Optimizer::LoadStates of store `store`: the element count and low precision
  /// of the weight that a states file's `key` (key, or (chunk << 32) | key for a wire
  /// chunk: dist::OptimizerKey) names on this server; {-1, false} when none.
  std::pair<int64_t, bool> StatesKeyWeight(int store, int64_t key);
  std::string WorkerName(int id) const;
  /// This server's keys (its rank is known once the node started).
  KeyRange Range() const { return KeyRange(RangeIndex(), node_->num_servers()); }
  /// The key range this instance holds: its own for a plain server.
  int RangeIndex() const { return range_ >= 0 ? range_ : node_->rank(); }
  /// Worker `id` is not (or no longer) in Barrier().
  void LeftBarrier(int id);

  // ---- validation, pass 1 of a data request (validate.cc)
  /// Checks every key of `req`; fills `items` or says what is wrong.
  std::optional<Failure> Validate(const KVRequest& req, std::vector<Item>* items);
  std::optional<Failure> CheckKey(const KVRequest& req, DType dtype, int64_t key,
                                  const KeyState* st, uint64_t len);
  std::optional<Failure> CheckPush(const KVRequest& req, int64_t key, const KeyState& st,
                                   uint64_t len);
  /// For a chunked key: the hint that every node must use one PSKV_WIRE_CHUNK_BYTES.
  std::string ChunkHint(int64_t key);

  // ---- sync rounds of dense keys (dense_rounds.cc)
  /// Each key of a validated sync push joins its round.
  void JoinRounds(KVRequest&& req, const std::vector<Item>& items);
  /// `now`: when the request arrived at its handler (opens the round if it is the first).
  void JoinRound(int64_t key, KeyState& st, Waiter w, Clock::time_point now);
  /// Adds one push's value bytes for `st` into st.merge (`first`: overwrite instead).
  void Merge(KeyState& st, const Waiter& w, bool first);
  void ApplyRound(int64_t key, KeyState& st);
  /// One key of a round request is done: `st` holds its value, or null with `failure`.
  void Finish(const Waiter& w, KeyState* st, const Failure* failure);
  /// The same with the value to answer (null with `failure`), moved from.
  void FinishWith(const Waiter& w, ReplyOwner* value, const Failure* failure);

  // ---- replication (replica_rounds.cc)
  /// The servers to copy this range's changes to: none unless this instance is
  /// hosted and `req` came from a worker.
  std::vector<int> ReplicaTargets(const KVRequest& req) const;
  /// Primary: sends round `round` of `key` (its sum, held by `sum`'s token while the
  /// message needs it) and the pushes' counts to `to`; answers `done` once every one
  /// acknowledged.
  void Replicate(int64_t key, KeyState& st, const std::vector<int>& to, ReplyOwner sum,
                 int64_t round, std::vector<Round::Entry> done);
  /// Replica: acknowledges a kReplicate request (a round's sum) on receipt, then
  /// applies it (on the key's shard, before any later request of the key).
  void ApplyReplica(const KVRequest& req);
  /// Primary: `req` (an init, dense or row_sparse, or a states load, applied here)
  /// sent on to `to`; answered when they did. An init carries the worker it came from
  /// and its push counts (InitOriginOf), by which a copy knows a retried init.
  void ForwardInit(const KVRequest& req, const std::vector<int>& to);
  void FailRound(std::vector<Round::Entry> pushes, const Failure& failure);
  /// Primary, on the key's shard: true if `req` is a worker's one-key push-pull sent
  /// again while its first copy still waits in the key's open round (its answerer left
  /// the range): that one is then answered here, and `req` is dropped (same timestamp).
  bool RetryOfWaitingPush(const KVRequest& req);
  /// Replica: answers the workers' push-pulls of round `round` of `key` that the
  /// primary left to this copy (`answers`, from its kReplicate request), with the
  /// value, or with `failure`.
  struct Delegated {
    int worker;
    uint64_t timestamp;
    int32_t priority, cmd;
  };
  void AnswerDelegated(int64_t key, KeyState& st, const std::vector<Delegated>& answers,
                       const Failure* failure);

  // ---- replication of async pushes (replica_async.cc)
  /// The async pushes of one request that a primary applied, as its replicas apply them.
  struct AsyncCopy {
    DType dtype = DType::kFloat32;     // of the gradients
    std::vector<uint64_t> keys, lens;  // ps keys, gradient bytes
    std::vector<Frame::Piece> pieces;  // the gradients (in the request's buffers or `owned`)
    std::vector<NDArray> owned;        // gradients made here (dequantized)
    dist::replication_wire::AsyncPushes pushes;  // the sender; per key: sequence, counts
  };
  /// The push counts a replicated job's worker sent with `req` (one per key), or empty.
  static std::vector<uint64_t> PushCounts(const KVRequest& req, size_t num_keys);
  /// True if `st` already holds key `index` of a push with `counts` (a retry).
  static bool AlreadyApplied(const KeyState& st, int sender, const std::vector<uint64_t>& counts,
                             size_t index);
  /// The worker an init (dense or row_sparse) came from and its push counts (one per
  /// key; empty without replication): the sender of a worker's request, or the worker
  /// a primary forwarded it for (ForwardInit puts its range-table version and the
  /// worker's id before the counts).
  struct InitOrigin {
    int worker = -1;
    std::vector<uint64_t> counts;
  };
  InitOrigin InitOriginOf(const KVRequest& req, size_t num_keys) const;
  /// Primary: sends `copy` to `to`; answers `req` with `answer` (or `failure`) once
  /// every one acknowledged.
  void ReplicateAsync(const KVRequest& req, const std::vector<int>& to, AsyncCopy copy,
                      std::vector<std::pair<int64_t, ReplyOwner>> answer,
                      std::optional<Failure> failure);
  /// Replica: why `req`, a replicated change (its body starts with the sender's
  /// range-table version), may not be applied here, or "": only the range's primary
  /// replicates it.
  std::string NotFromPrimary(const KVRequest& req) const;
  /// True if `id` is a worker of this job (push counts name only those).
  bool IsJobWorker(int id) const;
  /// Replica: applies a kReplicateAsync request and acknowledges it.
  void ApplyAsyncReplica(const KVRequest& req);

  // ---- a copy of the range for a joining spare (range_copy.cc sends it,
  // range_install.cc installs it)
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
  /// Receive thread: true if `req` was taken by the copy being installed (a part of
  /// it, or a change of the range that waits for it).
  bool TakenByCopy(KVRequest& req);
  /// Receive thread: installs the copy if every part arrived (and the changes a test
  /// holds it back for, FailPoints::CopyHoldChanges), answers its kEnd, applies the
  /// changes that followed it and reports the install to the scheduler.
  void InstallIfComplete();
  /// Exclusive: installs one part of a copy; "" or why it is refused.
  std::string InstallPart(const KVRequest& req, dist::CopyPart part);
  std::string InstallKeys(const KVRequest& req);
  std::string InstallEnd();
  /// Adds key `wire_key` with `value` (a new key; exclusive, or on its shard).
  KeyState& AddKey(int64_t wire_key, NDArray value);

  // ---- commands (commands.cc; states.cc; inspect.cc)
  std::string Command(int sender, int head, const std::string& body);
  std::string SetMode(const Call& c);
  std::string SetOptimizer(const Call& c);
  std::string SetCompression(const Call& c);
  std::string WorkerDone(const Call& c);
  std::string HasOptimizer(const Call& c);
  std::string ReportInit(const Call& c);
  std::string CheckInit(const Call& c);
  std::string BarrierState(const Call& c);
  std::string StatesSize(const Call& c);
  std::string RoundStatus(const Call& c);
  void HandleStates(KVRequest&& req);
  /// Workers the open round of `st` waits for, by name.
  std::string MissingWorkers(const KeyState& st) const;
  void InspectLoop();
  void Inspect(Clock::time_point now);

  Node* node_;
  std::unique_ptr<KVServer> own_server_;  // a plain server's (null when hosted)
  KVServer* server_;
  int range_ = -1;                    // hosted: the range held; -1: the node's rank
  Replicator* replicator_ = nullptr;  // hosted only
  // Replicated: pushes answered from the state without applying them again (retried
  // after a failover; logged when the server ends).
  std::atomic<uint64_t> answered_from_state_{0};
  // Replicated: push-pulls of workers on this host answered here for the primary
  // (docs/fault-tolerance.md, "Answers from a copy on the worker's host").
  std::atomic<uint64_t> answered_for_primary_{0};
  std::atomic<uint64_t> async_applied_{0};  // kReplicateAsync requests applied (R >= 2)
  std::atomic<uint64_t> retried_inits_{0};  // keys of inits answered so (logged at the end)
  Reducer reducer_;  // its pool is shared by the shards (calls are serialised)
  Reducer serial_;   // no pool: for work already running on reducer_'s pool
  bool sync_ = false;
  // Keys are wire keys: (store id << 32) | key (dist_protocol.h); one optimizer
  // per store of the worker processes (store 0 for single-store jobs).
  std::map<int, std::unique_ptr<Optimizer>> optimizers_;
  std::unique_ptr<GradientCompressor> compressor_;
  SparseServer sparse_;  // row_sparse keys (never in keys_; own locks)
  std::set<int> done_workers_;
  std::map<int64_t, InitRecord> init_reports_;   // wire key -> first report (bounded by #keys)
  std::map<int64_t, Failure> init_conflicts_;    // wire key -> first disagreement
  std::mutex barrier_mu_;                        // guards in_barrier_
  std::map<int, Clock::time_point> in_barrier_;  // worker id -> since when
  std::shared_ptr<const std::string> states_snapshot_;  // taken by kStatesSize
  int states_store_ = 0;                                // the store of states_snapshot_
  std::unique_ptr<CopyIn> copy_in_;                     // a spare's copy (receive thread)

  // What runs a data request (Process; WithReplyDelay in dist_server.cc). It and
  // each shard's keys (its thread's, or an exclusive section's) are declared before
  // pool_, whose threads use them.
  std::function<void(KVRequest&&)> process_;
  std::vector<std::map<int64_t, KeyState>> keys_;
  ShardPool<KVRequest> pool_;

  std::mutex inspect_mu_;
  std::condition_variable inspect_cv_;
  bool stop_ = false;  // under inspect_mu_
  std::thread inspector_;
};

}  // namespace pskv
