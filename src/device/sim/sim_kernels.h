// The simulated backend's kernels: the element functions of device/kernel_ops.h run as
// plain loops over [0, call.n) on the stream's thread.
#pragma once

#include "device/backend.h"

namespace pskv::device {

/// Runs `call` whose pointers are already the stream threads' (read-write) views.
void RunSimKernel(const KernelCall& call);

}  // namespace pskv::device
