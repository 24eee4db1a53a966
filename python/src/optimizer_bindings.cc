// _pskv.Optimizer (the C++ optimizer, for pskv.optimizer and updaters written in
// Python) and the optimizer-states files.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "arrays.h"
#include "binding.h"
#include "pskv/error.h"
#include "pskv/optimizer.h"

namespace pskv::binding {

void BindOptimizer(py::module_& m) {
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
  // An Optimizer.save_states blob to a states file and back, with the checksum
  // (pskv/optimizer.h, WriteOptimizerStatesFile).
  m.def("write_states_file", [](const std::string& fname, const py::bytes& blob) {
    WriteOptimizerStatesFile(fname, std::string(blob));
  });
  m.def("read_states_file",
        [](const std::string& fname) { return py::bytes(ReadOptimizerStatesFile(fname)); });
}

}  // namespace pskv::binding
