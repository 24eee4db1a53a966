// _pskv: the Python binding of the C++ core. The Python package (python/pskv)
// gives it MXNet's `mx.kv` shape; this module stays thin: flat lists of keys and
// numpy arrays in, C++ calls out.
//
// Memory: numpy arrays are wrapped without copying. Synchronous calls (init, the
// optimizer) let the NDArray hold a reference to the numpy object, released under
// the GIL. Asynchronous calls (push, pull, pushpull) never need the GIL on pskv's
// threads: the store's Handle keeps the numpy objects in an InFlight entry, the
// NDArrays share a token whose last copy marks the entry done (an atomic store),
// and the references are dropped by the next binding call on a Python thread
// (Handle::Sweep), or by close. Blocking calls release the GIL.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/env_table.h"
#include "pskv/data.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/optimizer.h"
#include "pskv/row_sparse.h"
#include "pskv/tuning.h"

namespace py = pybind11;
using namespace pskv;

namespace pskv {
void BindTrainerPolicy(py::module_& parent);  // trainer_policy.cc
}  // namespace pskv

namespace {

DType FromNumpy(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  // Bytes are read in this machine's order: a byte-swapped array would be misread.
  if (size > 1 && !dt.attr("isnative").cast<bool>())
    throw InvalidArgument("array of non-native byte order (" + dt.attr("str").cast<std::string>() +
                          "): convert it first, e.g. a.astype(a.dtype.newbyteorder('=')) (an "
                          "output: read the result from the converted array)");
  if (kind == 'f' && size == 4) return DType::kFloat32;
  if (kind == 'f' && size == 8) return DType::kFloat64;
  if (kind == 'f' && size == 2) return DType::kFloat16;
  if (kind == 'i' && size == 4) return DType::kInt32;
  if (kind == 'i' && size == 8) return DType::kInt64;
  if (kind == 'i' && size == 1) return DType::kInt8;
  if (kind == 'u' && size == 1) return DType::kUInt8;
  throw InvalidArgument("unsupported numpy dtype " + py::cast<std::string>(dt.attr("name")) +
                        "; use float32, float64, float16, int32, int64, int8 or uint8");
}

py::dtype ToNumpy(DType t) {
  switch (t) {
    case DType::kFloat32:
      return py::dtype::of<float>();
    case DType::kFloat64:
      return py::dtype::of<double>();
    case DType::kFloat16:
      return py::dtype("float16");
    case DType::kInt32:
      return py::dtype::of<int32_t>();
    case DType::kInt64:
      return py::dtype::of<int64_t>();
    case DType::kInt8:
      return py::dtype::of<int8_t>();
    case DType::kUInt8:
      return py::dtype::of<uint8_t>();
    case DType::kBFloat16:
      break;
  }
  throw InvalidArgument("bfloat16 has no numpy dtype");
}

// Drops a Python reference from any thread. While the interpreter shuts down,
// taking the GIL from a foreign thread would end that thread (pthread_exit through
// C++ frames): the reference is leaked instead.
template <typename T>
void ReleaseUnderGil(T* o) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
  py::gil_scoped_acquire gil;
  delete o;
}

