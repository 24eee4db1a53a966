// Kernel bodies written once: element functions that nvcc compiles for the GPU
// (device/cuda/kernels.cu), that the simulated backend runs on the host
// (device/sim/sim_kernels.cc), and that the CPU optimizer runs itself
// (kvstore/optimizer_rules.cc). One source, so a GPU result is the CPU's bit for bit
// as long as the compiler keeps the order of the operations:
//  * nvcc compiles with --fmad=false (no multiply-add contraction; the PTX lint,
//    scripts/ptx-lint.sh, fails the build's test on an `fma` or an unrounded add/mul);
//  * division and square root are IEEE (nvcc's defaults -prec-div/-prec-sqrt=true);
//  * the host build targets x86-64 without FMA, and GCC does not contract across
//    statements of this file it cannot see as one expression.
//
// Sum order (Reducer::Sum, kvstore/reduce.cc): acc = ((s0+s1)+s2)+s3, then for each
// further group of up to four sources acc = acc + (((g0+g1)+g2)+g3); float16/bfloat16
// load as float32, add left to right over all sources and round once.
// Conversions go through double as ConvertElements (common/dtype_dispatch.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/float16_bits.h"
#include "pskv/ndarray.h"

namespace pskv::kops {

// Storage types of the 16-bit floats (distinct types over the same bits).
struct Half {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

// Load/Store as dtype_dispatch.h: the accumulation type is float for the 16-bit floats
// and the type itself otherwise.
template <typename T>
struct Acc {
  using type = T;
  PSKV_HOST_DEVICE static T Load(T v) { return v; }
  PSKV_HOST_DEVICE static T Store(T v) { return v; }
};
template <>
struct Acc<Half> {
  using type = float;
  PSKV_HOST_DEVICE static float Load(Half v) { return fp16::HalfToFloat(v.bits); }
  PSKV_HOST_DEVICE static Half Store(float v) { return Half{fp16::FloatToHalf(v)}; }
};
template <>
struct Acc<BF16> {
  using type = float;
  PSKV_HOST_DEVICE static float Load(BF16 v) { return fp16::BFloat16ToFloat(v.bits); }
  PSKV_HOST_DEVICE static BF16 Store(float v) { return BF16{fp16::FloatToBFloat16(v)}; }
};

template <typename T>
inline constexpr bool kLowPrecision = false;
template <>
inline constexpr bool kLowPrecision<Half> = true;
template <>
inline constexpr bool kLowPrecision<BF16> = true;

/// Calls f(T{}) with T the storage type of `t`; false for an unknown dtype. Host code
/// (the launch wrappers and the simulator pick the instantiation with it).
template <typename F>
bool DispatchStorage(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32:
      f(float{});
      return true;
    case DType::kFloat64:
      f(double{});
      return true;
    case DType::kFloat16:
      f(Half{});
      return true;
    case DType::kBFloat16:
      f(BF16{});
      return true;
    case DType::kInt32:
      f(int32_t{});
      return true;
    case DType::kInt64:
      f(int64_t{});
      return true;
    case DType::kInt8:
      f(int8_t{});
      return true;
    case DType::kUInt8:
      f(uint8_t{});
      return true;
  }
  return false;
}

/// a + b; signed integers wrap around (two's complement, as a GPU's add does) where
/// C++ leaves their overflow undefined. The sums of every backend and of the CPU
/// Reducer add with it.
template <typename T>
PSKV_HOST_DEVICE inline T Add(T a, T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) >= sizeof(int)) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return static_cast<T>(a + b);
  }
}

