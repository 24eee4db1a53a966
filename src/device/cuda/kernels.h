// The CUDA backend's kernel launches (kernels.cu): one grid-stride kernel per
// KernelCall op over the element functions of device/kernel_ops.h. Included only by
// CUDA-built files; the runtime validated the call.
#pragma once

#include <cuda_runtime_api.h>

#include "device/backend.h"

namespace pskv::device::cuda_kernels {

/// Enqueues `call` on `stream` (the current device must be the call's) and returns
/// cudaGetLastError(); cudaErrorInvalidValue for a call it cannot run.
cudaError_t Launch(const KernelCall& call, cudaStream_t stream);

}  // namespace pskv::device::cuda_kernels
