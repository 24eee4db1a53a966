// pskv's CUDA kernels: grid-stride loops over the element functions of
// device/kernel_ops.h, the source the simulated backend and the CPU optimizer run too.
// Compiled with --fmad=false (no multiply-add contraction; scripts/ptx-lint.sh checks
// the PTX), so the results are the CPU's bit for bit. Each thread reads element i of
// every source before writing element i of dst, so dst may alias a source.
#include <cstdint>
#include <type_traits>

#include "device/cuda/kernels.h"

namespace pskv::device::cuda_kernels {
namespace {

#define PSKV_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Source pointers by value (512 bytes of kernel parameters).
struct Sources {
  const void* p[kMaxSumSources];
};

template <typename T>
__global__ void SumKernel(T* dst, Sources s, int k, int64_t n) {
  PSKV_GRID_STRIDE(i, n) { kops::SumAt(dst, s.p, k, i); }
}

template <typename S, typename D>
__global__ void ConvertKernel(const S* src, D* dst, int64_t n) {
  PSKV_GRID_STRIDE(i, n) { kops::ConvertAt(src, dst, i); }
}

template <typename U>
__global__ void FillKernel(U* dst, U v, int64_t n) {
  PSKV_GRID_STRIDE(i, n) { dst[i] = v; }
}

template <typename T>
__global__ void ScaleKernel(T* dst, typename kops::Acc<T>::type alpha, int64_t n) {
  PSKV_GRID_STRIDE(i, n) { kops::ScaleAt(dst, alpha, i); }
}

struct Slots {
  float* p[kops::kMaxUpdateSlots];
};

template <kops::UpdateKind K>
__global__ void UpdateKernel(kops::UpdateScalars sc, const float* g, float* w, Slots slots,
                             int64_t n) {
  PSKV_GRID_STRIDE(i, n) { kops::UpdateAt<K>(sc, g, w, slots.p, i); }
}

#undef PSKV_GRID_STRIDE

constexpr int kThreads = 256;
int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

template <typename U>
void Fill(const KernelCall& c, cudaStream_t stream) {
  FillKernel<<<Blocks(c.n), kThreads, 0, stream>>>(static_cast<U*>(c.dst),
                                                   static_cast<U>(c.pattern), c.n);
}

}  // namespace

cudaError_t Launch(const KernelCall& c, cudaStream_t stream) {
  using Op = KernelCall::Op;
  if (c.n == 0) return cudaSuccess;
  const int64_t n = c.n;
  bool ok = true;
  switch (c.op) {
    case Op::kSum: {
      Sources s{};
      for (int i = 0; i < c.k; ++i) s.p[i] = c.src[i];
      ok = kops::DispatchStorage(c.dtype, [&](auto tag) {
        using T = decltype(tag);
        SumKernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<T*>(c.dst), s, c.k, n);
      });
      break;
    }
    case Op::kConvert:
      ok = kops::DispatchStorage(c.src_dtype, [&](auto stag) {
        using S = decltype(stag);
        ok = kops::DispatchStorage(c.dtype, [&](auto dtag) {
          using D = decltype(dtag);
          ConvertKernel<S, D><<<Blocks(n), kThreads, 0, stream>>>(static_cast<const S*>(c.src[0]),
                                                                   static_cast<D*>(c.dst), n);
        });
      });
      break;
    case Op::kFill:
      switch (DTypeSize(c.dtype)) {
        case 1:
          Fill<uint8_t>(c, stream);
          break;
        case 2:
          Fill<uint16_t>(c, stream);
          break;
        case 4:
          Fill<uint32_t>(c, stream);
          break;
        case 8:
          Fill<uint64_t>(c, stream);
          break;
        default:
          ok = false;
      }
      break;
    case Op::kScale:
      ok = kops::DispatchStorage(c.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_floating_point_v<T> || kops::kLowPrecision<T>) {
          using A = typename kops::Acc<T>::type;
          ScaleKernel<T><<<Blocks(n), kThreads, 0, stream>>>(static_cast<T*>(c.dst),
                                                             static_cast<A>(c.alpha), n);
        }
      });
      break;
    case Op::kUpdate: {
      Slots slots{};
      for (int i = 0; i < c.k; ++i) slots.p[i] = c.slots[i];
      ok = kops::DispatchUpdate(c.update, [&](auto tag) {
        constexpr kops::UpdateKind K = decltype(tag)::kind;
        UpdateKernel<K><<<Blocks(n), kThreads, 0, stream>>>(
            c.scalars, static_cast<const float*>(c.src[0]), static_cast<float*>(c.dst), slots, n);
      });
      break;
    }
  }
  if (!ok) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace pskv::device::cuda_kernels
