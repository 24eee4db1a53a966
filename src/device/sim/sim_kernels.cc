// Loops over the kernel bodies of device/kernel_ops.h: the same source nvcc compiles
// for the GPU (device/cuda/kernels.cu), instantiated by the same dispatch.
#include "device/sim/sim_kernels.h"

#include <cstring>

#include "pskv/device.h"

namespace pskv::device {

void RunSimKernel(const KernelCall& c) {
  using Op = KernelCall::Op;
  const int64_t n = c.n;
  bool ok = true;
  switch (c.op) {
    case Op::kSum:
      ok = kops::DispatchStorage(c.dtype, [&](auto tag) {
        using T = decltype(tag);
        for (int64_t i = 0; i < n; ++i) kops::SumAt(static_cast<T*>(c.dst), c.src, c.k, i);
      });
      break;
    case Op::kConvert:
      ok = kops::DispatchStorage(c.src_dtype, [&](auto stag) {
        using S = decltype(stag);
        ok = kops::DispatchStorage(c.dtype, [&](auto dtag) {
          using D = decltype(dtag);
          for (int64_t i = 0; i < n; ++i)
            kops::ConvertAt(static_cast<const S*>(c.src[0]), static_cast<D*>(c.dst), i);
        });
      });
      break;
    case Op::kFill: {
      const size_t es = DTypeSize(c.dtype);
      auto* d = static_cast<unsigned char*>(c.dst);
      for (int64_t i = 0; i < n; ++i) std::memcpy(d + static_cast<size_t>(i) * es, &c.pattern, es);
      break;
    }
    case Op::kScale:
      ok = kops::DispatchStorage(c.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_floating_point_v<T> || kops::kLowPrecision<T>) {
          using A = typename kops::Acc<T>::type;
          for (int64_t i = 0; i < n; ++i)
            kops::ScaleAt(static_cast<T*>(c.dst), static_cast<A>(c.alpha), i);
        }
      });
      break;
    case Op::kUpdate:
      ok = kops::DispatchUpdate(c.update, [&](auto tag) {
        constexpr kops::UpdateKind K = decltype(tag)::kind;
        auto* g = static_cast<const float*>(c.src[0]);
        auto* w = static_cast<float*>(c.dst);
        float* const* slots = c.slots;
        for (int64_t i = 0; i < n; ++i) kops::UpdateAt<K>(c.scalars, g, w, slots, i);
      });
      break;
  }
  // The runtime validated the call before it was enqueued; an unknown case here is a
  // bug in pskv, not an input error.
  if (!ok) std::abort();
}

}  // namespace pskv::device
