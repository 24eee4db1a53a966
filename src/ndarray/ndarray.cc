#include "pskv/ndarray.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/dtype_dispatch.h"
#include "common/float16_bits.h"
#include "device/runtime.h"
#include "pskv/error.h"

namespace pskv {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUInt8:
    case DType::kInt8:
      return 1;
  }
  throw InvalidArgument("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

std::string DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
  }
  return "dtype(" + std::to_string(static_cast<int>(t)) + ")";
}

DType ParseDType(const std::string& name) {
  static const std::pair<const char*, DType> kNames[] = {
      {"float32", DType::kFloat32},   {"float", DType::kFloat32},  {"fp32", DType::kFloat32},
      {"float64", DType::kFloat64},   {"double", DType::kFloat64}, {"fp64", DType::kFloat64},
      {"float16", DType::kFloat16},   {"half", DType::kFloat16},   {"fp16", DType::kFloat16},
      {"bfloat16", DType::kBFloat16}, {"bf16", DType::kBFloat16},  {"int32", DType::kInt32},
      {"int64", DType::kInt64},       {"int8", DType::kInt8},      {"uint8", DType::kUInt8}};
  for (auto& [n, t] : kNames)
    if (name == n) return t;
  throw InvalidArgument("unknown dtype '" + name +
                        "'; valid: float32, float64, float16, bfloat16, int32, int64, int8, uint8");
}

bool IsValidDType(int code) {
  switch (code) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 4:
    case 5:
    case 6:
    case 12:
      return true;
    default:
      return false;
  }
}

bool IsLowPrecision(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16;
}

namespace {
// The product of the nonzero dimensions of `s` (checked): bounds every partial
// product (row sizes, the elements of any slice along the first axis).
int64_t NonzeroProduct(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) throw ShapeError("negative dimension in shape " + ShapeToString(s));
    if (d != 0 && __builtin_mul_overflow(n, d, &n))
      throw ShapeError("shape " + ShapeToString(s) +
                       " has more elements than a 64-bit count holds: check the shape");
  }
  return n;
}
}  // namespace

int64_t NumElements(const Shape& s) {
  const int64_t n = NonzeroProduct(s);
  for (int64_t d : s)
    if (d == 0) return 0;
  return n;
}

size_t NumBytes(const Shape& s, DType t) {
  const auto es = static_cast<int64_t>(DTypeSize(t));
  int64_t bytes;
  if (__builtin_mul_overflow(NonzeroProduct(s), es, &bytes))
    throw ShapeError("shape " + ShapeToString(s) + " of " + DTypeName(t) +
                     " takes more than 2^63 bytes: check the shape");
  return NumElements(s) == 0 ? 0 : static_cast<size_t>(bytes);
}

std::string ShapeToString(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  if (s.size() == 1) os << ",";
  os << ")";
  return os.str();
}

float HalfToFloat(uint16_t h) {
  return fp16::HalfToFloat(h);
}

uint16_t FloatToHalf(float f) {
  return fp16::FloatToHalf(f);
}

uint16_t FloatToBFloat16(float f) {
  return fp16::FloatToBFloat16(f);
}

namespace {
struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
}  // namespace

NDArray::NDArray(Shape shape, DType dtype) : shape_(std::move(shape)), dtype_(dtype) {
  const size_t bytes = NumBytes(shape_, dtype_);  // checked: below 2^63, so rounding up fits
  size_ = NumElements(shape_);
  owning_ = true;
  size_t alloc = (bytes + 63) / 64 * 64;
  if (alloc == 0) alloc = 64;
  void* p = std::aligned_alloc(64, alloc);
  if (!p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, alloc);
  holder_ = std::shared_ptr<void>(p, AlignedFree());
  data_ = p;
}

NDArray::NDArray(Shape shape, DType dtype, Device device) : NDArray() {
  if (device.type == Device::Type::kCPU) {
    *this = NDArray(std::move(shape), dtype);
    return;
  }
  if (device.type != Device::Type::kCUDA && device.type != Device::Type::kCUDAHost)
    throw InvalidArgument("unknown device type " + std::to_string(static_cast<int>(device.type)));
  const size_t bytes = NumBytes(shape, dtype);
  shape_ = std::move(shape);
  size_ = NumElements(shape_);
  dtype_ = dtype;
  device_ = device;
  owning_ = true;
  if (device.is_cuda()) {
    const int id = device.id;
    data_ = cuda::DeviceAlloc(id, bytes);
    holder_ = std::shared_ptr<void>(data_, [id](void* p) {
      try {
        cuda::DeviceFree(id, p);
      } catch (...) {  // a deleter must not throw; the device is unusable by now anyway
      }
    });
    auto s = cuda::GetStream(id, cuda::StreamKind::kCompute);
    cuda::Fill(this, 0.0, s);
    cuda::StreamSync(s);
  } else {
    data_ = cuda::PinnedAlloc(bytes);
    holder_ = std::shared_ptr<void>(data_, [bytes](void* p) { cuda::PinnedFree(p, bytes); });
    if (bytes) std::memset(data_, 0, bytes);
  }
}

NDArray NDArray::Wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> keepalive) {
  return Wrap(data, std::move(shape), dtype, std::move(keepalive), Device::CPU());
}

