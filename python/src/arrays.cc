#include "arrays.h"

#include <pybind11/stl.h>

#include <cctype>
#include <cstring>
#include <limits>
#include <string>

#include "pskv/device.h"
#include "pskv/error.h"

namespace pskv::binding {

DType FromNumpy(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  // Bytes are read in this machine's order: a byte-swapped array would be misread.
  if (size > 1 && !dt.attr("isnative").cast<bool>())
    throw InvalidArgument("array of non-native byte order (" + dt.attr("str").cast<std::string>() +
                          "): convert it first, e.g. a.astype(a.dtype.newbyteorder('=')) (an "
                          "output: read the result from the converted array)");
  if (kind == 'f' && size == 4) return DType::kFloat32;
  if (kind == 'f' && size == 8) return DType::kFloat64;
  if (kind == 'f' && size == 2) return DType::kFloat16;
  if (kind == 'i' && size == 4) return DType::kInt32;
  if (kind == 'i' && size == 8) return DType::kInt64;
  if (kind == 'i' && size == 1) return DType::kInt8;
  if (kind == 'u' && size == 1) return DType::kUInt8;
  throw InvalidArgument("unsupported numpy dtype " + py::cast<std::string>(dt.attr("name")) +
                        "; use float32, float64, float16, int32, int64, int8 or uint8");
}

py::dtype ToNumpy(DType t) {
  switch (t) {
    case DType::kFloat32:
      return py::dtype::of<float>();
    case DType::kFloat64:
      return py::dtype::of<double>();
    case DType::kFloat16:
      return py::dtype("float16");
    case DType::kInt32:
      return py::dtype::of<int32_t>();
    case DType::kInt64:
      return py::dtype::of<int64_t>();
    case DType::kInt8:
      return py::dtype::of<int8_t>();
    case DType::kUInt8:
      return py::dtype::of<uint8_t>();
    case DType::kBFloat16:
      break;
  }
  throw InvalidArgument("bfloat16 has no numpy dtype");
}

NDArray Wrap(const py::array& a, bool writable, std::vector<py::object>* refs,
             const std::shared_ptr<void>& token) {
  if (!(a.flags() & py::array::c_style))
    throw InvalidArgument("arrays must be C-contiguous (use numpy.ascontiguousarray)");
  if (writable && !a.writeable())
    throw InvalidArgument(
        "an output array is read-only (numpy flags.writeable is False, e.g. np.frombuffer of "
        "bytes): pass a writable array and read the result from that array (a copy made now "
        "receives the result, the original does not)");
  Shape shape(a.shape(), a.shape() + a.ndim());
  std::shared_ptr<void> keep = token;
  if (refs) {
    refs->push_back(a);
  } else {
    auto* ref = new py::object(a);
    keep = std::shared_ptr<void>(ref, [](py::object* o) { ReleaseUnderGil(o); });
  }
  return NDArray::Wrap(const_cast<void*>(a.data()), shape, FromNumpy(a.dtype()), keep);
}

std::vector<NDArray> WrapAll(const std::vector<py::array>& v, bool writable,
                             std::vector<py::object>* refs, const std::shared_ptr<void>& token) {
  std::vector<NDArray> out;
  out.reserve(v.size());
  for (auto& a : v) out.push_back(Wrap(a, writable, refs, token));
  return out;
}

py::array View(const NDArray& a) {
  std::vector<py::ssize_t> shape(a.shape().begin(), a.shape().end());
  if (a.is_view()) return py::array(ToNumpy(a.dtype()), shape, a.raw());  // copies
  auto* keep = new NDArray(a);
  py::capsule owner(keep, [](void* p) { delete static_cast<NDArray*>(p); });
  return py::array(ToNumpy(a.dtype()), shape, a.raw(), owner);
}

NDArray RowIds(const py::array& a) {
  const py::dtype dt = a.dtype();
  const char kind = dt.kind();
  if (a.size() > 0 && kind != 'i' && kind != 'u')
    throw InvalidArgument("row ids must be of an integer dtype, got " +
                          py::cast<std::string>(dt.attr("name")) +
                          ": convert them first, e.g. ids.astype(np.int64) (floats are not "
                          "truncated silently)");
  py::array_t<int64_t, py::array::c_style | py::array::forcecast> ids;
  if (kind == 'u' && dt.itemsize() == 8 && a.size() > 0) {
    auto u = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    if (!u) throw InvalidArgument("row ids could not be read as uint64");
    const uint64_t* p = u.data();
    for (py::ssize_t i = 0; i < u.size(); ++i)
      if (p[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw KeyError("row id " + std::to_string(p[i]) +
                       " is out of range: row ids are below 2^63");
  }
  ids = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!ids) throw InvalidArgument("row ids could not be read as int64");
  NDArray out(Shape{static_cast<int64_t>(ids.size())}, DType::kInt64);
  if (ids.size()) std::memcpy(out.raw(), ids.data(), out.nbytes());
  return out;
}

namespace {

std::string TypeName(const py::handle& o) {
  return py::str(py::type::handle_of(o).attr("__name__")).cast<std::string>();
}

// A device given as "cuda:1", "gpu:1", MXNet's "gpu(1)" / "cpu(0)", or anything whose
// str() is one of them (a torch.device).
Device DeviceOf(const py::handle& d) {
  std::string s = py::str(d).cast<std::string>();
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* kind : {"gpu(", "cuda(", "cpu("}) {
    const std::string k(kind);
    if (s.rfind(k, 0) == 0 && s.size() > k.size() + 1 && s.back() == ')') {
      const std::string id = s.substr(k.size(), s.size() - k.size() - 1);
      s = k == "cpu(" ? (id == "0" ? "cpu" : s) : k.substr(0, k.size() - 1) + ":" + id;
      break;
    }
  }
  return ParseDevice(s);
}

// Throws DeviceUnavailable unless `d` is a usable device here (the NDArray functions
// check it too, but only at the first copy; a wrapped array is checked at once).
void RequireDevice(const Device& d) {
  if (!d.is_cuda()) return;
  const int n = cuda::DeviceCount();
  if (d.id < 0 || d.id >= n)
    throw DeviceUnavailable(
        "device " + d.str() + " does not exist: " + cuda::Status() +
        (n > 0 ? " (use cuda:0.." + std::to_string(n - 1) + ", or more simulated devices)"
               : " (without a GPU, simulate k devices: PSKV_SIM_DEVICES=k)"));
}

// __cuda_array_interface__'s typestr -> DType (little-endian machine).
DType FromTypestr(const std::string& t) {
  const char* kValid = "<f4, <f8, <f2, <i4, <i8, |i1, |u1";
  const bool one_byte = t.size() == 3 && t[2] == '1';
  const bool native = !t.empty() && (t[0] == '<' || t[0] == '=' || t[0] == '|');
  if (t.size() >= 3 && (native || (one_byte && t[0] == '>'))) {
    const std::string k = t.substr(1);
    if (k == "f4") return DType::kFloat32;
    if (k == "f8") return DType::kFloat64;
    if (k == "f2") return DType::kFloat16;
    if (k == "i4") return DType::kInt32;
    if (k == "i8") return DType::kInt64;
    if (k == "i1") return DType::kInt8;
    if (k == "u1") return DType::kUInt8;
  }
  throw InvalidArgument("__cuda_array_interface__ typestr '" + t + "' is not one pskv reads (" +
                        kValid + "): convert the array first, e.g. x.astype('float32')");
}

std::string Typestr(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat64:
      return "<f8";
    case DType::kFloat16:
      return "<f2";
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
    case DType::kInt8:
      return "|i1";
    case DType::kUInt8:
      return "|u1";
    case DType::kBFloat16:
      break;
  }
  throw InvalidArgument("bfloat16 has no __cuda_array_interface__ typestr");
}

py::tuple ShapeTuple(const Shape& s) {
  py::tuple t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = py::int_(s[i]);
  return t;
}

// Host memory of a numpy array (any layout: a copy is made anyway) as a C-contiguous
// array of `dtype` (None: its own).
py::array HostArray(const py::object& data, const py::object& dtype) {
  return py::module_::import("numpy").attr("ascontiguousarray")(data, dtype);
}

std::string Describe(const DeviceArray& d) {
  std::string shape = "(";
  for (size_t i = 0; i < d.a.shape().size(); ++i)
    shape += (i ? ", " : "") + std::to_string(d.a.shape()[i]);
  shape += d.a.shape().size() == 1 ? ",)" : ")";
  std::string r = "DeviceArray(shape=" + shape + ", dtype=" + DTypeName(d.a.dtype()) +
                  ", device='" + d.a.device().str() + "'";
  if (d.a.device().type != Device::Type::kCPU && cuda::Simulated()) r += ", simulated";
  if (d.a.is_view()) r += ", view";
  return r + ")";
}

// A value that is not a numpy array: a DeviceArray, or a TypeError.
const DeviceArray& AsDeviceArray(const py::object& v) {
  if (!py::isinstance<DeviceArray>(v))
    throw py::type_error("values must be numpy arrays or pskv.DeviceArray, got " + TypeName(v));
  return v.cast<const DeviceArray&>();
}

}  // namespace

