// _pskv.EmbeddingTable: dynamic embedding tables (include/pskv/embedding.h) of a store,
// created by _pskv.create_embedding; python/pskv/embedding.py gives them keywords.
#include <pybind11/chrono.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "arrays.h"
#include "binding.h"
#include "handle.h"
#include "pskv/embedding.h"
#include "pskv/error.h"

namespace pskv::binding {

namespace {

// A table with the store it belongs to: every call checks that the store is open
// and counts as one of its calls (Handle::Use), so close() waits for it.
struct Table {
  Handle* store;  // kept alive by the table's Python object (keep_alive)
  std::unique_ptr<EmbeddingTable> t;
};

template <typename E>
E Choice(const std::string& what, const std::string& v, const std::map<std::string, E>& choices) {
  auto it = choices.find(v);
  if (it != choices.end()) return it->second;
  std::string known;
  for (auto& [k, _] : choices) known += (known.empty() ? "" : ", ") + k;
  throw InvalidArgument(what + " '" + v + "' is not one of: " + known);
}

// An EmbeddingConfig from the keywords of pskv.embedding.create (all given there).
EmbeddingConfig ConfigOf(const py::dict& d) {
  EmbeddingConfig c;
  c.name = d["name"].cast<std::string>();
  c.width = d["width"].cast<int64_t>();
  c.seed = d["seed"].cast<uint64_t>();
  c.init.kind =
      Choice<EmbeddingInitializer::Kind>("initializer", d["init"].cast<std::string>(),
                                         {{"uniform", EmbeddingInitializer::Kind::kUniform},
                                          {"normal", EmbeddingInitializer::Kind::kNormal},
                                          {"zeros", EmbeddingInitializer::Kind::kZeros}});
  c.init.a = d["init_a"].cast<double>();
  c.init.b = d["init_b"].cast<double>();
  c.optimizer =
      OptimizerConfig::FromParams(d["optimizer"].cast<std::string>(),
                                  d["optimizer_params"].cast<std::map<std::string, std::string>>());
  const auto admit_after = d["admit_after"].cast<uint32_t>();
  if (!d["bloom_ids"].is_none()) {
    c.admission = EmbeddingAdmission::CountingBloom(admit_after, d["bloom_ids"].cast<uint64_t>(),
                                                    d["bloom_fpr"].cast<double>());
  } else {
    c.admission.admit_after = admit_after;
  }
  c.unadmitted_pull = Choice<EmbeddingConfig::UnadmittedPull>(
      "unadmitted", d["unadmitted"].cast<std::string>(),
      {{"initializer", EmbeddingConfig::UnadmittedPull::kInitializer},
       {"zeros", EmbeddingConfig::UnadmittedPull::kZeros}});
  c.ttl_steps = d["ttl_steps"].cast<int64_t>();
  c.capacity = d["capacity"].cast<int64_t>();
  c.max_bytes = d["max_bytes"].cast<uint64_t>();
  return c;
}

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

void BindEmbedding(py::module_& m) {
  py::class_<Table>(m, "EmbeddingTable")
      .def_property_readonly("key", [](const Table& t) { return t.t->key(); })
      .def_property_readonly("width", [](const Table& t) { return t.t->config().width; })
      .def_property_readonly("name", [](const Table& t) { return t.t->config().name; })
      .def(
          "pull",
          [](Table& t, const py::array& ids, double timeout) {
            Use use(*t.store);
            const NDArray i = Wrap(ids);
            NDArray rows, versions;
            {
              py::gil_scoped_release nogil;
              rows = t.t->Pull(i, &versions, Ms(timeout));
            }
            return py::make_tuple(View(rows), View(versions));
          },
          py::arg("ids"), py::arg("timeout") = 0.0,
          "(rows float32 (n, width), versions int64 (n,)) of int64 ids.")
      .def(
          "push",
          [](Table& t, const py::array& ids, const py::array& grads, double timeout) {
            Use use(*t.store);
            const NDArray i = Wrap(ids), g = Wrap(grads);
            py::gil_scoped_release nogil;
            t.t->Push(i, g, Ms(timeout));
          },
          py::arg("ids"), py::arg("grads"), py::arg("timeout") = 0.0,
          "One update: gradients float32 (n, width) for int64 ids.")
      .def(
          "stats",
          [](Table& t, double timeout) {
            Use use(*t.store);
            EmbeddingStats s;
            {
              py::gil_scoped_release nogil;
              s = t.t->Stats(Ms(timeout));
            }
            py::dict d;
            d["live"] = s.live;
            d["admitted"] = s.admitted;
            d["evicted_ttl"] = s.evicted_ttl;
            d["evicted_capacity"] = s.evicted_capacity;
            d["dropped_grads"] = s.dropped_grads;
            d["pulled_rows"] = s.pulled_rows;
            d["pulled_defaults"] = s.pulled_defaults;
            d["pending_ids"] = s.pending_ids;
            d["memory_bytes"] = s.memory_bytes;
            d["step"] = s.step;
            d["pulls"] = s.pulls;
            d["pulled_ids"] = s.pulled_ids;
            d["pull_bytes_sent"] = s.pull_bytes_sent;
            d["pull_bytes_received"] = s.pull_bytes_received;
            d["cache_hits"] = s.cache_hits;
            d["cache_evicted"] = s.cache_evicted;
            d["cache_rows"] = s.cache_rows;
            return d;
          },
          py::arg("timeout") = 0.0, "The table's counters (pskv::EmbeddingStats) as a dict.")
      .def(
          "save",
          [](Table& t, const std::string& dir, bool full, double timeout) {
            Use use(*t.store);
            py::gil_scoped_release nogil;  // collective
            return t.t->Save(dir, full ? EmbeddingSaveKind::kFull : EmbeddingSaveKind::kDelta,
                             Ms(timeout));
          },
          py::arg("dir"), py::arg("full"), py::arg("timeout") = 0.0,
          "Saves the table into dir (collective); returns the bytes written.")
      .def(
          "restore",
          [](Table& t, const std::string& dir, double timeout) {
            Use use(*t.store);
            py::gil_scoped_release nogil;  // collective
            t.t->Restore(dir, Ms(timeout));
          },
          py::arg("dir"), py::arg("timeout") = 0.0, "Restores the newest save in dir (collective).")
      .def(
          "export",
          [](Table& t, const std::string& dir, double timeout) {
            Use use(*t.store);
            py::gil_scoped_release nogil;  // collective
            return t.t->Export(dir, Ms(timeout));
          },
          py::arg("dir"), py::arg("timeout") = 0.0,
          "Writes the live rows into dir (collective); returns the bytes written.");
  m.def(
      "read_embedding_export",
      [](const std::string& dir, int key) {
        std::vector<uint64_t> ids;
        std::vector<float> values;
        int64_t width = 0;
        EmbeddingTable::ReadExport(dir, key, [&](uint64_t id, const float* v, int64_t w) {
          width = w;
          ids.push_back(id);
          values.insert(values.end(), v, v + w);
        });
        py::array_t<uint64_t> i(static_cast<py::ssize_t>(ids.size()));
        if (!ids.empty()) std::memcpy(i.mutable_data(), ids.data(), ids.size() * 8);
        py::array_t<float> v(
            {static_cast<py::ssize_t>(ids.size()), static_cast<py::ssize_t>(width)});
        if (!values.empty()) std::memcpy(v.mutable_data(), values.data(), values.size() * 4);
        return py::make_tuple(i, v);
      },
      py::arg("dir"), py::arg("key"),
      "(ids uint64 (n,), values float32 (n, width)) of an export of table `key` in dir.");
  m.def(
      "create_embedding",
      [](Handle& h, int key, const py::dict& config) {
        const EmbeddingConfig c = ConfigOf(config);
        EmbeddingCacheConfig cache;
        cache.capacity = config["cache_rows"].cast<int64_t>();
        cache.staleness = config["staleness"].cast<int64_t>();
        cache.aging_steps = config["cache_aging_steps"].cast<int64_t>();
        Use use(h);
        auto t = std::make_unique<Table>();
        t->store = &h;
        py::gil_scoped_release nogil;  // collective: waits for the other workers
        t->t = EmbeddingTable::Create(use.kv(), key, c, cache);
        return t;
      },
      py::keep_alive<0, 1>(), "Creates dynamic embedding table `key` of the store (collective).");
}

}  // namespace pskv::binding
