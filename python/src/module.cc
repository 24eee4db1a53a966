// _pskv: the Python binding of the C++ core. The Python package (python/pskv)
// gives it MXNet's `mx.kv` shape; this module stays thin: flat lists of keys and
// numpy arrays in, C++ calls out. One file per concern (binding.h lists them).
//
// Importing it changes no process-wide setting: the allocator and the logging and
// metrics are the program's (pskv.configure_process, python/pskv/process.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "binding.h"
#include "pskv/data.h"
#include "pskv/device.h"
#include "pskv/error.h"

namespace pskv::binding {

void BindErrors(py::module_& m) {
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
  static py::exception<DeviceUnavailable> device_unavailable(m, "DeviceUnavailable",
                                                             usage_error.ptr());
  static py::exception<DeviceError> device_error(m, "DeviceError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      invalid(e.what());
    } catch (const KeyError& e) {
      key_error(e.what());
    } catch (const ShapeError& e) {
      shape_error(e.what());
    } catch (const DeviceUnavailable& e) {  // before UsageError, its base
      device_unavailable(e.what());
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
    } catch (const DeviceError& e) {
      device_error(e.what());
    } catch (const Error& e) {  // any other pskv error: its base class, not RuntimeError
      error(e.what());
    }
  });
}

void BindData(py::module_& m) {
  py::module_ d = m.def_submodule("data");
  d.def("partition_range", &data::PartitionRange);
  d.def("epoch_size", &data::EpochSize);
  d.def("epoch_order", &data::EpochOrder);
  d.def("split_batch", &data::SplitBatch);
  d.def("split_by_workload", &data::SplitByWorkload);
}

}  // namespace pskv::binding

PYBIND11_MODULE(_pskv, m) {
  using namespace pskv::binding;
  m.doc() = "pskv core (C++); use the pskv package";
  BindErrors(m);
  BindProcess(m);
  BindArrays(m);
  BindKVStore(m);
  BindOptimizer(m);
  pskv::BindTrainerPolicy(m);
  BindData(m);
}
