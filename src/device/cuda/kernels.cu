// pskv's CUDA kernels: grid-stride loops over the element functions of
// device/kernel_ops.h, the source the simulated backend and the CPU optimizer run too.
// Compiled with --fmad=false (no multiply-add contraction; scripts/ptx-lint.sh checks
// the PTX), so the results are the CPU's bit for bit. Each thread reads element i of
// every source before writing element i of dst, so dst may alias a source.
#include <cstdint>

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
  PSKV_GRID_STRIDE(i, n) {
    kops::SumAt(dst, s.p, k, i);
  }
}

template <typename S, typename D>
__global__ void ConvertKernel(const S* src, D* dst, int64_t n) {
  PSKV_GRID_STRIDE(i, n) {
    kops::ConvertAt(src, dst, i);
  }
}

template <typename U>
__global__ void FillKernel(U* dst, U v, int64_t n) {
  PSKV_GRID_STRIDE(i, n) {
    dst[i] = v;
  }
}

template <typename T>
__global__ void ScaleKernel(T* dst, typename kops::Acc<T>::type alpha, int64_t n) {
  PSKV_GRID_STRIDE(i, n) {
    kops::ScaleAt(dst, alpha, i);
  }
}

struct Slots {
  float* p[kops::kMaxUpdateSlots];
};

template <kops::UpdateKind K>
__global__ void UpdateKernel(kops::UpdateScalars sc, const float* g, float* w, Slots slots,
                             int64_t n) {
  PSKV_GRID_STRIDE(i, n) {
    kops::UpdateAt<K>(sc, g, w, slots.p, i);
  }
}

#undef PSKV_GRID_STRIDE

constexpr int kThreads = 256;
int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

// One launch per operation, picked by VisitKernelCall (the simulator's dispatch too).
struct Launches {
  cudaStream_t stream;
  template <typename T>
  void Sum(const KernelCall& c) {
    Sources s{};
    for (int i = 0; i < c.k; ++i) s.p[i] = c.src[i];
    SumKernel<T><<<Blocks(c.n), kThreads, 0, stream>>>(static_cast<T*>(c.dst), s, c.k, c.n);
  }
  template <typename S, typename D>
  void Convert(const KernelCall& c) {
    ConvertKernel<S, D><<<Blocks(c.n), kThreads, 0, stream>>>(static_cast<const S*>(c.src[0]),
                                                              static_cast<D*>(c.dst), c.n);
  }
  template <typename U>
  void Fill(const KernelCall& c) {
    FillKernel<<<Blocks(c.n), kThreads, 0, stream>>>(static_cast<U*>(c.dst),
                                                     static_cast<U>(c.pattern), c.n);
  }
  template <typename T>
  void Scale(const KernelCall& c) {
    using A = typename kops::Acc<T>::type;
    ScaleKernel<T><<<Blocks(c.n), kThreads, 0, stream>>>(static_cast<T*>(c.dst),
                                                         static_cast<A>(c.alpha), c.n);
  }
  template <kops::UpdateKind K>
  void Update(const KernelCall& c) {
    Slots slots{};
    for (int i = 0; i < c.k; ++i) slots.p[i] = c.slots[i];
    UpdateKernel<K><<<Blocks(c.n), kThreads, 0, stream>>>(
        c.scalars, static_cast<const float*>(c.src[0]), static_cast<float*>(c.dst), slots, c.n);
  }
};

}  // namespace

cudaError_t Launch(const KernelCall& c, cudaStream_t stream) {
  if (c.n == 0) return cudaSuccess;
  if (!VisitKernelCall(c, Launches{stream})) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace pskv::device::cuda_kernels
