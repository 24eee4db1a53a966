// RangeStore: the state of one key range on a server and its rounds — the core of
// the server (docs/design.md, "The server as components").
//
// Per dense key (its slice on this server): the value, an optional merge buffer, the
// open sync round (rounds.h) and, replicated, the push count of each worker's last
// applied push. row_sparse keys live in sparse() (sparse_server.h), never among the
// dense keys. The configuration that commands set (mode, optimizers, compression,
// workers done) is config().
//
// A data request is validated whole (every key: ownership, existence, dtype, size,
// sync rules; validate.cc) before any key of it is applied, so a bad multi-key
// request changes nothing. Then:
//  * an init adds its keys (ApplyInit);
//  * a pull, or an async push (applied at once; an optimizer is required), is
//    answered with the values (ApplyAsync);
//  * a sync push joins each key's round (JoinRounds, dense_rounds.cc). A round of key
//    K closes when every worker pushed K exactly once; the optimizer runs on the sum
//    (or, without an optimizer, the sum becomes the value) and every push of the
//    round is answered. A sync push of several keys (a fused message of small keys)
//    joins each key's round and is answered once, when the last of them completed
//    (or with the first failure). A second push by the same worker in one round is an
//    error; so is a round that can no longer complete because a worker already
//    declared itself done (WorkerDone): its waiting pushes fail with a message naming
//    that worker, instead of hanging.
// Every answer leaves through answers() (answers.h), most of them through Finish.
//
// Summation order (PSKV_SUM_ORDER): by default a sync round's pushes are summed in
// worker-rank order (bit-identical weights from run to run for any number of
// workers); "arrival" adds each push on arrival. Pushes waiting for their turn keep
// their receive buffers, which the round holds until it is answered anyway.
//
// Events (RangeEvents, below): a round closed, async pushes applied, an init (or a
// states load) applied. The one listener (Listen) may take over answering what the
// event names — the primary of a replicated range answers once its replicas have the
// change (primary_replication.h). Without a listener everything is answered here.
//
// Threads: the keys are sharded by a hash of the wire key (ShardOf; the owner runs
// one ShardPool over them, dist_server.h). A key's state is touched only by its
// shard's thread or in an exclusive section of the pool; so are the methods taking a
// key. config() is written only in exclusive sections and read freely by the shards.
// Optimizer::Update is safe for different keys at once. Not copyable.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kvstore/compression.h"
#include "kvstore/distributed/server/answers.h"
#include "kvstore/distributed/server/rounds.h"
#include "kvstore/distributed/server/sparse_server.h"
#include "kvstore/distributed/server/validate.h"
#include "kvstore/reduce.h"
#include "ps/kv_app.h"
#include "pskv/optimizer.h"