/// dst[i] = srcs[0][i] + ... + srcs[k-1][i]; every source element is read before
/// dst[i] is written, so dst may alias a source.
template <typename T>
PSKV_HOST_DEVICE inline void SumAt(T* dst, const void* const* srcs, int k, int64_t i) {
  if constexpr (kLowPrecision<T>) {
    float acc = Acc<T>::Load(static_cast<const T*>(srcs[0])[i]);
    for (int j = 1; j < k; ++j) acc += Acc<T>::Load(static_cast<const T*>(srcs[j])[i]);
    dst[i] = Acc<T>::Store(acc);
  } else {
    const int first = k < 4 ? k : 4;
    T acc = static_cast<const T*>(srcs[0])[i];
    for (int j = 1; j < first; ++j) acc = Add(acc, static_cast<const T*>(srcs[j])[i]);
    for (int g = 4; g < k; g += 4) {
      const int end = g + 4 < k ? g + 4 : k;
      T grp = static_cast<const T*>(srcs[g])[i];
      for (int j = g + 1; j < end; ++j) grp = Add(grp, static_cast<const T*>(srcs[j])[i]);
      acc = Add(acc, grp);
    }
    dst[i] = acc;
  }
}

/// Through double as ConvertElements: ToDouble(Load(s)), then Store(Acc(double)).
/// Out-of-range conversions to integers are undefined in C++ and differ on a GPU:
/// callers keep values in the destination's range (docs/gpu.md).
template <typename S, typename D>
PSKV_HOST_DEVICE inline void ConvertAt(const S* src, D* dst, int64_t i) {
  const double x = static_cast<double>(Acc<S>::Load(src[i]));
  dst[i] = Acc<D>::Store(static_cast<typename Acc<D>::type>(x));
}

template <typename T>
PSKV_HOST_DEVICE inline void ScaleAt(T* dst, typename Acc<T>::type alpha, int64_t i) {
  dst[i] = Acc<T>::Store(Acc<T>::Load(dst[i]) * alpha);
}

// ------------------------------------------------------------- optimizer updates
// The built-in update rules of include/pskv/optimizer.h, one element at a time. The
// scalars are computed once per update on the host (UpdateScalars, the CPU optimizer
// and the device store use the same function), so pow() and the bias corrections are
// the host's on both sides.

enum class UpdateKind : int32_t {
  kNone = 0,
  kSgd,
  kSgdMomentum,
  kNag,
  kAdam,
  kAdamW,
  kRmsProp,
  kRmsPropCentered,
  kAdaGrad,
};

struct UpdateScalars {
  float rescale = 1, clip = 0;  // ScaledGrad
  float lr = 0, wd = 0;
  float mom = 0;                     // sgd, nag, centered rmsprop
  float b1 = 0, b2 = 0, eps = 0;     // adam(w), rmsprop (eps), adagrad (eps)
  float lr_t = 0, ic1 = 0, ic2 = 0;  // adam: lr*sqrt(c2)/c1; adamw: 1/c1, 1/c2
  float rho = 0;                     // rmsprop
};

/// rescale_grad, then clip_gradient (if > 0): the gradient every rule starts from
/// (std::min(std::max(g, -clip), clip), NaN kept).
PSKV_HOST_DEVICE inline float ScaleGrad(const UpdateScalars& s, float g) {
  g = s.rescale * g;
  if (s.clip > 0) {
    g = g < -s.clip ? -s.clip : g;
    g = s.clip < g ? s.clip : g;
  }
  return g;
}

PSKV_HOST_DEVICE inline float Sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);  // IEEE round-to-nearest with nvcc's default -prec-sqrt=true
#else
  return std::sqrt(x);
#endif
}

