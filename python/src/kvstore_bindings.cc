// _pskv.KVStore: the store's calls, as flat lists of keys and values (numpy arrays
// or pskv.DeviceArray; python/pskv/kvstore.py gives them MXNet's shape).
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "arrays.h"
#include "binding.h"
#include "handle.h"
#include "keys.h"
#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/optimizer.h"
#include "pskv/row_sparse.h"
#include "pskv/store_type.h"

namespace pskv::binding {

void BindKVStore(py::module_& m) {
  m.def("valid_types", &KVStore::ValidTypes);
  m.def(
      "store_type",
      [](const std::string& name) {
        const StoreType t = StoreType::Parse(name);
        py::dict d;
        d["canonical"] = t.canonical;
        d["dist"] = t.dist;
        d["async"] = t.async;
        d["device"] = t.device;
        return d;
      },
      "The parsed store type (pskv/store_type.h): canonical name, dist, async, device.");

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
           [](Handle& h, const py::list& keys, const std::vector<py::object>& vals) {
             Use use(h);
             KVStore& kv = use.kv();
             auto v = WrapValues(vals);
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
          [](Handle& h, const std::vector<py::object>& ins, const std::vector<py::object>& outs) {
            Use use(h);
            Order(h, use.kv(), Handle::Spans(ins, outs));
          },
          "Waits for the calls of batches in flight whose bytes overlap these (init's).")
      .def(
          "push",
          [](Handle& h, const py::list& keys, const std::vector<py::object>& vals, int prio,
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
          [](Handle& h, const py::list& keys, const std::vector<py::object>& outs, int prio,
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
          [](Handle& h, const py::list& keys, const std::vector<py::object>& vals,
             const py::list& out_keys, const std::vector<py::object>& outs, int prio,
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
      .def("epoch_partition",
           [](Handle& h) {
             Use use(h);
             KVStore& kv = use.kv();
             py::gil_scoped_release nogil;
             return kv.EpochPartition();
           })
      .def_property_readonly("epoch", [](Handle& h) { return h.kv().Epoch(); })
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
}

}  // namespace pskv::binding