namespace pskv {

/// Received value bytes as an NDArray of `t`: a view, or a copy if `data` is not
/// aligned for `t`.
NDArray ValueView(const char* data, uint64_t bytes, DType t);

/// True if `id` is a worker of a job of `num_workers` workers (push counts name only those).
bool IsJobWorker(int id, int num_workers);
/// The push counts a replicated job's worker sent with `req` (one per key), or empty.
std::vector<uint64_t> PushCounts(const KVRequest& req, size_t num_keys);
/// True if `applied` (worker id -> last applied push count) holds key `index` of a
/// push of `sender` with `counts` (a retry).
bool AlreadyApplied(const std::map<int, uint64_t>& applied, int sender,
                    const std::vector<uint64_t>& counts, size_t index);
/// The worker an init (dense or row_sparse) came from and its push counts (one per
/// key; empty without replication): the sender of a worker's request, or the worker
/// a primary forwarded it for (PrimaryReplication::Forward puts its range-table
/// version and the worker's id before the counts).
struct InitOrigin {
  int worker = -1;
  std::vector<uint64_t> counts;
};
InitOrigin InitOriginOf(const KVRequest& req, size_t num_keys, int num_workers);

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
  KeyValues done;
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

/// What commands configure on a range (written in exclusive sections only).
struct RangeConfig {
  bool sync = false;
  // Keys are wire keys: (store id << 32) | key (dist_protocol.h); one optimizer per
  // store of the worker processes (store 0 for single-store jobs).
  std::map<int, std::unique_ptr<Optimizer>> optimizers;
  std::unique_ptr<GradientCompressor> compressor;
  std::set<int> done_workers;
  /// The optimizer of the store that `wire_key` belongs to, or null.
  Optimizer* OptimizerOf(int64_t wire_key) const;
};

/// Event: a dense sync round closed and its sum updated the value. `pushes` are the
/// round's pushes, still to be answered.
struct RoundClosed {
  int64_t key;
  KeyState& st;
  ReplyOwner sum;  // the round's sum; its token holds the buffer while a message needs it
  int64_t round;   // the round's number
  std::vector<Round::Entry>& pushes;
};
/// One key of an async push, as it was applied.
struct AppliedPush {
  int64_t key;
  int64_t seq;          // the key's apply sequence (its round number before the apply)
  int64_t schedule_at;  // the optimizer-wide update count its learning rate came from
  uint64_t count;       // the worker's push count (0: none)
  NDArray grad;         // the gradient applied
  uint64_t off, len;    // its bytes in the request
  bool dequantized;     // `grad` was made here (compressed push): not the request's bytes
};
/// Event: the async pushes of one request were applied (`failure`: the first key that
/// failed, after which none was applied); `answer` is the request's answer.
struct AsyncApplied {
  const KVRequest& req;
  DType dtype;  // of the gradients
  std::vector<AppliedPush> pushes;
  KeyValues answer;
  std::optional<Failure> failure;
};

/// What a RangeStore tells its listener. Each returns true when the listener takes
/// over answering what the event names (it then answers through RangeStore::Finish or
/// answers()); false leaves the answer to the store. Called on the key's shard (or in
/// an exclusive section), in the order the changes were applied.
class RangeEvents {
 public:
  virtual ~RangeEvents() = default;
  virtual bool OnRoundClosed(RoundClosed& ev) = 0;
  virtual bool OnAsyncApplied(AsyncApplied& ev) = 0;
  /// An init (dense) or an optimizer-states load (`req`) was applied.
  virtual bool OnInitApplied(const KVRequest& req) = 0;
};

/// Worker ids in Barrier() (kBarrierState), and since when. Thread-safe.
class BarrierBoard {
 public:
  using Clock = std::chrono::steady_clock;
  void Entered(int id, Clock::time_point now) {
    std::lock_guard<std::mutex> lk(mu_);
    in_[id] = now;
  }
  void Left(int id) {
    std::lock_guard<std::mutex> lk(mu_);
    in_.erase(id);
  }
  std::map<int, Clock::time_point> Snapshot() const {
    std::lock_guard<std::mutex> lk(mu_);
    return in_;
  }

 private:
  mutable std::mutex mu_;
  std::map<int, Clock::time_point> in_;
};

class RangeStore {
 public:
  using Clock = std::chrono::steady_clock;
  /// The keys of `range` on `node` (its options: shards, reduction, sum order),
  /// answered through `answers`; a push leaves any barrier on `barriers` (may be null).
  /// `replicated` (PSKV_REPLICAS >= 1): pushes and inits carry the workers' push counts.
  RangeStore(const Node* node, RangeOf range, Answers* answers, BarrierBoard* barriers,
             bool replicated);
  ~RangeStore();
  RangeStore(const RangeStore&) = delete;
  RangeStore& operator=(const RangeStore&) = delete;

  /// Sets the listener (before any request; null: none).
  void Listen(RangeEvents* events) { events_ = events; }
  RangeConfig& config() { return config_; }
  const RangeConfig& config() const { return config_; }
  SparseServer& sparse() { return sparse_; }
  Answers& answers() { return *answers_; }
  const RangeOf& range() const { return range_; }
  size_t num_shards() const { return keys_.size(); }
  /// True while no dense key is held (exclusive sections only).
  bool empty() const;

  // ---- keys (range_store.cc)
  size_t ShardOf(int64_t wire_key) const;
  /// The key's state, or null. Only from the key's shard or an exclusive section.
  KeyState* FindKey(int64_t wire_key);
  /// Adds key `wire_key` with `value` (a new key; exclusive, or on its shard).
  KeyState& AddKey(int64_t wire_key, NDArray value);
  /// Every key's state, in key order (exclusive sections only).
  void ForEachKey(const std::function<void(int64_t, KeyState&)>& fn);
  /// Before modifying a value: if a reply still references its memory, move to a copy.
  void Detach(KeyState& st);
  /// For Optimizer::LoadStates of store `store`: the element count and low precision
  /// of the weight that a states file's `key` (key, or (chunk << 32) | key for a wire
  /// chunk: dist::OptimizerKey) names in this range; {-1, false} when none.
  std::pair<int64_t, bool> StatesKeyWeight(int store, int64_t key);