// Keys arrive as a list of ints or a list of strs. They are converted while the
// GIL is held (converting after releasing it crashed on a bad key) and int keys
// are range-checked here: a Python int can exceed the C++ int.
struct Keys {
  bool str = false;
  std::vector<int> ints;
  std::vector<std::string> strs;
};

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
thread_local const Handle* tls_updater_of = nullptr;

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
  ~Handle() {
    if (!p || !Py_IsInitialized() || _Py_IsFinalizing() || !PyGILState_Check()) return;
    if (tls_updater_of == this) {
      auto refs = new std::vector<InFlight>(std::move(inflight));
      std::thread([store = std::move(p), refs]() mutable {
        store.reset();
        ReleaseUnderGil(refs);
      }).detach();
      return;
    }
    py::gil_scoped_release nogil;
    p.reset();
  }
  KVStore& kv() {
    if (!p) throw UsageError("this KVStore was closed");
    if (closing) throw UsageError("this KVStore is being closed (by another thread)");
    if (inflight.size() >= sweep_at) Sweep();
    return *p;
  }
  // UsageError when closing is not possible on this thread.
  void CheckClose() const {
    if (tls_updater_of == this)
      throw UsageError(
          "close() of a KVStore inside its own updater: the updater runs on the store's "
          "engine thread, which close() would wait for and join; close the store after the "
          "push's wait returns, on the caller's thread");
  }
  // Drops the references of finished calls (GIL held).
  void Sweep() {
    std::erase_if(inflight, [this](InFlight& f) {
      if (!f.done->load(std::memory_order_acquire)) return false;
      Release(f);
      return true;
    });
    sweep_at = std::max<size_t>(64, 2 * inflight.size());
    RestoreFlags();
  }
  // Ends a call's claims on its arrays: spans forgotten, its read-only arrays queued
  // for RestoreFlags. Runs no Python code (callers iterate `inflight`).
  void Release(InFlight& f) {
    if (f.released) return;
    f.released = true;
    for (auto it : f.spans) claims.erase(it);
    f.spans.clear();
    if (claims.empty()) longest = 0;
    for (auto& a : f.locked) {
      auto it = locks.find(a.ptr());
      if (it == locks.end() || --it->second > 0) continue;
      locks.erase(it);
      unlocked.push_back(a);
    }
    f.locked.clear();
  }
  // Makes the arrays Release queued writable again (numpy checks that they may be: a
  // base made read-only meanwhile keeps them read-only). Python code may run here
  // (an ndarray subclass's setflags), which may call the store: nothing is iterated.
  void RestoreFlags() {
    while (!unlocked.empty()) {
      py::array a = std::move(unlocked.back());
      unlocked.pop_back();
      if (locks.count(a.ptr())) continue;  // claimed again meanwhile
      try {
        a.attr("setflags")(py::arg("write") = true);
      } catch (const py::error_already_set&) {
      }
    }
  }
  // After a wait for `waited` (all keys if null) returned, or failed other than by
  // timeout: the calls on those keys scheduled before the wait began (sched <= `upto`,
  // a snapshot of `scheduled`) are over. Others (other threads schedule while a wait
  // runs, without the GIL) may not be.
  void ReleaseKeys(const Keys* waited, uint64_t upto) {
    for (auto& f : inflight) {
      if (f.released || f.sched == 0 || f.sched > upto) continue;
      bool all = waited == nullptr;
      if (!all && f.keys.str == waited->str) {
        all = f.keys.str ? std::ranges::all_of(f.keys.strs,
                                               [&](const std::string& k) {
                                                 return std::ranges::find(waited->strs, k) !=
                                                        waited->strs.end();
                                               })
                         : std::ranges::all_of(f.keys.ints, [&](int k) {
                             return std::ranges::find(waited->ints, k) != waited->ints.end();
                           });
      }
      if (all) Release(f);
    }
    Sweep();
  }
  static std::vector<Span> Spans(const std::vector<py::array>& ins,
                                 const std::vector<py::array>& outs) {
    std::vector<Span> s;
    s.reserve(ins.size() + outs.size());
    for (int w = 0; w < 2; ++w)
      for (auto& a : w ? outs : ins) {
        auto start = reinterpret_cast<uintptr_t>(a.data());
        s.push_back(Span{start, start + static_cast<uintptr_t>(a.nbytes()), w == 1});
      }
    return s;
  }
  // Before a call: the keys of the batch calls in flight whose bytes overlap this
  // call's where either writes them (MXNet's engine ordered NDArrays so). Looks only
  // at the claims that can reach `mine` (indexed by start, bounded by `longest`).
  Keys Conflicts(const std::vector<Span>& mine) const {
    std::vector<uint64_t> seqs;
    for (auto& a : mine) {
      auto it = claims.lower_bound(a.start > longest ? a.start - longest : 0);
      for (; it != claims.end() && it->first < a.end; ++it)
        if (it->second.end > a.start && (a.writes || it->second.writes))
          seqs.push_back(it->second.seq);
    }
    Keys k;
    if (seqs.empty()) return k;
    bool any = false;
    for (auto& f : inflight) {
      if (f.released || std::ranges::find(seqs, f.seq) == seqs.end()) continue;
      if (!any) k.str = f.keys.str;
      any = true;
      if (f.keys.str == k.str) {
        k.ints.insert(k.ints.end(), f.keys.ints.begin(), f.keys.ints.end());
        k.strs.insert(k.strs.end(), f.keys.strs.begin(), f.keys.strs.end());
      }
    }
    return k;
  }
  // Records a batch's call: its spans, and its writable numpy arrays made read-only.
  void Claim(InFlight& f, const std::vector<Span>& spans, const std::vector<py::array>& ins,
             const std::vector<py::array>& outs) {
    for (auto& sp : spans) {
      f.spans.push_back(claims.emplace(sp.start, Claimed{sp.end, sp.writes, f.seq}));
      longest = std::max(longest, sp.end - sp.start);
    }
    for (int w = 0; w < 2; ++w)
      for (auto& a : w ? outs : ins) {
        auto it = locks.find(a.ptr());
        if (it != locks.end()) {
          ++it->second;
        } else if (a.writeable()) {
          py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
          locks.emplace(a.ptr(), 1);
        } else {
          continue;  // read-only before: stays so, nothing to restore
        }
        f.locked.push_back(a);
      }
  }
  // A new in-flight entry and the token its NDArrays share. The entry is made
  // before anything is scheduled, so a call that fails half-way keeps what it
  // scheduled alive too.
  std::pair<InFlight*, std::shared_ptr<void>> Track() {
    auto done = std::make_shared<std::atomic<bool>>(false);
    inflight.push_back(InFlight{done, {}});
    inflight.back().seq = ++next_seq;
    std::shared_ptr<void> token(done.get(),
                                [done](void*) { done->store(true, std::memory_order_release); });
    return {&inflight.back(), std::move(token)};
  }
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

