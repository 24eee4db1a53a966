// The Python side's store: a KVStore plus the Python objects of its calls in flight
// (numpy arrays, pskv.DeviceArray), the bytes batch calls claim (later calls on
// overlapping bytes wait for them) and the numpy arrays they made read-only. Thread
// model: touched with the GIL held only, except `calls` (binding.h has the memory
// rules).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "arrays.h"
#include "keys.h"
#include "pskv/kvstore.h"
#include "pskv/row_sparse.h"

namespace pskv::binding {

namespace py = pybind11;

// The bytes [start, end) of an array that a call in flight reads (or writes).
struct Span {
  uintptr_t start, end;
  bool writes;
};

// The spans claimed by batch calls in flight, by start address; `seq` names the call
// (InFlight::seq).
struct Claimed {
  uintptr_t end;
  bool writes;
  uint64_t seq;
};
using ClaimIndex = std::multimap<uintptr_t, Claimed>;

// The Python objects whose memory an asynchronous call's NDArrays use. `done`
// becomes true when the last NDArray of the call is gone (pskv no longer touches
// the memory), from whatever thread; the objects are released on a Python thread.
// A call of a batch also records the bytes it uses (`spans`: later calls on
// overlapping bytes wait for it) and the arrays it made read-only (`locked`), until
// it is released: when a wait covering its keys returned, or when it is done.
struct InFlight {
  std::shared_ptr<std::atomic<bool>> done;
  std::vector<py::object> refs;
  uint64_t seq = 0;    // issue order (Handle::next_seq)
  uint64_t sched = 0;  // scheduling order, once the store accepted it (Handle::scheduled)
  Keys keys;
  std::vector<ClaimIndex::iterator> spans;  // its entries of Handle::claims
  std::vector<py::array> locked;
  bool released = false;
};

// Completion of one asynchronous call, as Python sees it (`done`).
struct Completion {
  std::shared_ptr<std::atomic<bool>> done;
};

// The outputs of a scheduled row_sparse pull (owned by pskv: the arrays share
// their memory with the operation in flight).
struct RowSparsePending {
  std::vector<RowSparseNDArray> outs;
};

struct Handle;
// The store whose Python updater this thread runs (null elsewhere): the updater runs
// on the store's engine thread, where closing the store would join that thread.
extern thread_local const Handle* tls_updater_of;

// The store, closable from Python before the interpreter finalises. `inflight`,
// `closing` and `p` are touched with the GIL held only; `calls` counts the binding
// calls using *p (entered with the GIL held, left from any state): close() frees
// the store only when none is in progress, so a thread blocked in barrier() or
// wait() never finds it freed under it.
struct Handle {
  std::unique_ptr<KVStore> p;
  std::vector<InFlight> inflight;
  size_t sweep_at = 64;    // amortised: a call sweeps when this many entries are held
  uint64_t next_seq = 0;   // the last call's InFlight::seq
  uint64_t scheduled = 0;  // the last scheduled call's InFlight::sched
  ClaimIndex claims;       // bytes of batch calls in flight, not released
  uintptr_t longest = 0;   // the longest span in `claims` (how far back an overlap may start)
  std::unordered_map<PyObject*, int> locks;  // arrays made read-only -> calls holding them
  std::vector<py::array> unlocked;           // to make writable again (RestoreFlags)
  std::atomic<int> calls{0};
  bool closing = false;

  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  // Collected without close() (no call can be in progress: each holds a reference):
  // the store's threads may still need the GIL (an updater) while it shuts down, so
  // it is released; `inflight` goes after. Collected inside the store's own updater
  // (its engine thread), the store is closed by another thread once the updater
  // returned, and the arrays of calls in flight are released after it.
  ~Handle();
  KVStore& kv();
  // UsageError when closing is not possible on this thread.
  void CheckClose() const;
  // Drops the references of finished calls (GIL held).
  void Sweep();
  // Ends a call's claims on its arrays: spans forgotten, its read-only arrays queued
  // for RestoreFlags. Runs no Python code (callers iterate `inflight`).
  void Release(InFlight& f);
  // Makes the arrays Release queued writable again (numpy checks that they may be: a
  // base made read-only meanwhile keeps them read-only). Python code may run here
  // (an ndarray subclass's setflags), which may call the store: nothing is iterated.
  void RestoreFlags();
  // After a wait for `waited` (all keys if null) returned, or failed other than by
  // timeout: the calls on those keys scheduled before the wait began (sched <= `upto`,
  // a snapshot of `scheduled`) are over. Others (other threads schedule while a wait
  // runs, without the GIL) may not be.
  void ReleaseKeys(const Keys* waited, uint64_t upto);
  // The bytes of a call's values (numpy arrays and device arrays: ValueBytes).
  static std::vector<Span> Spans(const std::vector<py::object>& ins,
                                 const std::vector<py::object>& outs);
  // Before a call: the keys of the batch calls in flight whose bytes overlap this
  // call's where either writes them (MXNet's engine ordered NDArrays so). Looks only
  // at the claims that can reach `mine` (indexed by start, bounded by `longest`).
  Keys Conflicts(const std::vector<Span>& mine) const;
  // Records a batch's call: its spans, and its writable numpy arrays made read-only
  // (device arrays have no such flag: their spans alone order later calls).
  void Claim(InFlight& f, const std::vector<Span>& spans, const std::vector<py::object>& ins,
             const std::vector<py::object>& outs);
  // A new in-flight entry and the token its NDArrays share. The entry is made
  // before anything is scheduled, so a call that fails half-way keeps what it
  // scheduled alive too.
  std::pair<InFlight*, std::shared_ptr<void>> Track();
};

// One binding call's use of the store (made with the GIL held): counted in
// Handle::calls until it returns, so close() waits for it instead of freeing the
// store under it.
class Use {
 public:
  explicit Use(Handle& h) : h_(h), kv_(h.kv()) { h_.calls.fetch_add(1, std::memory_order_acq_rel); }
  ~Use() { h_.calls.fetch_sub(1, std::memory_order_acq_rel); }
  Use(const Use&) = delete;
  Use& operator=(const Use&) = delete;
  KVStore& kv() { return kv_; }

