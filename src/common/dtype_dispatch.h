// Compile-time dispatch over pskv's dtypes, and element conversions.
#pragma once

#include <cstdint>
#include <type_traits>

#include "pskv/dtype.h"
#include "pskv/error.h"

namespace pskv {

/// Storage types of the two 16-bit float formats (bit patterns).
struct half_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};

template <typename T>
struct TypeTag {
  using type = T;
};

/// Calls f(TypeTag<T>{}) with T the C++ storage type of `t`.
template <typename F>
void DispatchDType(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32:
      f(TypeTag<float>{});
      return;
    case DType::kFloat64:
      f(TypeTag<double>{});
      return;
    case DType::kFloat16:
      f(TypeTag<half_t>{});
      return;
    case DType::kBFloat16:
      f(TypeTag<bf16_t>{});
      return;
    case DType::kInt32:
      f(TypeTag<int32_t>{});
      return;
    case DType::kInt64:
      f(TypeTag<int64_t>{});
      return;
    case DType::kInt8:
      f(TypeTag<int8_t>{});
      return;
    case DType::kUInt8:
      f(TypeTag<uint8_t>{});
      return;
  }
  throw InvalidArgument("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

/// Arithmetic type used to accumulate T: float for the 16-bit floats, T otherwise.
template <typename T>
struct AccType {
  using type = T;
};
template <>
struct AccType<half_t> {
  using type = float;
};
template <>
struct AccType<bf16_t> {
  using type = float;
};

template <typename T>
inline typename AccType<T>::type Load(T v) {
  return v;
}
template <>
inline float Load<half_t>(half_t v) {
  return HalfToFloat(v.bits);
}
template <>
inline float Load<bf16_t>(bf16_t v) {
  return BFloat16ToFloat(v.bits);
}

template <typename T>
inline T Store(typename AccType<T>::type v) {
  return v;
}
template <>
inline half_t Store<half_t>(float v) {
  return half_t{FloatToHalf(v)};
}
template <>
inline bf16_t Store<bf16_t>(float v) {
  return bf16_t{FloatToBFloat16(v)};
}

template <typename T>
inline double ToDouble(T v) {
  return static_cast<double>(Load<T>(v));
}
template <typename T>
inline T FromDouble(double v) {
  using A = typename AccType<T>::type;
  return Store<T>(static_cast<A>(v));
}

/// Converts n elements between dtypes (through double for integers, float for
/// floats: exact for every pair of supported types that fit).
inline void ConvertElements(const void* src, DType st, void* dst, DType dt, int64_t n) {
  DispatchDType(st, [&](auto stag) {
    using S = typename decltype(stag)::type;
    DispatchDType(dt, [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      const S* s = static_cast<const S*>(src);
      D* d = static_cast<D*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = FromDouble<D>(ToDouble(s[i]));
    });
  });
}

}  // namespace pskv