DeviceArray FromCudaArrayInterface(const py::object& obj, std::optional<Device> device) {
  if (!py::hasattr(obj, "__cuda_array_interface__"))
    throw py::type_error("a " + TypeName(obj) +
                         " has no __cuda_array_interface__: pskv takes numpy arrays, torch CPU "
                         "tensors, pskv.DeviceArray, and device arrays that expose "
                         "__cuda_array_interface__");
  const py::object iface = obj.attr("__cuda_array_interface__");
  if (!py::isinstance<py::dict>(iface))
    throw InvalidArgument("__cuda_array_interface__ of a " + TypeName(obj) + " is not a dict");
  const auto d = py::reinterpret_borrow<py::dict>(iface);
  for (const char* key : {"shape", "typestr", "data", "version"})
    if (!d.contains(key))
      throw InvalidArgument(std::string("__cuda_array_interface__ of a ") + TypeName(obj) +
                            " lacks '" + key + "' (pskv reads versions 2 and 3)");
  const int version = d["version"].cast<int>();
  if (version < 2)
    throw InvalidArgument("__cuda_array_interface__ version " + std::to_string(version) +
                          ": pskv reads versions 2 and 3 (upgrade the producing library)");
  const Shape shape = d["shape"].cast<Shape>();
  const DType dtype = FromTypestr(d["typestr"].cast<std::string>());
  const auto data = d["data"].cast<py::tuple>();
  if (data.size() != 2)
    throw InvalidArgument("__cuda_array_interface__['data'] must be (pointer, read_only)");
  const auto ptr = data[0].cast<uintptr_t>();
  const bool readonly = data[1].cast<bool>();
  if (d.contains("mask") && !d["mask"].is_none())
    throw InvalidArgument(
        "__cuda_array_interface__ with a mask: pskv takes dense arrays only "
        "(fill the masked elements and pass the array without a mask)");
  if (d.contains("strides") && !d["strides"].is_none()) {
    const auto strides = d["strides"].cast<std::vector<int64_t>>();
    bool contiguous = strides.size() == shape.size();
    int64_t expect = static_cast<int64_t>(DTypeSize(dtype));
    for (size_t i = shape.size(); contiguous && i-- > 0;) {
      if (shape[i] == 0) break;  // no elements: any strides describe it
      if (shape[i] != 1 && strides[i] != expect) contiguous = false;
      expect *= shape[i];
    }
    if (!contiguous)
      throw InvalidArgument("a non-contiguous device array (__cuda_array_interface__ strides " +
                            py::str(d["strides"]).cast<std::string>() + ", shape " +
                            ShapeToString(shape) +
                            "): pass a C-contiguous one (x.contiguous() in torch, "
                            "cupy.ascontiguousarray(x)); pskv does not copy it for you");
  }
  void* stream = nullptr;
  if (d.contains("stream") && !d["stream"].is_none()) {
    const auto s = d["stream"].cast<uintptr_t>();
    if (s == 0)
      throw InvalidArgument(
          "__cuda_array_interface__ stream 0 is ambiguous and disallowed by "
          "the interface (version 3): give 1 for the legacy default stream, "
          "2 for the per-thread one, or None");
    stream = reinterpret_cast<void*>(s);
  }
  Device dev;
  if (device) {
    dev = *device;
  } else if (py::hasattr(obj, "__dlpack_device__")) {
    const auto t = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
    if (t.first != 2)
      throw InvalidArgument("a " + TypeName(obj) + " with __dlpack_device__() == (" +
                            std::to_string(t.first) + ", " + std::to_string(t.second) +
                            "): pskv wraps CUDA memory (kDLCUDA = 2) this way; pass host arrays "
                            "as numpy arrays");
    dev = Device::CUDA(t.second);
  } else {
    throw InvalidArgument("a " + TypeName(obj) +
                          " exposes __cuda_array_interface__ but no __dlpack_device__(), so its "
                          "device is unknown: wrap it with pskv.DeviceArray.wrap(x, "
                          "device='cuda:N')");
  }
  if (!dev.is_cuda())
    throw InvalidArgument("__cuda_array_interface__ describes CUDA memory; device " + dev.str() +
                          " is not a CUDA device");
  RequireDevice(dev);
  auto* ref = new py::object(obj);
  std::shared_ptr<void> keep(ref, [](py::object* o) { ReleaseUnderGil(o); });
  return DeviceArray{
      NDArray::Wrap(reinterpret_cast<void*>(ptr), shape, dtype, std::move(keep), dev, stream),
      readonly};
}

