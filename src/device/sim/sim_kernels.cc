// Loops over the kernel bodies of device/kernel_ops.h: the same source nvcc compiles
// for the GPU (device/cuda/kernels.cu), picked by the same dispatch (VisitKernelCall).
#include "device/sim/sim_kernels.h"

#include <cstdlib>

namespace pskv::device {
namespace {

struct Loops {
  template <typename T>
  void Sum(const KernelCall& c) {
    for (int64_t i = 0; i < c.n; ++i) kops::SumAt(static_cast<T*>(c.dst), c.src, c.k, i);
  }
  template <typename S, typename D>
  void Convert(const KernelCall& c) {
    for (int64_t i = 0; i < c.n; ++i)
      kops::ConvertAt(static_cast<const S*>(c.src[0]), static_cast<D*>(c.dst), i);
  }
  template <typename U>
  void Fill(const KernelCall& c) {
    for (int64_t i = 0; i < c.n; ++i) static_cast<U*>(c.dst)[i] = static_cast<U>(c.pattern);
  }
  template <typename T>
  void Scale(const KernelCall& c) {
    using A = typename kops::Acc<T>::type;
    for (int64_t i = 0; i < c.n; ++i)
      kops::ScaleAt(static_cast<T*>(c.dst), static_cast<A>(c.alpha), i);
  }
  template <kops::UpdateKind K>
  void Update(const KernelCall& c) {
    auto* g = static_cast<const float*>(c.src[0]);
    auto* w = static_cast<float*>(c.dst);
    for (int64_t i = 0; i < c.n; ++i) kops::UpdateAt<K>(c.scalars, g, w, c.slots, i);
  }
};

}  // namespace

void RunSimKernel(const KernelCall& call) {
  // The runtime validated the call before it was enqueued; an unknown case here is a
  // bug in pskv, not an input error.
  if (!VisitKernelCall(call, Loops{})) std::abort();
}

}  // namespace pskv::device
