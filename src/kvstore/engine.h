// Engine: runs a KVStore's operations asynchronously, in order per key, highest
// priority first among the operations that are ready.
//
// An operation names the keys it touches. It becomes ready when every earlier
// operation on any of those keys has completed. Ready operations are started by
// the engine's dispatcher thread in (priority desc, issue order asc) order (or,
// when asked and nothing else is waiting, by the thread that pushed it). An
// operation is a function that receives a `Done` callback and must call it exactly
// once — synchronously, or later from another thread (a network receive thread)
// — with nullptr on success or the failure's exception_ptr.
//
// Thread model: Push/Wait may be called from any thread. The dispatcher thread
// only starts operations; it never blocks on one. All state is under mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>
#include <vector>

namespace pskv {

class Engine {
 public:
  using Done = std::function<void(std::exception_ptr)>;
  using AsyncFn = std::function<void(Done)>;

  Engine();
  /// Waits (up to `drain_timeout` given to Shutdown, default 60 s) for the
  /// operations in flight, then stops the dispatcher.
  ~Engine();

  /// Schedules `fn` on `keys` (must not be empty). `may_start_here`: if the
  /// operation is ready at once and no other is waiting to start, it is started on
  /// the calling thread (for operations that only issue messages: no thread
  /// hand-off); priority order is kept, since nothing else is ready.
  void Push(std::vector<int> keys, int priority, AsyncFn fn, bool may_start_here = false);
  /// Schedules a synchronous function; an exception it throws is the op's failure.
  void PushSync(std::vector<int> keys, int priority, std::function<void()> fn);
  /// Blocks until no operation on `keys` (all keys if null) is pending, then
  /// rethrows (and clears) the first recorded failure of those keys.
  /// TimeoutError after `timeout`; UsageError when called from inside an operation
  /// of this engine (an updater), which would wait for itself.
  void Wait(const std::vector<int>* keys, std::chrono::milliseconds timeout);
  /// Rethrows (and clears) the first recorded failure of `keys` (all if null), without
  /// waiting: after WaitIdle, when other threads may have issued operations since.
  void TakeFailure(const std::vector<int>* keys);
  /// Wait and WaitIdle look again without sleeping for up to `spin` first
  /// (Options::spin_us: a dist store's round trips end tens of µs sooner where a
  /// sleeping thread's core halts); 0 (the default): sleep at once. Before use.
  void SetWaitSpin(std::chrono::microseconds spin) { wait_spin_ = spin; }
  /// Waits up to `timeout` until no operation on `keys` (all if null) is pending;
  /// false on timeout. Neither throws nor clears recorded failures (Wait does).
  bool WaitIdle(const std::vector<int>* keys, std::chrono::milliseconds timeout);
  /// Number of operations scheduled and not yet completed.
  size_t Pending() const;
  /// Fails every later Push with `error` (used when the store is broken beyond
  /// repair, e.g. a dead server) and records it for Wait.
  void Poison(std::exception_ptr error);
  void Shutdown(std::chrono::milliseconds drain_timeout);

 private:
  struct Op {
    uint64_t id;
    int priority;
    std::vector<int> keys;
    AsyncFn fn;
  };
  /// The operations on one key, oldest first. Kept (empty) while the key is idle, so
  /// that an operation costs its keys no allocation (a fused operation names hundreds
  /// of keys); at most one per key the store ever used.
  struct KeyQueue {
    std::vector<uint64_t> ids;
    size_t head = 0;  // ids[head, size) are queued
    bool empty() const { return head == ids.size(); }
    uint64_t front() const { return ids[head]; }
    void push_back(uint64_t id) { ids.push_back(id); }
    void pop_front() {
      if (++head == ids.size()) {
        ids.clear();
        head = 0;
        if (ids.capacity() > 64) std::vector<uint64_t>().swap(ids);  // after a long queue
      } else if (head >= 64 && 2 * head >= ids.size()) {
        ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(head));
        head = 0;
      }
    }
  };
  struct ReadyOrder {
    bool operator()(const Op* a, const Op* b) const {
      return a->priority != b->priority ? a->priority < b->priority : a->id > b->id;
    }
  };
  void DispatchLoop();
  /// Runs `fn` with its Done callback (not under mu_).
  void Start(uint64_t id, AsyncFn fn);
  void Complete(uint64_t id, std::exception_ptr err);
  bool IsReadyLocked(const Op& op) const;
  bool KeysIdleLocked(const std::vector<int>* keys) const;
  /// TakeFailure with mu_ held.
  void TakeFailureLocked(const std::vector<int>* keys);
  /// Waits on cv_idle_ until `keys` (all if null) are idle; false on timeout.
  bool IdleWait(std::unique_lock<std::mutex>& lk, const std::vector<int>* keys,
                std::chrono::milliseconds timeout);

  mutable std::mutex mu_;
  std::condition_variable cv_ready_, cv_idle_;
  int waiting_for_all_ = 0, waiting_for_keys_ = 0;  // threads in IdleWait
  std::chrono::microseconds wait_spin_{0};
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Op>> ops_;
  std::unordered_map<int, KeyQueue> key_queues_;
  std::priority_queue<Op*, std::vector<Op*>, ReadyOrder> ready_;
  std::map<int, std::exception_ptr> errors_;
  std::exception_ptr poison_;
  bool stop_ = false;
  std::thread dispatcher_;
};

}  // namespace pskv
