#include "handle.h"

#include <algorithm>
#include <thread>

#include "pskv/error.h"

namespace pskv::binding {

thread_local const Handle* tls_updater_of = nullptr;

Handle::~Handle() {
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

KVStore& Handle::kv() {
  if (!p) throw UsageError("this KVStore was closed");
  if (closing) throw UsageError("this KVStore is being closed (by another thread)");
  if (inflight.size() >= sweep_at) Sweep();
  return *p;
}

void Handle::CheckClose() const {
  if (tls_updater_of == this)
    throw UsageError(
        "close() of a KVStore inside its own updater: the updater runs on the store's "
        "engine thread, which close() would wait for and join; close the store after the "
        "push's wait returns, on the caller's thread");
}

void Handle::Sweep() {
  std::erase_if(inflight, [this](InFlight& f) {
    if (!f.done->load(std::memory_order_acquire)) return false;
    Release(f);
    return true;
  });
  sweep_at = std::max<size_t>(64, 2 * inflight.size());
  RestoreFlags();
}

void Handle::Release(InFlight& f) {
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

void Handle::RestoreFlags() {
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

void Handle::ReleaseKeys(const Keys* waited, uint64_t upto) {
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

std::vector<Span> Handle::Spans(const std::vector<py::object>& ins,
                                const std::vector<py::object>& outs) {
  std::vector<Span> s;
  s.reserve(ins.size() + outs.size());
  for (int w = 0; w < 2; ++w)
    for (auto& a : w ? outs : ins) {
      const auto [start, end] = ValueBytes(a);
      s.push_back(Span{start, end, w == 1});
    }
  return s;
}

Keys Handle::Conflicts(const std::vector<Span>& mine) const {
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

void Handle::Claim(InFlight& f, const std::vector<Span>& spans, const std::vector<py::object>& ins,
                   const std::vector<py::object>& outs) {
  for (auto& sp : spans) {
    f.spans.push_back(claims.emplace(sp.start, Claimed{sp.end, sp.writes, f.seq}));
    longest = std::max(longest, sp.end - sp.start);
  }
  for (int w = 0; w < 2; ++w)
    for (auto& v : w ? outs : ins) {
      if (!py::isinstance<py::array>(v)) continue;
      const auto a = py::reinterpret_borrow<py::array>(v);
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

std::pair<InFlight*, std::shared_ptr<void>> Handle::Track() {
  auto done = std::make_shared<std::atomic<bool>>(false);
  inflight.push_back(InFlight{done, {}});
  inflight.back().seq = ++next_seq;
  std::shared_ptr<void> token(done.get(),
                              [done](void*) { done->store(true, std::memory_order_release); });
  return {&inflight.back(), std::move(token)};
}

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

}  // namespace pskv::binding
