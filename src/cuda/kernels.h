// Launchers of pskv's CUDA kernels (kernels.cu). Included only by CUDA-built files
// (runtime.cc, kernels.cu); callers validate arguments (runtime.h). Each launcher
// enqueues one kernel on `stream` and returns cudaGetLastError().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pskv/ndarray.h"

namespace pskv::cuda::kernels {

inline constexpr int kMaxSources = 64;
/// Source pointers passed by value (512 bytes of kernel parameters).
struct Sources {
  const void* p[kMaxSources];
};

/// dst[i] = srcs[0][i] + ... + srcs[k-1][i] in Reducer::Sum's order; 1 <= k <= kMaxSources.
/// dst may equal srcs[0] (every element is read before it is written).
cudaError_t LaunchSum(DType t, void* dst, const Sources& srcs, int k, int64_t n,
                      cudaStream_t stream);
/// dst[i] = convert(src[i]) as pskv's ConvertElements does.
cudaError_t LaunchConvert(DType st, const void* src, DType dt, void* dst, int64_t n,
                          cudaStream_t stream);
/// Every element of size `elem_size` (1, 2, 4 or 8) = the low bytes of `pattern`.
cudaError_t LaunchFill(void* dst, int elem_size, uint64_t pattern, int64_t n, cudaStream_t stream);
/// dst[i] *= alpha (float dtypes only).
cudaError_t LaunchScale(DType t, void* dst, int64_t n, double alpha, cudaStream_t stream);

}  // namespace pskv::cuda::kernels