 private:
  Handle& h_;
  KVStore& kv_;
};

// Before a call whose bytes are `spans`: waits for the calls of batches in flight
// that they would race with (Handle::Conflicts), in the order issued.
void Order(Handle& h, KVStore& kv, const std::vector<Span>& spans);

// Schedules one push, pull or pushpull (`schedule(inputs, outputs)`, run without the
// GIL): first ordered after the batch calls in flight its bytes would race with, its
// arrays then held by a new in-flight entry, which a batch's call (`batch`) claims
// under `keys` (Handle::Claim).
template <typename F>
Completion Issue(Handle& h, KVStore& kv, const Keys& keys, const std::vector<py::object>& ins,
                 const std::vector<py::object>& outs, bool check_writable, bool batch,
                 F&& schedule) {
  std::vector<Span> spans;
  if (batch || !h.claims.empty()) spans = Handle::Spans(ins, outs);
  Order(h, kv, spans);
  auto [flight, token] = h.Track();
  Completion c{flight->done};
  auto v = WrapValues(ins, false, &flight->refs, token);
  auto o = WrapValues(outs, check_writable, &flight->refs, token);
  if (batch) {
    flight->keys = keys;
    h.Claim(*flight, spans, ins, outs);
  }
  token.reset();
  const uint64_t seq = flight->seq;  // `flight` may move while the GIL is released
  try {
    py::gil_scoped_release nogil;
    schedule(v, o);
  } catch (...) {
    // Refused when scheduled: the arrays are free again at once (read-only flags
    // restored), not at some later sweep.
    v.clear();
    o.clear();
    h.Sweep();
    throw;
  }
  // Scheduled: a wait that begins from now on covers it (Handle::ReleaseKeys).
  for (auto it = h.inflight.rbegin(); it != h.inflight.rend(); ++it)
    if (it->seq == seq) {
      it->sched = ++h.scheduled;
      break;
    }
  return c;
}

}  // namespace pskv::binding
