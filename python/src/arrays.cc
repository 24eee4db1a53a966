#include "arrays.h"

#include <cstring>
#include <limits>
#include <string>

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

}  // namespace pskv::binding