// A C-contiguous numpy array as an NDArray sharing its memory. `writable`: the
// array receives results (pull/pushpull outputs), so a read-only one is refused.
// `flight`: an asynchronous call's entry, which keeps the array (else the NDArray
// keeps it).
NDArray Wrap(const py::array& a, bool writable = false, InFlight* flight = nullptr,
             const std::shared_ptr<void>& token = nullptr) {
  if (!(a.flags() & py::array::c_style))
    throw InvalidArgument("arrays must be C-contiguous (use numpy.ascontiguousarray)");
  if (writable && !a.writeable())
    throw InvalidArgument(
        "an output array is read-only (numpy flags.writeable is False, e.g. np.frombuffer of "
        "bytes): pass a writable array and read the result from that array (a copy made now "
        "receives the result, the original does not)");
  Shape shape(a.shape(), a.shape() + a.ndim());
  std::shared_ptr<void> keep = token;
  if (flight) {
    flight->refs.push_back(a);
  } else {
    auto* ref = new py::object(a);
    keep = std::shared_ptr<void>(ref, [](py::object* o) { ReleaseUnderGil(o); });
  }
  return NDArray::Wrap(const_cast<void*>(a.data()), shape, FromNumpy(a.dtype()), keep);
}

std::vector<NDArray> WrapAll(const std::vector<py::array>& v, bool writable = false,
                             InFlight* flight = nullptr,
                             const std::shared_ptr<void>& token = nullptr) {
  std::vector<NDArray> out;
  out.reserve(v.size());
  for (auto& a : v) out.push_back(Wrap(a, writable, flight, token));
  return out;
}

// A numpy array of an NDArray's memory that stays valid for as long as Python keeps
// it (an updater may keep `stored` beyond the call, beyond close()): an owning
// NDArray is shared through a capsule holding a copy of the handle. A view (e.g. a
// pushed numpy array, whose Python object the store releases after the call) is
// copied: its memory is not the NDArray's to keep.
py::array View(const NDArray& a) {
  std::vector<py::ssize_t> shape(a.shape().begin(), a.shape().end());
  if (a.is_view()) return py::array(ToNumpy(a.dtype()), shape, a.raw());  // copies
  auto* keep = new NDArray(a);
  py::capsule owner(keep, [](void* p) { delete static_cast<NDArray*>(p); });
  return py::array(ToNumpy(a.dtype()), shape, a.raw(), owner);
}