NDArray NDArray::Wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> keepalive,
                      Device device, void* ready_stream) {
  if (device.type != Device::Type::kCPU && device.type != Device::Type::kCUDA &&
      device.type != Device::Type::kCUDAHost)
    throw InvalidArgument("unknown device type " + std::to_string(static_cast<int>(device.type)));
  if (device.id < 0) throw InvalidArgument("negative device ordinal in " + device.str());
  NDArray a;
  a.device_ = device;
  a.ready_stream_ = ready_stream;
  NumBytes(shape, dtype);  // validates the dtype; the bytes fit (offsets cannot wrap)
  a.shape_ = std::move(shape);
  a.size_ = NumElements(a.shape_);
  a.dtype_ = dtype;
  if (data == nullptr && a.size_ != 0) throw InvalidArgument("NDArray::Wrap of a null pointer");
  a.data_ = data;
  a.holder_ = std::move(keepalive);
  a.owning_ = false;
  return a;
}

NDArray NDArray::FromVector(const std::vector<float>& v, Shape shape) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  NDArray a(shape, DType::kFloat32);
  if (a.size() != static_cast<int64_t>(v.size()))
    throw ShapeError("FromVector: " + std::to_string(v.size()) + " values for shape " +
                     ShapeToString(shape));
  std::memcpy(a.data_, v.data(), v.size() * sizeof(float));
  return a;
}

void NDArray::RequireHost(const char* op) const {
  if (device_.host_accessible()) return;
  throw UsageError(std::string("NDArray::") + op + " runs on the host, but this array of shape " +
                   ShapeToString(shape_) + " is on " + device_.str() +
                   ": copy it to the host first (NDArray::To(Device::CPU()))");
}

NDArray NDArray::To(Device device) const {
  NDArray out(shape_, dtype_, device);
  if (size_ == 0) return out;
  if (device.host_accessible() && device_.host_accessible()) {
    std::memcpy(out.data_, data_, nbytes());
    return out;
  }
  const int id = device.is_cuda() ? device.id : device_.id;
  const auto kind = device.is_cuda() && device_.is_cuda()
                        ? cuda::StreamKind::kCompute
                        : (device.is_cuda() ? cuda::StreamKind::kH2D : cuda::StreamKind::kD2H);
  auto s = cuda::GetStream(id, kind);
  cuda::WaitStream(id, s, ready_stream_);
  cuda::CopyAsync(out.data_, device, data_, device_, nbytes(), s);
  cuda::StreamSync(s);
  return out;
}

NDArray NDArray::Clone() const {
  RequireHost("Clone");
  NDArray c(shape_, dtype_);
  if (size_) std::memcpy(c.data_, data_, nbytes());
  return c;
}

void NDArray::CopyFrom(const NDArray& src, bool allow_reshape) {
  RequireHost("CopyFrom");
  src.RequireHost("CopyFrom");
  if (src.size_ != size_ || (!allow_reshape && src.shape_ != shape_)) {
    throw ShapeError("cannot copy an array of shape " + ShapeToString(src.shape_) +
                     " into one of shape " + ShapeToString(shape_));
  }
  if (src.data_ == data_ && src.dtype_ == dtype_) return;
  if (src.dtype_ == dtype_) {
    if (size_) std::memmove(data_, src.data_, nbytes());
    return;
  }
  ConvertElements(src.data_, src.dtype_, data_, dtype_, size_);
}

NDArray NDArray::AsType(DType dtype) const {
  RequireHost("AsType");
  NDArray c(shape_, dtype);
  c.CopyFrom(*this);
  return c;
}

void NDArray::Fill(double v) {
  RequireHost("Fill");
  DispatchDType(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(data_);
    T val = FromDouble<T>(v);
    for (int64_t i = 0; i < size_; ++i) p[i] = val;
  });
}

double NDArray::At(int64_t i) const {
  RequireHost("At");
  if (i < 0 || i >= size_) throw InvalidArgument("index " + std::to_string(i) + " out of range");
  double out = 0;
  DispatchDType(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    out = ToDouble(static_cast<const T*>(data_)[i]);
  });
  return out;
}

std::vector<double> NDArray::ToDoubles() const {
  RequireHost("ToDoubles");
  std::vector<double> v(static_cast<size_t>(size_));
  DispatchDType(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(data_);
    for (int64_t i = 0; i < size_; ++i) v[static_cast<size_t>(i)] = ToDouble(p[i]);
  });
  return v;
}

NDArray NDArray::Slice1D(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || count > size_ - begin)
    throw InvalidArgument("slice of " + std::to_string(count) + " elements from " +
                          std::to_string(begin) + " is out of range for " + std::to_string(size_) +
                          " elements");
  NDArray s = *this;
  s.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin) * DTypeSize(dtype_);
  s.shape_ = {count};
  s.size_ = count;
  s.owning_ = false;
  return s;
}

NDArray NDArray::Reshape(Shape shape) const {
  if (NumElements(shape) != size_)
    throw ShapeError("cannot reshape " + ShapeToString(shape_) + " to " + ShapeToString(shape));
  NDArray s = *this;
  s.shape_ = std::move(shape);
  return s;
}

}  // namespace pskv
