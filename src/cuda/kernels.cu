// pskv's CUDA kernels: k-way sum, dtype conversion, fill, scale.
//
// Bit-exactness with the CPU (kvstore/reduce.cc, ndarray.cc) is the contract:
//  * the sum adds in Reducer::Sum's order: acc = ((s0+s1)+s2)+s3, then for every further
//    group of up to four sources acc = acc + (((g0+g1)+g2)+g3);
//  * float16/bfloat16 load as float32, add left to right over all sources and round
//    once, with the CPU's own conversion functions (common/float16_bits.h, compiled for
//    both), NaN payloads included;
//  * the file is compiled with --fmad=false, so no multiply-add is contracted.
// Every kernel is a grid-stride loop over elements; each thread reads element i of all
// sources before writing element i of dst, so dst may alias a source.
#include <cstdint>

#include "common/float16_bits.h"
#include "cuda/kernels.h"

namespace pskv::cuda::kernels {
namespace {

// Storage types of the 16-bit floats (distinct types over the same bits).
struct Half {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

// Load/Store as dtype_dispatch.h: the accumulation type is float for the 16-bit
// floats and the type itself otherwise.
template <typename T>
struct Acc {
  using type = T;
  __device__ static T Load(T v) { return v; }
  __device__ static T Store(T v) { return v; }
};
template <>
struct Acc<Half> {
  using type = float;
  __device__ static float Load(Half v) { return fp16::HalfToFloat(v.bits); }
  __device__ static Half Store(float v) { return Half{fp16::FloatToHalf(v)}; }
};
template <>
struct Acc<BF16> {
  using type = float;
  __device__ static float Load(BF16 v) { return fp16::BFloat16ToFloat(v.bits); }
  __device__ static BF16 Store(float v) { return BF16{fp16::FloatToBFloat16(v)}; }
};

template <typename T>
constexpr bool kLowPrecision = false;
template <>
constexpr bool kLowPrecision<Half> = true;
template <>
constexpr bool kLowPrecision<BF16> = true;

#define PSKV_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void SumKernel(T* dst, Sources s, int k, int64_t n) {
  PSKV_GRID_STRIDE(i, n) {
    if constexpr (kLowPrecision<T>) {
      float acc = Acc<T>::Load(static_cast<const T*>(s.p[0])[i]);
      for (int j = 1; j < k; ++j) acc += Acc<T>::Load(static_cast<const T*>(s.p[j])[i]);
      dst[i] = Acc<T>::Store(acc);
    } else {
      // First group: ((s0 + s1) + s2) + s3; later groups: acc + (((g0 + g1) + g2) + g3).
      const int first = k < 4 ? k : 4;
      T acc = static_cast<const T*>(s.p[0])[i];
      for (int j = 1; j < first; ++j) acc = acc + static_cast<const T*>(s.p[j])[i];
      for (int g = 4; g < k; g += 4) {
        const int end = g + 4 < k ? g + 4 : k;
        T grp = static_cast<const T*>(s.p[g])[i];
        for (int j = g + 1; j < end; ++j) grp = grp + static_cast<const T*>(s.p[j])[i];
        acc = acc + grp;
      }
      dst[i] = acc;
    }
  }
}

// Through double as ConvertElements: ToDouble(Load(s)), then Store(Acc(double)).
template <typename S, typename D>
__global__ void ConvertKernel(const S* src, D* dst, int64_t n) {
  PSKV_GRID_STRIDE(i, n) {
    const double x = static_cast<double>(Acc<S>::Load(src[i]));
    dst[i] = Acc<D>::Store(static_cast<typename Acc<D>::type>(x));
  }
}

template <typename U>
__global__ void FillKernel(U* dst, U v, int64_t n) {
  PSKV_GRID_STRIDE(i, n) {
    dst[i] = v;
  }
}

template <typename T>
__global__ void ScaleKernel(T* dst, typename Acc<T>::type alpha, int64_t n) {
  PSKV_GRID_STRIDE(i, n) {
    dst[i] = Acc<T>::Store(Acc<T>::Load(dst[i]) * alpha);
  }
}

#undef PSKV_GRID_STRIDE

constexpr int kThreads = 256;
int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

// Calls f(T{}) with T the device storage type of `t`; false for an unknown dtype.
template <typename F>
bool Dispatch(DType t, F&& f) {
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

}  // namespace

cudaError_t LaunchSum(DType t, void* dst, const Sources& srcs, int k, int64_t n,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (!Dispatch(t, [&](auto tag) {
        using T = decltype(tag);
        SumKernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<T*>(dst), srcs, k, n);
      }))
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t LaunchConvert(DType st, const void* src, DType dt, void* dst, int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  bool ok = false;
  Dispatch(st, [&](auto stag) {
    using S = decltype(stag);
    ok = Dispatch(dt, [&](auto dtag) {
      using D = decltype(dtag);
      ConvertKernel<S, D>
          <<<Blocks(n), kThreads, 0, stream>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
    });
  });
  if (!ok) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t LaunchFill(void* dst, int elem_size, uint64_t pattern, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (elem_size) {
    case 1:
      FillKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<uint8_t*>(dst),
                                                     static_cast<uint8_t>(pattern), n);
      break;
    case 2:
      FillKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<uint16_t*>(dst),
                                                     static_cast<uint16_t>(pattern), n);
      break;
    case 4:
      FillKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<uint32_t*>(dst),
                                                     static_cast<uint32_t>(pattern), n);
      break;
    case 8:
      FillKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<uint64_t*>(dst), pattern, n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchScale(DType t, void* dst, int64_t n, double alpha, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (t) {
    case DType::kFloat32:
      ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<float*>(dst),
                                                      static_cast<float>(alpha), n);
      break;
    case DType::kFloat64:
      ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<double*>(dst), alpha, n);
      break;
    case DType::kFloat16:
      ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<Half*>(dst),
                                                      static_cast<float>(alpha), n);
      break;
    case DType::kBFloat16:
      ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<BF16*>(dst),
                                                      static_cast<float>(alpha), n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace pskv::cuda::kernels