  // ---- data requests (validate.cc; range_store.cc; dense_rounds.cc)
  /// Checks every key of `req`; fills `items` or says what is wrong.
  std::optional<Failure> Validate(const KVRequest& req, std::vector<Item>* items);
  void ApplyInit(const KVRequest& req, const std::vector<Item>& items);
  /// A pull, or an async push (applied at once).
  void ApplyAsync(const KVRequest& req, const std::vector<Item>& items);
  /// Each key of a validated sync push joins its round.
  void JoinRounds(KVRequest&& req, const std::vector<Item>& items);
  /// The sum in st.merge updates the value (a closing round, or a replica's copy of one).
  void ApplyRound(int64_t key, KeyState& st);
  /// Worker `id` finished (kWorkerDone): open rounds that need its push fail.
  void WorkerDone(int id);
  /// Elastic workers (PSKV_ELASTIC): worker `id` left the job (exclusive section).
  /// Rounds no longer need its push: those every remaining worker pushed close now,
  /// with the pushes that arrived; a round that summed k < num_workers pushes scales
  /// its sum by num_workers / k (ScaleSum; docs/fault-tolerance.md, "Elastic workers").
  void WorkerLeft(int id);
  /// Elastic workers: worker `id` joined the running job in place of one that left
  /// (exclusive section, at an epoch barrier): rounds from now on expect its pushes;
  /// the push counts of the process that left are forgotten (the newcomer counts anew).
  void WorkerJoined(int id);

  // ---- answers of sync pushes (range_store.cc)
  /// Key `w.index` of a round request is done: with `value` (moved from), or null with
  /// `failure`. The request's last key answers it (one reply for all its keys).
  void Finish(const Waiter& w, ReplyOwner* value, const Failure* failure);
  /// Fails every push of `pushes` with `failure`.
  void FailRound(std::vector<Round::Entry> pushes, const Failure& failure);

 private:
  std::optional<Failure> CheckKey(const KVRequest& req, DType dtype, int64_t key,
                                  const KeyState* st, uint64_t len);
  std::optional<Failure> CheckPush(const KVRequest& req, int64_t key, const KeyState& st,
                                   uint64_t len);
  /// For a chunked key: the hint that every node must use one PSKV_WIRE_CHUNK_BYTES.
  std::string ChunkHint(int64_t key);
  /// `now`: when the request arrived at its handler (opens the round if it is the first).
  void JoinRound(int64_t key, KeyState& st, Waiter w, Clock::time_point now);
  /// Adds one push's value bytes for `st` into st.merge (`first`: overwrite instead).
  void Merge(KeyState& st, const Waiter& w, bool first);
  /// Adds the pushes of st's open round that can be summed now (`order`).
  void MergeReady(KeyState& st, SumOrder order);
  /// True when every worker still in the job pushed into `round`.
  bool RoundComplete(const Round& round) const;
  /// Closes st's complete round: the sum updates the value; the pushes are answered.
  void CloseRound(int64_t key, KeyState& st);
  /// Elastic: scales st.merge by num_workers / `contributors` when fewer pushed.
  void ScaleSum(KeyState& st, size_t contributors);
  /// `w`'s key closed its round: answered with st's value (a reference to it).
  void FinishWithValue(const Waiter& w, KeyState& st);

  const Node* node_;
  RangeOf range_;
  Answers* answers_;
  BarrierBoard* barriers_;
  const bool replicated_;
  RangeEvents* events_ = nullptr;
  RangeConfig config_;
  SparseServer sparse_;  // row_sparse keys (never in keys_; own locks)
  Reducer reducer_;      // its pool is shared by the shards (calls are serialised)
  Reducer serial_;       // no pool: for work already running on reducer_'s pool
  // Replicated: pushes answered from the state without applying them again (retried
  // after a failover) and keys of retried inits answered so (logged at the end).
  std::atomic<uint64_t> answered_from_state_{0};
  std::atomic<uint64_t> retried_inits_{0};
  // Elastic workers: the workers that left the job (written in exclusive sections,
  // read by the shards), and the rounds closed with fewer pushes than workers.
  std::set<int> left_workers_;
  std::atomic<uint64_t> short_rounds_{0};
  std::vector<std::map<int64_t, KeyState>> keys_;  // per shard
};

}  // namespace pskv