NDArray WrapValue(const py::object& v, bool writable, std::vector<py::object>* refs,
                  const std::shared_ptr<void>& token) {
  if (py::isinstance<py::array>(v))
    return Wrap(py::reinterpret_borrow<py::array>(v), writable, refs, token);
  const DeviceArray& d = AsDeviceArray(v);
  if (writable && d.readonly)
    throw InvalidArgument(
        "an output device array is read-only (its producer's "
        "__cuda_array_interface__ says so): pull into a writable array");
  if (!refs) return d.a;
  refs->push_back(v);  // keeps the memory; pskv's copies share the call's token only
  return NDArray::Wrap(d.a.raw(), d.a.shape(), d.a.dtype(), token, d.a.device(),
                       d.a.ready_stream());
}

std::vector<NDArray> WrapValues(const std::vector<py::object>& v, bool writable,
                                std::vector<py::object>* refs, const std::shared_ptr<void>& token) {
  std::vector<NDArray> out;
  out.reserve(v.size());
  for (auto& a : v) out.push_back(WrapValue(a, writable, refs, token));
  return out;
}

std::pair<uintptr_t, uintptr_t> ValueBytes(const py::object& v) {
  if (py::isinstance<py::array>(v)) {
    const auto a = py::reinterpret_borrow<py::array>(v);
    const auto start = reinterpret_cast<uintptr_t>(a.data());
    return {start, start + static_cast<uintptr_t>(a.nbytes())};
  }
  const DeviceArray& d = AsDeviceArray(v);
  const auto start = reinterpret_cast<uintptr_t>(d.a.raw());
  return {start, start + d.a.nbytes()};
}