/// One element of one update of rule K: g the pushed gradient (float32), w the weight
/// (or its float32 master copy), slot[s] the state buffers. A template, so the CPU's
/// loop over it is the plain loop the compiler vectorises.
template <UpdateKind K>
PSKV_HOST_DEVICE inline void UpdateAt(const UpdateScalars& s, const float* grad, float* w,
                                      float* const* slot, int64_t i) {
  if constexpr (K == UpdateKind::kSgd) {
    w[i] -= s.lr * (ScaleGrad(s, grad[i]) + s.wd * w[i]);
  } else if constexpr (K == UpdateKind::kSgdMomentum) {
    float* m = slot[0];
    m[i] = s.mom * m[i] - s.lr * (ScaleGrad(s, grad[i]) + s.wd * w[i]);
    w[i] += m[i];
  } else if constexpr (K == UpdateKind::kNag) {
    float* m = slot[0];
    const float g = ScaleGrad(s, grad[i]) + s.wd * w[i];
    m[i] = s.mom * m[i] + g;
    w[i] -= s.lr * (g + s.mom * m[i]);
  } else if constexpr (K == UpdateKind::kAdam) {
    float* m = slot[0];
    float* v = slot[1];
    const float g = ScaleGrad(s, grad[i]) + s.wd * w[i];
    m[i] = s.b1 * m[i] + (1 - s.b1) * g;
    v[i] = s.b2 * v[i] + (1 - s.b2) * g * g;
    w[i] -= s.lr_t * m[i] / (Sqrt(v[i]) + s.eps);
  } else if constexpr (K == UpdateKind::kAdamW) {
    float* m = slot[0];
    float* v = slot[1];
    const float g = ScaleGrad(s, grad[i]);
    m[i] = s.b1 * m[i] + (1 - s.b1) * g;
    v[i] = s.b2 * v[i] + (1 - s.b2) * g * g;
    w[i] -= s.lr * ((m[i] * s.ic1) / (Sqrt(v[i] * s.ic2) + s.eps) + s.wd * w[i]);
  } else if constexpr (K == UpdateKind::kRmsProp) {
    float* sq = slot[0];
    const float g = ScaleGrad(s, grad[i]) + s.wd * w[i];
    sq[i] = s.rho * sq[i] + (1 - s.rho) * g * g;
    w[i] -= s.lr * g / (Sqrt(sq[i]) + s.eps);
  } else if constexpr (K == UpdateKind::kRmsPropCentered) {
    float* sq = slot[0];
    float* a = slot[1];
    float* d = slot[2];
    const float g = ScaleGrad(s, grad[i]) + s.wd * w[i];
    sq[i] = s.rho * sq[i] + (1 - s.rho) * g * g;
    a[i] = s.rho * a[i] + (1 - s.rho) * g;
    d[i] = s.mom * d[i] - s.lr * g / Sqrt(sq[i] - a[i] * a[i] + s.eps);
    w[i] += d[i];
  } else if constexpr (K == UpdateKind::kAdaGrad) {
    float* h = slot[0];
    const float g = ScaleGrad(s, grad[i]);
    h[i] += g * g;
    w[i] -= s.lr * (g / Sqrt(h[i] + s.eps) + s.wd * w[i]);
  }
}

template <UpdateKind K>
struct UpdateTag {
  static constexpr UpdateKind kind = K;
};

/// Calls f(UpdateTag<K>{}) for the rule `k`; false for kNone or an unknown value.
template <typename F>
bool DispatchUpdate(UpdateKind k, F&& f) {
  switch (k) {
    case UpdateKind::kSgd:
      f(UpdateTag<UpdateKind::kSgd>{});
      return true;
    case UpdateKind::kSgdMomentum:
      f(UpdateTag<UpdateKind::kSgdMomentum>{});
      return true;
    case UpdateKind::kNag:
      f(UpdateTag<UpdateKind::kNag>{});
      return true;
    case UpdateKind::kAdam:
      f(UpdateTag<UpdateKind::kAdam>{});
      return true;
    case UpdateKind::kAdamW:
      f(UpdateTag<UpdateKind::kAdamW>{});
      return true;
    case UpdateKind::kRmsProp:
      f(UpdateTag<UpdateKind::kRmsProp>{});
      return true;
    case UpdateKind::kRmsPropCentered:
      f(UpdateTag<UpdateKind::kRmsPropCentered>{});
      return true;
    case UpdateKind::kAdaGrad:
      f(UpdateTag<UpdateKind::kAdaGrad>{});
      return true;
    case UpdateKind::kNone:
      break;
  }
  return false;
}

inline constexpr int kMaxUpdateSlots = 3;

}  // namespace pskv::kops
