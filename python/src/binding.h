// The parts of the _pskv module (python/src): each binds one concern and is called
// once from the module's initialisation (module.cc).
//
// Memory: numpy arrays are wrapped without copying. Synchronous calls (init, the
// optimizer) let the NDArray hold a reference to the numpy object, released under
// the GIL. Asynchronous calls (push, pull, pushpull) never need the GIL on pskv's
// threads: the store's Handle keeps the numpy objects in an InFlight entry, the
// NDArrays share a token whose last copy marks the entry done (an atomic store),
// and the references are dropped by the next binding call on a Python thread
// (Handle::Sweep), or by close. Blocking calls release the GIL.
#pragma once

#include <pybind11/pybind11.h>

namespace pskv::binding {

namespace py = pybind11;

/// pskv's exceptions, same names, hierarchy and messages as C++ (module.cc).
void BindErrors(py::module_& m);
/// The process: its role, the server role, the environment table, the process-wide
/// settings a program makes (process_bindings.cc).
void BindProcess(py::module_& m);
/// DeviceArray (pskv.DeviceArray: arrays on devices) and the device runtime's
/// functions, as submodule `cuda` (arrays.cc).
void BindArrays(py::module_& m);
/// The store: KVStore and the results of its calls (kvstore_bindings.cc).
void BindKVStore(py::module_& m);
/// Dynamic embedding tables of a store (embedding_bindings.cc).
void BindEmbedding(py::module_& m);
/// Optimizer and the optimizer-states files (optimizer_bindings.cc).
void BindOptimizer(py::module_& m);
/// The data-parallel helpers of include/pskv/data.h, as submodule `data` (module.cc).
void BindData(py::module_& m);

}  // namespace pskv::binding

namespace pskv {
/// The Trainer semantics of include/pskv/trainer_policy.h (trainer_policy.cc).
void BindTrainerPolicy(pybind11::module_& parent);
}  // namespace pskv
