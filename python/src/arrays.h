// numpy arrays <-> pskv arrays: dtypes, zero-copy wrapping, views and row ids.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "pskv/ndarray.h"

namespace pskv::binding {

namespace py = pybind11;

DType FromNumpy(const py::dtype& dt);
py::dtype ToNumpy(DType t);

// Drops a Python reference from any thread. While the interpreter shuts down,
// taking the GIL from a foreign thread would end that thread (pthread_exit through
// C++ frames): the reference is leaked instead.
template <typename T>
void ReleaseUnderGil(T* o) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
  py::gil_scoped_acquire gil;
  delete o;
}

// A C-contiguous numpy array as an NDArray sharing its memory. `writable`: the
// array receives results (pull/pushpull outputs), so a read-only one is refused.
// `refs`: an asynchronous call's references (InFlight::refs), which keep the array
// (else the NDArray keeps it); `token` is then what the NDArray holds.
NDArray Wrap(const py::array& a, bool writable = false, std::vector<py::object>* refs = nullptr,
             const std::shared_ptr<void>& token = nullptr);
std::vector<NDArray> WrapAll(const std::vector<py::array>& v, bool writable = false,
                             std::vector<py::object>* refs = nullptr,
                             const std::shared_ptr<void>& token = nullptr);

// A numpy array of an NDArray's memory that stays valid for as long as Python keeps
// it (an updater may keep `stored` beyond the call, beyond close()): an owning
// NDArray is shared through a capsule holding a copy of the handle. A view (e.g. a
// pushed numpy array, whose Python object the store releases after the call) is
// copied: its memory is not the NDArray's to keep.
py::array View(const NDArray& a);

// Row ids from Python: any integer dtype (uint64 range-checked), flattened to an
// owning int64 array. Floats are refused rather than truncated (an empty array of
// any dtype is fine: np.array([]) is float64).
NDArray RowIds(const py::array& a);

}  // namespace pskv::binding
