// numpy arrays and device arrays <-> pskv arrays: dtypes, zero-copy wrapping, views,
// row ids, and pskv.DeviceArray (an NDArray on a device, or a view of a foreign device
// array given through __cuda_array_interface__).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
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

// pskv.DeviceArray: an array on a device (kCUDA, or pinned host memory), immutable
// as a handle. `a` owns its memory (made from numpy, or zeros) or views a foreign
// array (its keepalive holds the producer object). `readonly`: the producer said so
// (__cuda_array_interface__'s data[1]): refused as an output.
struct DeviceArray {
  NDArray a;
  bool readonly = false;
};

// A foreign device array as an NDArray on Device::CUDA(id), without copying: `obj`
// exposes __cuda_array_interface__ (version 2 or later: C-contiguous, a known
// typestr, no mask; its `stream`, if any, becomes the ready stream) and
// __dlpack_device__() == (2, id), unless `device` is given. The NDArray keeps `obj`.
DeviceArray FromCudaArrayInterface(const py::object& obj, std::optional<Device> device);

// Values of the store's calls: numpy arrays or DeviceArray objects (TypeError
// otherwise). A numpy array is wrapped as Wrap does; a DeviceArray's NDArray is
// re-wrapped to share `token` (its object then held in `refs`) when one is given, so
// that pskv's threads never hold a Python reference.
NDArray WrapValue(const py::object& v, bool writable = false,
                  std::vector<py::object>* refs = nullptr,
                  const std::shared_ptr<void>& token = nullptr);
std::vector<NDArray> WrapValues(const std::vector<py::object>& v, bool writable = false,
                                std::vector<py::object>* refs = nullptr,
                                const std::shared_ptr<void>& token = nullptr);
// The bytes a value spans: host addresses for numpy arrays, device addresses for
// device arrays (CUDA's unified virtual addressing, and the simulator, give every
// allocation of a process one address range, so the two never overlap by accident).
std::pair<uintptr_t, uintptr_t> ValueBytes(const py::object& v);

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
