#include "kvstore/engine.h"

#include <sched.h>

#include <algorithm>

#include "pskv/error.h"

namespace pskv {

namespace {
// The engine whose operation this thread runs (null outside operations). An
// operation (an updater) that waits for its own engine would wait for itself.
thread_local const Engine* tls_running = nullptr;

void CheckNotInsideOperation(const Engine* e) {
  if (tls_running == e)
    throw UsageError(
        "a wait for the store's operations from inside one of them (an updater runs on "
        "the store's engine thread and would wait for itself): wait, wait_all and close "
        "belong after the push that runs the updater, on the caller's thread");
}
}  // namespace

Engine::Engine() {
  dispatcher_ = std::thread([this] { DispatchLoop(); });
}

Engine::~Engine() {
  Shutdown(std::chrono::seconds(60));
}

void Engine::Shutdown(std::chrono::milliseconds drain_timeout) {
  // From inside an operation the dispatcher would join itself (std::terminate). The
  // bindings refuse a close there; in C++ it is a bug in the caller.
  if (tls_running == this ||
      (dispatcher_.joinable() && std::this_thread::get_id() == dispatcher_.get_id()))
    throw InternalError("a KVStore destroyed inside its own updater (on its engine thread)");
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!dispatcher_.joinable()) return;
    IdleWait(lk, nullptr, drain_timeout);
    stop_ = true;
  }
  cv_ready_.notify_all();
  dispatcher_.join();
  // Operations still pending after the drain timeout are abandoned: their
  // completion callbacks find no entry and do nothing.
  std::lock_guard<std::mutex> lk(mu_);
  ops_.clear();
  key_queues_.clear();
}

void Engine::Push(std::vector<int> keys, int priority, AsyncFn fn, bool may_start_here) {
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  if (keys.empty()) throw InternalError("Engine::Push without keys");
  uint64_t here = 0;
  AsyncFn here_fn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (poison_) std::rethrow_exception(poison_);
    if (stop_) throw UsageError("the KVStore is shutting down; no new operations are accepted");
    auto op = std::make_unique<Op>(Op{next_id_++, priority, std::move(keys), std::move(fn)});
    for (int k : op->keys) key_queues_[k].push_back(op->id);
    Op* raw = op.get();
    ops_.emplace(raw->id, std::move(op));
    if (IsReadyLocked(*raw)) {
      if (may_start_here && ready_.empty()) {
        here = raw->id;
        here_fn = std::move(raw->fn);
      } else {
        ready_.push(raw);
        cv_ready_.notify_one();
      }
    }
  }
  if (here) Start(here, std::move(here_fn));
}

void Engine::Start(uint64_t id, AsyncFn fn) {
  bool called = false;
  auto done = [this, id, called](std::exception_ptr err) mutable {
    if (called) return;  // exactly once, even if an op misbehaves
    called = true;
    Complete(id, err);
  };
  const Engine* outer = tls_running;
  tls_running = this;
  try {
    fn(done);
  } catch (...) {
    Complete(id, std::current_exception());
  }
  tls_running = outer;
}

void Engine::PushSync(std::vector<int> keys, int priority, std::function<void()> fn) {
  Push(std::move(keys), priority, [fn = std::move(fn)](Done done) {
    std::exception_ptr err;
    try {
      fn();
    } catch (...) {
      err = std::current_exception();
    }
    done(err);
  });
}

bool Engine::IsReadyLocked(const Op& op) const {
  for (int k : op.keys) {
    auto it = key_queues_.find(k);
    if (it == key_queues_.end() || it->second.empty() || it->second.front() != op.id) return false;
  }
  return true;
}

void Engine::DispatchLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_ready_.wait(lk, [&] { return stop_ || !ready_.empty(); });
    if (stop_) return;
    Op* op = ready_.top();
    ready_.pop();
    const uint64_t id = op->id;
    AsyncFn fn = std::move(op->fn);
    lk.unlock();
    Start(id, std::move(fn));
    lk.lock();
  }
}

void Engine::Complete(uint64_t id, std::exception_ptr err) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  std::unique_ptr<Op> op = std::move(it->second);
  ops_.erase(it);
  for (int k : op->keys) {
    auto& q = key_queues_.find(k)->second;
    q.pop_front();
    if (err && !errors_.count(k)) errors_[k] = err;
    if (!q.empty()) {
      Op* next = ops_.at(q.front()).get();
      if (IsReadyLocked(*next)) {
        ready_.push(next);
        cv_ready_.notify_one();
      }
    }
  }
  // Waiters for some keys check after every completion; waiters for all of them only
  // when nothing is left (a fused call's operations would wake them once each).
  if (waiting_for_keys_ > 0 || (waiting_for_all_ > 0 && ops_.empty())) cv_idle_.notify_all();
}

bool Engine::IdleWait(std::unique_lock<std::mutex>& lk, const std::vector<int>* keys,
                      std::chrono::milliseconds timeout) {
  // Briefly without sleeping first (SetWaitSpin), yielding the core between looks.
  if (wait_spin_.count() > 0 && !KeysIdleLocked(keys)) {
    const auto until =
        std::chrono::steady_clock::now() + std::min<std::chrono::microseconds>(wait_spin_, timeout);
    for (int i = 0; i < 100000 && std::chrono::steady_clock::now() < until; ++i) {
      lk.unlock();
      ::sched_yield();
      lk.lock();
      if (KeysIdleLocked(keys)) return true;
    }
  }
  int& waiting = keys ? waiting_for_keys_ : waiting_for_all_;
  ++waiting;
  const bool idle = cv_idle_.wait_for(lk, timeout, [&] { return KeysIdleLocked(keys); });
  --waiting;
  return idle;
}

bool Engine::KeysIdleLocked(const std::vector<int>* keys) const {
  if (!keys) return ops_.empty();
  for (int k : *keys) {
    auto it = key_queues_.find(k);
    if (it != key_queues_.end() && !it->second.empty()) return false;
  }
  return true;
}

void Engine::Wait(const std::vector<int>* keys, std::chrono::milliseconds timeout) {
  CheckNotInsideOperation(this);
  std::unique_lock<std::mutex> lk(mu_);
  if (!IdleWait(lk, keys, timeout)) {
    throw TimeoutError("KVStore wait timed out after " + std::to_string(timeout.count() / 1000.0) +
                       " s with " + std::to_string(ops_.size()) +
                       " operation(s) still pending (raise PSKV_TIMEOUT if this is expected, "
                       "or check that every worker issues the same pushes)");
  }
  TakeFailureLocked(keys);
}

void Engine::TakeFailure(const std::vector<int>* keys) {
  std::unique_lock<std::mutex> lk(mu_);
  TakeFailureLocked(keys);
}

void Engine::TakeFailureLocked(const std::vector<int>* keys) {
  std::exception_ptr first;
  if (keys) {
    for (int k : *keys) {
      auto it = errors_.find(k);
      if (it != errors_.end()) {
        if (!first) first = it->second;
        errors_.erase(it);
      }
    }
  } else if (!errors_.empty()) {
    first = errors_.begin()->second;
    errors_.clear();
  }
  if (!first && poison_) first = poison_;
  if (first) std::rethrow_exception(first);
}

bool Engine::WaitIdle(const std::vector<int>* keys, std::chrono::milliseconds timeout) {
  CheckNotInsideOperation(this);
  std::unique_lock<std::mutex> lk(mu_);
  return IdleWait(lk, keys, timeout);
}

size_t Engine::Pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return ops_.size();
}

void Engine::Poison(std::exception_ptr error) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!poison_) poison_ = error;
  cv_idle_.notify_all();
}

}  // namespace pskv
