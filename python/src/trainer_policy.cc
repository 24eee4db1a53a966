// pskv._pskv.trainer: the Trainer semantics of include/pskv/trainer_policy.h, for
// pskv.torch.Trainer (the libtorch pskv::Trainer calls the same functions).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "pskv/error.h"
#include "pskv/trainer_policy.h"

namespace py = pybind11;

namespace pskv {

namespace {
LossReduction ToReduction(const std::optional<std::string>& r) {
  if (!r) return LossReduction::kUnset;
  if (*r == "mean") return LossReduction::kMean;
  if (*r == "sum") return LossReduction::kSum;
  throw InvalidArgument("loss_reduction must be 'mean' or 'sum', got '" + *r + "'");
}

// Serialize()'s text as {name: value}, without the type (named separately).
std::map<std::string, std::string> ToParams(const OptimizerConfig& c) {
  std::map<std::string, std::string> out;
  std::stringstream ss(c.Serialize());
  std::string line;
  while (std::getline(ss, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos || line.compare(0, eq, "type") == 0) continue;
    out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}
}  // namespace

void BindTrainerPolicy(py::module_& parent) {
  py::module_ m = parent.def_submodule("trainer", "include/pskv/trainer_policy.h");
  m.def(
      "update_on_kvstore",
      [](std::optional<bool> requested, const std::string& store_type, bool env_default,
         bool store_from_name, int64_t largest_param, bool sparse_params, int devices) {
        UpdatePlacement p;
        p.requested = requested;
        p.store_type = store_type;
        p.env_default = env_default;
        p.store_from_name = store_from_name;
        p.largest_param = largest_param;
        p.sparse_params = sparse_params;
        p.devices = devices;
        return ResolveUpdateOnKVStore(p);
      },
      py::arg("requested"), py::arg("store_type"), py::arg("env_default"),
      py::arg("store_from_name"), py::arg("largest_param"), py::arg("sparse_params"),
      py::arg("devices") = 1, "ResolveUpdateOnKVStore (devices: replicas per worker).");
  py::class_<LossScale>(m, "LossScale")
      .def(py::init([](const std::optional<std::string>& reduction, int64_t global_batch_size,
                       int workers, int devices) {
             return LossScale(ToReduction(reduction), global_batch_size, workers, devices);
           }),
           py::arg("reduction"), py::arg("global_batch_size"), py::arg("workers"),
           py::arg("devices") = 1)
      .def_property_readonly("reduction",
                             [](const LossScale& s) -> std::optional<std::string> {
                               switch (s.reduction()) {
                                 case LossReduction::kMean:
                                   return "mean";
                                 case LossReduction::kSum:
                                   return "sum";
                                 default:
                                   return std::nullopt;
                               }
                             })
      .def_property_readonly("scale", &LossScale::scale)
      .def_property_readonly("shipped", &LossScale::shipped)
      .def("ratio", &LossScale::Ratio, py::arg("batch_size"));
  m.def(
      "optimizer_config",
      [](const std::string& type, const std::map<std::string, std::string>& params, double shipped,
         int64_t key_offset, size_t num_params, const std::map<size_t, double>& lr_mult,
         const std::map<size_t, double>& wd_mult, size_t num_buffers) {
        return ToParams(TrainerOptimizerConfig(OptimizerConfig::FromParams(type, params), shipped,
                                               key_offset, num_params, lr_mult, wd_mult,
                                               num_buffers));
      },
      py::arg("type"), py::arg("params"), py::arg("shipped"), py::arg("key_offset"),
      py::arg("num_params"), py::arg("lr_mult"), py::arg("wd_mult"), py::arg("num_buffers"),
      "TrainerOptimizerConfig, as the parameters OptimizerConfig::FromParams takes.");
}

}  // namespace pskv