// Row ids from Python: any integer dtype (uint64 range-checked), flattened to an
// owning int64 array. Floats are refused rather than truncated (an empty array of
// any dtype is fine: np.array([]) is float64).
NDArray RowIds(const py::array& a) {
  const py::dtype dt = a.dtype();
  const char kind = dt.kind();
  if (a.size() > 0 && kind != 'i' && kind != 'u')
    throw InvalidArgument("row ids must be of an integer dtype, got " +
                          py::cast<std::string>(dt.attr("name")) +
                          ": convert them first, e.g. ids.astype(np.int64) (floats are not "
                          "truncated silently)");
  py::array_t<int64_t, py::array::c_style | py::array::forcecast> ids;
  if (kind == 'u' && dt.itemsize() == 8 && a.size() > 0) {
    auto u = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    if (!u) throw InvalidArgument("row ids could not be read as uint64");
    const uint64_t* p = u.data();
    for (py::ssize_t i = 0; i < u.size(); ++i)
      if (p[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw KeyError("row id " + std::to_string(p[i]) +
                       " is out of range: row ids are below 2^63");
  }
  ids = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!ids) throw InvalidArgument("row ids could not be read as int64");
  NDArray out(Shape{static_cast<int64_t>(ids.size())}, DType::kInt64);
  if (ids.size()) std::memcpy(out.raw(), ids.data(), out.nbytes());
  return out;
}

Keys ToKeys(const py::list& keys) {
  Keys k;
  k.str = keys.size() > 0 && py::isinstance<py::str>(keys[0]);
  for (const auto& o : keys) {
    if (k.str) {
      if (!py::isinstance<py::str>(o)) throw KeyError("int and str keys mixed in one call");
      k.strs.push_back(o.cast<std::string>());
      continue;
    }
    if (!py::isinstance<py::int_>(o) || py::isinstance<py::bool_>(o))
      throw KeyError("keys must be ints or strs, got " +
                     py::cast<std::string>(py::str(py::type::of(o).attr("__name__"))));
    long long v;
    try {
      v = o.cast<long long>();
    } catch (const py::cast_error&) {
      v = -1;  // beyond 64 bits
    }
    if (v < 0 || v > INT32_MAX)
      throw KeyError("key " + py::cast<std::string>(py::str(o)) +
                     " is out of range: int keys must be in [0, 2147483647]");
    k.ints.push_back(static_cast<int>(v));
  }
  return k;
}

template <typename F>
void WithKeys(const Keys& keys, F&& f) {
  if (keys.str) {
    f(keys.strs);
  } else {
    f(keys.ints);
  }
}

// Before a call whose bytes are `spans`: waits for the calls of batches in flight
// that they would race with (Handle::Conflicts), in the order issued.
void Order(Handle& h, KVStore& kv, const std::vector<Span>& spans) {
  if (h.claims.empty() || spans.empty()) return;
  Keys k = h.Conflicts(spans);
  if (k.ints.empty() && k.strs.empty()) return;
  const uint64_t upto = h.scheduled;
  {
    py::gil_scoped_release nogil;
    WithKeys(k, [&](const auto& keys) { kv.Wait(keys); });
  }
  h.ReleaseKeys(&k, upto);
}

// Schedules one push, pull or pushpull (`schedule(inputs, outputs)`, run without the
// GIL): first ordered after the batch calls in flight its bytes would race with, its
// arrays then held by a new in-flight entry, which a batch's call (`batch`) claims
// under `keys` (Handle::Claim).
template <typename F>
Completion Issue(Handle& h, KVStore& kv, const Keys& keys, const std::vector<py::array>& ins,
                 const std::vector<py::array>& outs, bool check_writable, bool batch,
                 F&& schedule) {
  std::vector<Span> spans;
  if (batch || !h.claims.empty()) spans = Handle::Spans(ins, outs);
  Order(h, kv, spans);
  auto [flight, token] = h.Track();
  Completion c{flight->done};
  auto v = WrapAll(ins, false, flight, token);
  auto o = WrapAll(outs, check_writable, flight, token);
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

// Keys `a` then `b` (a pushpull's push and pull keys).
Keys Concat(Keys a, const Keys& b) {
  a.ints.insert(a.ints.end(), b.ints.begin(), b.ints.end());
  a.strs.insert(a.strs.end(), b.strs.begin(), b.strs.end());
  return a;
}

}  // namespace

PYBIND11_MODULE(_pskv, m) {
  pskv::TuneAllocatorForLargeMessages();  // the binding decides, not the library
  m.doc() = "pskv core (C++); use the pskv package";

  // Exceptions: the C++ hierarchy, same names and messages.
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<InvalidArgument> invalid(m, "InvalidArgument", error.ptr());
  static py::exception<KeyError> key_error(m, "KeyError", error.ptr());
  static py::exception<ShapeError> shape_error(m, "ShapeError", error.ptr());
  static py::exception<UsageError> usage_error(m, "UsageError", error.ptr());
  static py::exception<ConfigError> config_error(m, "ConfigError", error.ptr());
  static py::exception<TimeoutError> timeout_error(m, "TimeoutError", error.ptr());
  static py::exception<ProtocolError> protocol_error(m, "ProtocolError", error.ptr());
  static py::exception<NodeFailure> node_failure(m, "NodeFailure", error.ptr());
  static py::exception<IOError> io_error(m, "IOError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      invalid(e.what());
    } catch (const KeyError& e) {
      key_error(e.what());
    } catch (const ShapeError& e) {
      shape_error(e.what());
    } catch (const UsageError& e) {
      usage_error(e.what());
    } catch (const ConfigError& e) {
      config_error(e.what());
    } catch (const TimeoutError& e) {
      timeout_error(e.what());
    } catch (const ProtocolError& e) {
      protocol_error(e.what());
    } catch (const NodeFailure& e) {
      node_failure(e.what());
    } catch (const IOError& e) {
      io_error(e.what());
    }
  });

  m.def("role", [] {
    Options o = Options::FromEnv();
    return o.role_set ? RoleName(o.role) : std::string("worker");
  });
  m.def(
      "run_role",
      [] {
        const Options o = Options::FromEnv();
        std::optional<int> rc;
        {
          py::gil_scoped_release nogil;
          rc = RunServerRoleIfAsked(o);
        }
        if (!rc) throw UsageError("run_role: DMLC_ROLE is neither server nor scheduler");
        return *rc;
      },
      "Runs this process's server/scheduler role until the job ends; returns the exit status.");
  m.def(
      "env_table",
      [] {
        py::list out;
        for (const EnvVar& v : EnvVars()) {
          py::dict d;
          d["name"] = v.name;
          d["type"] = EnvTypeName(v.type);
          d["lo"] = v.lo;
          d["hi"] = v.hi;
          d["choices"] = v.choices;
          d["default"] = v.default_text;
          d["scope"] = EnvScopeName(v.scope);
          d["doc"] = v.doc;
          out.append(d);
        }
        return out;
      },
      "Every environment variable pskv knows (src/common/env_table.cc), as dicts.");
  m.def("valid_types", &KVStore::ValidTypes);

  py::class_<Completion>(m, "Completion")
      .def_property_readonly(
          "done", [](const Completion& c) { return c.done->load(std::memory_order_acquire); },
          "True once pskv no longer uses the call's arrays (results written, inputs read).");

  py::class_<RowSparsePending>(m, "RowSparsePending")
      .def(
          "result",
          [](const RowSparsePending& r) {
            py::list result;
            for (auto& o : r.outs) {
              // Copies owned by numpy (the NDArrays' memory is freed with them).
              py::array i = View(o.indices()), d = View(o.data());
              result.append(py::make_tuple(i.attr("copy")(), d.attr("copy")()));
            }
            return result;
          },
          "[(indices, rows)] per output; call after a wait of the key returned.");

  py::class_<Handle>(m, "KVStore")
      .def_static("create",
                  [](const std::string& t) {
                    auto h = std::make_unique<Handle>();
                    py::gil_scoped_release nogil;  // a dist store registers with the job here
                    h->p = KVStore::Create(t);
                    return h;
                  })
      .def(
          "check_close", [](const Handle& h) { h.CheckClose(); },
          "UsageError where close() is not possible (inside this store's updater).")
      .def("close",
           [](Handle& h) {
             h.CheckClose();
             if (!h.p || h.closing) return;  // closed, or being closed by another thread
             h.closing = true;               // new calls fail with UsageError from here on
             if (h.calls.load(std::memory_order_acquire) > 0) {
               // Calls of other threads are blocked in the store (barrier, wait): wait
               // for them, as long as they can last (they end at the store's timeout).
               const auto limit = h.p->options().op_timeout + std::chrono::seconds(5);
               const auto until = std::chrono::steady_clock::now() + limit;
               py::gil_scoped_release nogil;
               while (h.calls.load(std::memory_order_acquire) > 0 &&
                      std::chrono::steady_clock::now() < until)
                 std::this_thread::sleep_for(std::chrono::milliseconds(2));
             }
             if (const int n = h.calls.load(std::memory_order_acquire); n > 0) {
               h.closing = false;  // never freed under a running call: the store stays open
               throw TimeoutError("close(): " + std::to_string(n) +
                                  " call(s) of other threads are still blocked in this KVStore "
                                  "(barrier, wait); the store stays open: close it again after "
                                  "they returned");
             }
             std::unique_ptr<KVStore> p = std::move(h.p);
             {
               py::gil_scoped_release nogil;  // the final barrier and pending callbacks need it
               p.reset();
             }
             for (auto& f : h.inflight) h.Release(f);
             h.inflight.clear();  // the store and its threads are gone
             h.RestoreFlags();    // read-only flags of calls in flight restored
           })
      .def(
          "pending",
          [](Handle& h) {
            h.Sweep();
            return h.inflight.size();
          },
          "Asynchronous calls whose arrays pskv still uses (their references are held).")
      .def_property_readonly("type", [](Handle& h) { return h.kv().Type(); })
      .def_property_readonly("rank", [](Handle& h) { return h.kv().Rank(); })
      .def_property_readonly("num_workers", [](Handle& h) { return h.kv().NumWorkers(); })
      .def_property_readonly(
          "fusion_key_bytes", [](Handle& h) { return h.kv().options().fusion_key_bytes; },
          "PSKV_FUSION_KEY_BYTES: keys up to this size travel fused within one call.")
      .def_property_readonly(
          "update_on_kvstore_default",
          [](Handle& h) { return h.kv().options().update_on_kvstore.value_or(true); },
          "MXNET_UPDATE_ON_KVSTORE as this store read it (unset: True): a Trainer's default "
          "before the rest of the policy (include/pskv/trainer_policy.h).")
      .def("init",
           [](Handle& h, const py::list& keys, const std::vector<py::array>& vals) {
             Use use(h);
             KVStore& kv = use.kv();
             auto v = WrapAll(vals);
             Keys ks = ToKeys(keys);
             py::gil_scoped_release nogil;
             WithKeys(ks, [&](const auto& k) { kv.Init(k, v); });
           })
      // push, pull and pushpull schedule and return a Completion; the arrays stay
      // referenced by the Handle until pskv is done with them (see InFlight). Every
      // call first waits for the calls of batches in flight its bytes would race
      // with; a call of a batch (`batch`) claims its bytes and arrays (Handle::Claim)
      // until a wait covering its keys returned.
      .def(
          "order",
          [](Handle& h, const std::vector<py::array>& ins, const std::vector<py::array>& outs) {
            Use use(h);
            Order(h, use.kv(), Handle::Spans(ins, outs));
          },
          "Waits for the calls of batches in flight whose bytes overlap these (init's).")
      .def(
          "push",
          [](Handle& h, const py::list& keys, const std::vector<py::array>& vals, int prio,
             bool batch) {
            Use use(h);
            KVStore& kv = use.kv();
            Keys ks = ToKeys(keys);
            return Issue(h, kv, ks, vals, {}, false, batch, [&](auto& v, auto&) {
              WithKeys(ks, [&](const auto& k) { kv.Push(k, v, prio); });
            });
          },
          py::arg("keys"), py::arg("vals"), py::arg("prio"), py::arg("batch") = false)
      .def(
          "pull",
          [](Handle& h, const py::list& keys, const std::vector<py::array>& outs, int prio,
             bool check_writable, bool batch) {
            Use use(h);
            KVStore& kv = use.kv();
            Keys ks = ToKeys(keys);
            return Issue(h, kv, ks, {}, outs, check_writable, batch, [&](auto&, auto& o) {
              WithKeys(ks, [&](const auto& k) { kv.Pull(k, o, prio); });
            });
          },
          py::arg("keys"), py::arg("outs"), py::arg("prio"), py::arg("check_writable") = true,
          py::arg("batch") = false)
      .def(
          "pushpull",
          [](Handle& h, const py::list& keys, const std::vector<py::array>& vals,
             const py::list& out_keys, const std::vector<py::array>& outs, int prio,
             bool check_writable, bool batch) {
            Use use(h);
            KVStore& kv = use.kv();
            Keys ks = ToKeys(keys), oks = ToKeys(out_keys);
            if (ks.str != oks.str) throw KeyError("int and str keys mixed in one call");
            return Issue(h, kv, Concat(ks, oks), vals, outs, check_writable, batch,
                         [&](auto& v, auto& o) {
                           if (ks.str) {
                             kv.PushPull(ks.strs, v, oks.strs, o, prio);
                           } else {
                             kv.PushPull(ks.ints, v, oks.ints, o, prio);
                           }
                         });
          },
          py::arg("keys"), py::arg("vals"), py::arg("out_keys"), py::arg("outs"), py::arg("prio"),
          py::arg("check_writable") = true, py::arg("batch") = false)
      // row_sparse keys: `key` is a one-element list (int or str); values are
      // (row ids, rows) pairs of numpy arrays with the full `shape` given.
      .def("init_row_sparse",
           [](Handle& h, const py::list& key, const Shape& shape, py::array ids, py::array rows) {
             Use use(h);
             KVStore& kv = use.kv();
             auto v = RowSparseNDArray::FromRows(shape, RowIds(ids), Wrap(rows));
             Keys ks = ToKeys(key);
             py::gil_scoped_release nogil;
             if (ks.str) {
               kv.Init(ks.strs.at(0), v);
             } else {
               kv.Init(ks.ints.at(0), v);
             }
           })
      .def("push_row_sparse",
           [](Handle& h, const py::list& key, const Shape& shape,
              const std::vector<std::pair<py::array, py::array>>& values, int prio) {
             Use use(h);
             KVStore& kv = use.kv();
             std::vector<RowSparseNDArray> v;
             // FromRows copies (sorted, repeated ids summed): the arrays may change at once.
             for (auto& [ids, rows] : values)
               v.push_back(RowSparseNDArray::FromRows(shape, RowIds(ids), Wrap(rows)));
             Keys ks = ToKeys(key);
             py::gil_scoped_release nogil;
             if (ks.str) {
               kv.Push(ks.strs.at(0), v, prio);
             } else {
               kv.Push(ks.ints.at(0), v, prio);
             }
           })
      // Schedules a row_sparse pull; the outputs are owned by pskv (no Python
      // memory involved), read with RowSparsePending.result() after a wait of the key.
      .def("row_sparse_pull_start",
           [](Handle& h, const py::list& key, const Shape& shape, const std::string& dtype,
              const std::vector<py::array>& row_ids, int prio) {
             Use use(h);
             KVStore& kv = use.kv();
             std::vector<NDArray> ids;
             for (auto& a : row_ids) ids.push_back(RowIds(a));
             RowSparsePending r;
             for (size_t i = 0; i < ids.size(); ++i) r.outs.emplace_back(shape, ParseDType(dtype));
             Keys ks = ToKeys(key);
             py::gil_scoped_release nogil;
             if (ks.str) {
               kv.RowSparsePull(ks.strs.at(0), r.outs, ids, prio);
             } else {
               kv.RowSparsePull(ks.ints.at(0), r.outs, ids, prio);
             }
             return r;
           })
      // A wait that returned (or failed other than by timeout) releases the batch
      // calls on its keys: their arrays become writable again, their bytes free.
      .def("wait",
           [](Handle& h, const py::list& keys) {
             Use use(h);
             KVStore& kv = use.kv();
             Keys ks = ToKeys(keys);
             const uint64_t upto = h.scheduled;
             try {
               py::gil_scoped_release nogil;
               WithKeys(ks, [&](const auto& k) { kv.Wait(k); });
             } catch (const TimeoutError&) {
               throw;
             } catch (...) {
               h.ReleaseKeys(&ks, upto);
               throw;
             }
             h.ReleaseKeys(&ks, upto);
           })
      .def("wait_all",
           [](Handle& h) {
             Use use(h);
             KVStore& kv = use.kv();
             const uint64_t upto = h.scheduled;
             try {
               py::gil_scoped_release nogil;
               kv.WaitAll();
             } catch (const TimeoutError&) {
               throw;
             } catch (...) {
               h.ReleaseKeys(nullptr, upto);
               throw;
             }
             h.ReleaseKeys(nullptr, upto);
           })
      .def("barrier",
           [](Handle& h) {
             Use use(h);
             KVStore& kv = use.kv();
             py::gil_scoped_release nogil;
             kv.Barrier();
           })
      .def("set_optimizer",
           [](Handle& h, const std::string& type, const std::map<std::string, std::string>& p) {
             Use use(h);
             KVStore& kv = use.kv();
             auto cfg = OptimizerConfig::FromParams(type, p);
             py::gil_scoped_release nogil;
             kv.SetOptimizer(cfg);
           })
      .def("set_gradient_compression",
           [](Handle& h, const std::map<std::string, std::string>& p) {
             Use use(h);
             KVStore& kv = use.kv();
             auto cfg = CompressionConfig::FromParams(p);
             py::gil_scoped_release nogil;
             kv.SetGradientCompression(cfg);
           })
      .def("set_updater",
           [](Handle& h, py::function fn) {
             Use use(h);
             KVStore& kv = use.kv();
             // Int ids reach Python, which maps string-key ids back to names.
             auto holder = std::shared_ptr<py::function>(
                 new py::function(std::move(fn)), [](py::function* f) { ReleaseUnderGil(f); });
             const Handle* self = &h;  // outlives the store, hence its updater
             kv.SetUpdater(Updater([holder, self](int k, const NDArray& recv, NDArray* stored) {
               py::gil_scoped_acquire gil;
               const Handle* outer = tls_updater_of;
               tls_updater_of = self;
               struct Restore {
                 const Handle* v;
                 ~Restore() { tls_updater_of = v; }
               } restore{outer};
               (*holder)(k, View(recv), View(*stored));
             }));
           })
      .def("save_optimizer_states",
           [](Handle& h, const std::string& f, bool dump) {
             Use use(h);
             KVStore& kv = use.kv();
             py::gil_scoped_release nogil;
             kv.SaveOptimizerStates(f, dump);
           })
      .def("load_optimizer_states", [](Handle& h, const std::string& f) {
        Use use(h);
        KVStore& kv = use.kv();
        py::gil_scoped_release nogil;
        kv.LoadOptimizerStates(f);
      });

  py::class_<Optimizer, std::shared_ptr<Optimizer>>(m, "Optimizer")
      .def(py::init([](const std::string& type, const std::map<std::string, std::string>& p) {
        return std::make_shared<Optimizer>(OptimizerConfig::FromParams(type, p));
      }))
      .def("update",
           [](Optimizer& o, int64_t key, py::array grad, py::array weight) {
             // The weight is written in place: a read-only one (np.frombuffer of bytes,
             // a read-only memmap) is refused, not changed or crashed on.
             if (!weight.writeable())
               throw InvalidArgument(
                   "Optimizer.update: the weight array is read-only (numpy flags.writeable is "
                   "False, e.g. np.frombuffer of bytes or a read-only memmap): pass a writable "
                   "array, e.g. a copy");
             NDArray g = Wrap(grad), w = Wrap(weight, true);
             py::gil_scoped_release nogil;
             o.Update(key, g, &w);
           })
      .def("serialize", [](const Optimizer& o) { return o.CurrentConfig().Serialize(); })
      .def("save_states",
           [](const Optimizer& o, bool dump) { return py::bytes(o.SaveStates(dump)); })
      .def("load_states", [](Optimizer& o, const py::bytes& b) { o.LoadStates(std::string(b)); });
  // The optimizer's parameters from the one field table (plus the parameters of the
  // rule of `type`): Python checks and documents its optimizers against this list.
  m.def(
      "optimizer_params",
      [](const std::string& type) {
        py::list out;
        for (const OptimizerParamInfo& p : OptimizerConfig::Params(type)) {
          py::dict d;
          d["name"] = p.name;
          d["alias"] = p.alias;
          d["type"] = p.type;
          d["default"] = p.default_value;
          d["range"] = p.range;
          d["doc"] = p.doc;
          out.append(d);
        }
        return out;
      },
      py::arg("type") = "");
  m.def("optimizer_types", &OptimizerConfig::Types);
  // The configuration text saved in a states file with dump_optimizer, or None (the
  // file formats are read by the library's one codec).
  m.def("states_file_config", [](const std::string& fname) -> std::optional<std::string> {
    auto cfg = ReadDumpedOptimizerConfig(fname);
    if (!cfg) return std::nullopt;
    return cfg->Serialize();
  });

  BindTrainerPolicy(m);

  // Data-parallel helpers (include/pskv/data.h): the same functions as C++.
  py::module_ d = m.def_submodule("data");
  d.def("partition_range", &data::PartitionRange);
  d.def("epoch_size", &data::EpochSize);
  d.def("epoch_order", &data::EpochOrder);
  d.def("split_batch", &data::SplitBatch);
  d.def("split_by_workload", &data::SplitByWorkload);
}