void BindArrays(py::module_& m) {
  py::class_<DeviceArray>(m, "DeviceArray", R"(An array on a device: cuda:N (a GPU, or a
simulated device), or pinned host memory (cpu_pinned).

It owns its memory (made from host data, or zeros) or views a device array of another
library given through __cuda_array_interface__ (wrap). The store's push, pull, pushpull
and init take it in their value lists; it stays alive while a call uses it. Its memory
is never read by the host behind your back: asnumpy() is an explicit copy.

Parameters
----------
data : array_like
    Host data (numpy array, torch CPU tensor, list), copied to `device`; a DeviceArray
    is copied from its device.
device : str
    'cuda:N', 'gpu:N', MXNet's 'gpu(N)', 'cuda', 'cpu_pinned' or 'cpu'.
dtype : str or numpy.dtype, optional
    Convert to this dtype first (default: the data's).

Raises
------
pskv.DeviceUnavailable
    No such device here (pskv.cuda.status() says what there is).
)")
      .def(py::init([](const py::object& data, const py::object& device, const py::object& dtype) {
             const Device dev = DeviceOf(device);
             if (py::isinstance<DeviceArray>(data)) {
               const NDArray src = data.cast<const DeviceArray&>().a;
               if (!dtype.is_none() && FromNumpy(py::dtype::from_args(dtype)) != src.dtype())
                 throw InvalidArgument(
                     "DeviceArray(DeviceArray, dtype=...): converting on a "
                     "device is not offered; convert the host data first");
               RequireDevice(dev);
               py::gil_scoped_release nogil;
               return DeviceArray{src.To(dev)};
             }
             const py::array host = HostArray(data, dtype);
             const NDArray view = NDArray::Wrap(const_cast<void*>(host.data()),
                                                Shape(host.shape(), host.shape() + host.ndim()),
                                                FromNumpy(host.dtype()));
             RequireDevice(dev);
             py::gil_scoped_release nogil;  // `host` stays referenced by this frame
             return DeviceArray{view.To(dev)};
           }),
           py::arg("data"), py::arg("device"), py::arg("dtype") = py::none())
      .def_static(
          "zeros",
          [](const Shape& shape, const py::object& dtype, const py::object& device) {
            const Device dev = DeviceOf(device);
            RequireDevice(dev);
            return DeviceArray{NDArray(shape, FromNumpy(py::dtype::from_args(dtype)), dev)};
          },
          py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cuda:0",
          R"(A zero-filled array on a device (e.g. a pull's output).

Parameters
----------
shape : sequence of int
    The shape.
dtype : str or numpy.dtype, optional
    The element type (float32 by default).
device : str, optional
    The device (cuda:0 by default).

Returns
-------
DeviceArray
)")
      .def_static(
          "wrap",
          [](const py::object& obj, const py::object& device) {
            return FromCudaArrayInterface(
                obj, device.is_none() ? std::nullopt : std::optional<Device>(DeviceOf(device)));
          },
          py::arg("obj"), py::arg("device") = py::none(),
          R"(A view of another library's device array, without copying.

`obj` exposes __cuda_array_interface__ (version 2 or 3: C-contiguous, typestr <f4, <f8,
<f2, <i4, <i8, |i1 or |u1, no mask); its `stream`, when given, is where the data is
produced: pskv waits for it before reading or writing. The view keeps `obj` alive.

Parameters
----------
obj : object
    The device array.
device : str, optional
    Its device, when `obj` has no __dlpack_device__() (which must give (2, N): CUDA).

Returns
-------
DeviceArray

Raises
------
pskv.InvalidArgument
    Non-contiguous, an unknown typestr, a mask, or no way to tell the device.
pskv.DeviceUnavailable
    The device does not exist here.
)")
      .def(
          "asnumpy",
          [](const DeviceArray& d) {
            NDArray host;
            {
              py::gil_scoped_release nogil;
              host = d.a.To(Device::CPU());
            }
            return View(host);
          },
          "A host copy as a numpy array (waits for the array's producer first).\n\n"
          "Returns\n-------\nnumpy.ndarray\n")
      .def(
          "numpy",
          [](const DeviceArray& d) {
            NDArray host;
            {
              py::gil_scoped_release nogil;
              host = d.a.To(Device::CPU());
            }
            return View(host);
          },
          "The same as asnumpy() (torch's name).\n\nReturns\n-------\nnumpy.ndarray\n")
      .def(
          "to",
          [](const DeviceArray& d, const py::object& device) {
            const Device dev = DeviceOf(device);
            RequireDevice(dev);
            py::gil_scoped_release nogil;
            return DeviceArray{d.a.To(dev)};
          },
          py::arg("device"),
          "A copy on `device` (synchronous).\n\nParameters\n----------\ndevice : str\n    The "
          "device.\n\nReturns\n-------\nDeviceArray\n")
      .def_property_readonly(
          "device", [](const DeviceArray& d) { return d.a.device().str(); },
          "'cuda:1', 'cpu_pinned' or 'cpu'.")
      .def_property_readonly(
          "shape", [](const DeviceArray& d) { return ShapeTuple(d.a.shape()); },
          "The shape (a tuple).")
      .def_property_readonly(
          "dtype",
          [](const DeviceArray& d) -> py::object {
            if (d.a.dtype() == DType::kBFloat16) return py::str("bfloat16");
            return ToNumpy(d.a.dtype());
          },
          "The element type (a numpy dtype).")
      .def_property_readonly(
          "size", [](const DeviceArray& d) { return d.a.size(); }, "The number of elements.")
      .def_property_readonly(
          "ndim", [](const DeviceArray& d) { return d.a.shape().size(); },
          "The number of dimensions.")
      .def_property_readonly(
          "nbytes", [](const DeviceArray& d) { return d.a.nbytes(); }, "The size in bytes.")
      .def_property_readonly(
          "__cuda_array_interface__",
          [](const DeviceArray& d) {
            if (!d.a.device().is_cuda())
              throw py::attribute_error("a DeviceArray on " + d.a.device().str() +
                                        " is host memory: it has no __cuda_array_interface__ "
                                        "(read it with asnumpy())");
            py::dict i;
            i["shape"] = ShapeTuple(d.a.shape());
            i["typestr"] = Typestr(d.a.dtype());
            i["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(d.a.raw()), d.readonly);
            i["strides"] = py::none();
            i["version"] = 3;
            // Made by pskv: complete when made (To is synchronous); a view passes on
            // its producer's stream.
            i["stream"] =
                d.a.ready_stream()
                    ? py::object(py::int_(reinterpret_cast<uintptr_t>(d.a.ready_stream())))
                    : py::object(py::none());
            return i;
          },
          "CUDA's array interface (version 3), for libraries that take device arrays.")
      .def(
          "__dlpack_device__",
          [](const DeviceArray& d) {
            const Device dev = d.a.device();
            const int type = dev.is_cuda() ? 2 : dev.type == Device::Type::kCUDAHost ? 3 : 1;
            return py::make_tuple(type, dev.is_cuda() ? dev.id : 0);
          },
          "DLPack's (device type, id): (2, N) for cuda:N, (3, 0) pinned, (1, 0) cpu.")
      .def("__array__",
           [](const DeviceArray& d, py::args, py::kwargs) -> py::object {
             throw UsageError("a DeviceArray on " + d.a.device().str() +
                              " is not converted to numpy implicitly: call .asnumpy() (a "
                              "host copy)");
           })
      .def("__repr__", &Describe);

  py::module_ c = m.def_submodule("cuda", "pskv's device runtime (include/pskv/device.h)");
  c.def("built", &cuda::Built);
  c.def("initialized", &cuda::Initialized);
  c.def("device_count", &cuda::DeviceCount);
  c.def("status", &cuda::Status);
  c.def("simulated", &cuda::Simulated);
  c.def("use_simulated_devices", &cuda::UseSimulatedDevices, py::arg("devices"),
        py::arg("jitter_seed") = 0);
  c.def("device_name", &cuda::DeviceName);
  c.def("stats", [] {
    const cuda::Counters s = cuda::Stats();
    py::dict d;
    d["d2h_bytes"] = s.d2h_bytes;
    d["d2h_count"] = s.d2h_count;
    d["h2d_bytes"] = s.h2d_bytes;
    d["h2d_count"] = s.h2d_count;
    d["d2d_bytes"] = s.d2d_bytes;
    d["d2d_count"] = s.d2d_count;
    d["peer_bytes"] = s.peer_bytes;
    d["peer_count"] = s.peer_count;
    d["kernel_launches"] = s.kernel_launches;
    return d;
  });
  c.def("reset_stats", &cuda::ResetStats);
}

}  // namespace pskv::binding
