// _pskv: the Python binding of the C++ core. The Python package (python/pskv)
// gives it MXNet's `mx.kv` shape; this module stays thin: flat lists of keys and
// numpy arrays in, C++ calls out. One file per concern (binding.h lists them).
//
// Importing it changes no process-wide setting: the allocator and the logging and
// metrics are the program's (pskv.configure_process, python/pskv/process.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <cstring>
#include <string>

#include "binding.h"
#include "pskv/data.h"
#include "pskv/device.h"
#include "pskv/error.h"

namespace pskv::binding {

namespace {

// The C++ method names that messages of the core use, and the Python names of the
// same calls: a message raised through Python names what a Python caller calls.
struct Rename {
  const char* cpp;
  const char* py;
};
constexpr Rename kPythonNames[] = {
    {"RowSparsePull", "row_sparse_pull"},
    {"PushPull", "pushpull"},
    {"SetOptimizer", "set_optimizer"},
    {"SetGradientCompression", "set_gradient_compression"},
    {"SetUpdater", "set_updater"},
    {"SaveOptimizerStates", "save_optimizer_states"},
    {"LoadOptimizerStates", "load_optimizer_states"},
    {"WaitAll", "wait_all"},
    {"Barrier", "barrier"},
    {"EpochPartition", "epoch_partition"},
    {"Broadcast", "broadcast"},
    {"Init", "init"},
    {"Push", "push"},
    {"Pull", "pull"},
    {"Wait", "wait"},
};

bool IdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

std::string PythonNames(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const Rename* hit = nullptr;
    // A whole word, not part of a qualified C++ name (Engine::Push, Node::Init).
    const bool starts =
        i == 0 || (!IdentChar(text[i - 1]) && (i < 2 || text.compare(i - 2, 2, "::") != 0));
    if (starts && std::isupper(static_cast<unsigned char>(text[i]))) {
      for (const Rename& r : kPythonNames) {
        const size_t n = std::strlen(r.cpp);
        if (text.compare(i, n, r.cpp) == 0 &&
            (i + n == text.size() ||
             (!IdentChar(text[i + n]) && text.compare(i + n, 2, "::") != 0))) {
          hit = &r;
          break;
        }
      }
    }
    if (hit) {
      out += hit->py;
      i += std::strlen(hit->cpp);
    } else {
      out += text[i++];
    }
  }
  return out;
}

// A pskv exception class that is also the builtin it stands for (`except KeyError:`
// catches pskv.KeyError). KeyError's own __str__ quotes its argument; pskv's messages
// are sentences, so BaseException's __str__ is kept.
PyObject* NewError(py::module_& m, const char* name, PyObject* base, PyObject* builtin) {
  py::object bases = builtin ? py::make_tuple(py::handle(base), py::handle(builtin))
                             : py::make_tuple(py::handle(base));
  py::dict ns;
  if (builtin == PyExc_KeyError) ns["__str__"] = py::handle(PyExc_BaseException).attr("__str__");
  const std::string full = m.attr("__name__").cast<std::string>() + "." + name;
  PyObject* type = PyErr_NewException(full.c_str(), bases.ptr(), ns.ptr());
  if (!type) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // the module holds a reference; the type lives on
  return type;
}

}  // namespace

void BindErrors(py::module_& m) {
  // Exceptions: the C++ hierarchy, same names; messages name the Python calls. Where a
  // builtin means the same (KeyError, TimeoutError, OSError), the class is that too.
  static PyObject* error = NewError(m, "Error", PyExc_RuntimeError, nullptr);
  static PyObject* invalid = NewError(m, "InvalidArgument", error, nullptr);
  static PyObject* key_error = NewError(m, "KeyError", error, PyExc_KeyError);
  static PyObject* shape_error = NewError(m, "ShapeError", error, nullptr);
  static PyObject* usage_error = NewError(m, "UsageError", error, nullptr);
  static PyObject* config_error = NewError(m, "ConfigError", error, nullptr);
  static PyObject* timeout_error = NewError(m, "TimeoutError", error, PyExc_TimeoutError);
  static PyObject* protocol_error = NewError(m, "ProtocolError", error, nullptr);
  static PyObject* node_failure = NewError(m, "NodeFailure", error, nullptr);
  static PyObject* io_error = NewError(m, "IOError", error, PyExc_OSError);
  static PyObject* device_unavailable = NewError(m, "DeviceUnavailable", usage_error, nullptr);
  static PyObject* device_error = NewError(m, "DeviceError", error, nullptr);
  m.def("python_names", &PythonNames, py::arg("text"),
        "A core message with the C++ method names replaced by the Python ones.");
  py::register_exception_translator([](std::exception_ptr p) {
    const auto raise = [](PyObject* type, const std::exception& e) {
      PyErr_SetString(type, PythonNames(e.what()).c_str());
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      raise(invalid, e);
    } catch (const KeyError& e) {
      raise(key_error, e);
    } catch (const ShapeError& e) {
      raise(shape_error, e);
    } catch (const DeviceUnavailable& e) {  // before UsageError, its base
      raise(device_unavailable, e);
    } catch (const UsageError& e) {
      raise(usage_error, e);
    } catch (const ConfigError& e) {
      raise(config_error, e);
    } catch (const TimeoutError& e) {
      raise(timeout_error, e);
    } catch (const ProtocolError& e) {
      raise(protocol_error, e);
    } catch (const NodeFailure& e) {
      raise(node_failure, e);
    } catch (const IOError& e) {
      raise(io_error, e);
    } catch (const DeviceError& e) {
      raise(device_error, e);
    } catch (const Error& e) {  // any other pskv error: its base class, not RuntimeError
      raise(error, e);
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
  BindEmbedding(m);
  BindOptimizer(m);
  pskv::BindTrainerPolicy(m);
  BindData(m);
}
