#include "kvstore/reduce.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/dtype_dispatch.h"
#include "device/kernel_ops.h"
#include "device/layout_check.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include "pskv/error.h"

namespace pskv {

namespace {

// Kernels on [b, e). `__restrict` lets the compiler vectorise; d may equal s0
// (element i is read before it is written, which is safe for these loops).
template <typename T>
void Sum1(T* d, const T* s0, int64_t b, int64_t e) {
  if (d != s0) std::memcpy(d + b, s0 + b, (e - b) * sizeof(T));
}
template <typename T>
void Sum2(T* d, const T* s0, const T* __restrict s1, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) d[i] = kops::Add(s0[i], s1[i]);
}
template <typename T>
void Sum3(T* d, const T* s0, const T* __restrict s1, const T* __restrict s2, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) d[i] = kops::Add(kops::Add(s0[i], s1[i]), s2[i]);
}
template <typename T>
void Sum4(T* d, const T* s0, const T* __restrict s1, const T* __restrict s2, const T* __restrict s3,
          int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i)
    d[i] = kops::Add(kops::Add(kops::Add(s0[i], s1[i]), s2[i]), s3[i]);
}
// d += s_a + ... (1 to 4 further sources)
template <typename T>
void AddGroup(T* d, const T* const* s, int m, int64_t b, int64_t e) {
  switch (m) {
    case 1:
      Sum2(d, d, s[0], b, e);
      break;
    case 2:
      for (int64_t i = b; i < e; ++i) d[i] = kops::Add(d[i], kops::Add(s[0][i], s[1][i]));
      break;
    case 3:
      for (int64_t i = b; i < e; ++i)
        d[i] = kops::Add(d[i], kops::Add(kops::Add(s[0][i], s[1][i]), s[2][i]));
      break;
    default:
      for (int64_t i = b; i < e; ++i)
        d[i] = kops::Add(d[i], kops::Add(kops::Add(kops::Add(s[0][i], s[1][i]), s[2][i]), s[3][i]));
      break;
  }
}

#if defined(__SSE2__)
// Large float32 sums whose destination is not a source: write with non-temporal
// stores, so the destination's cache lines are not read first (saves one fifth of
// the memory traffic of a 4-way sum). Needs 16-byte aligned pointers.
constexpr int64_t kStreamBytes = 1 << 22;  // below this the destination stays cached
bool SumStreamF32(float* d, const std::vector<const float*>& s, int64_t b, int64_t e) {
  const size_t k = s.size();
  if (k < 2 || k > 4 || (e - b) * 4 < kStreamBytes) return false;
  auto aligned = [&](const float* p) { return (reinterpret_cast<uintptr_t>(p + b) & 15) == 0; };
  if (!aligned(d) || (e - b) % 4 != 0) return false;
  for (const float* p : s)
    if (p == d || !aligned(p)) return false;
  const float* s0 = s[0];
  const float* s1 = s[1];
  const float* s2 = k > 2 ? s[2] : nullptr;
  const float* s3 = k > 3 ? s[3] : nullptr;
  for (int64_t i = b; i < e; i += 4) {
    __m128 v = _mm_add_ps(_mm_load_ps(s0 + i), _mm_load_ps(s1 + i));
    if (s2) v = _mm_add_ps(v, _mm_load_ps(s2 + i));
    if (s3) v = _mm_add_ps(v, _mm_load_ps(s3 + i));
    _mm_stream_ps(d + i, v);
  }
  _mm_sfence();
  return true;
}
#endif

template <typename T>
void SumRange(T* d, const std::vector<const T*>& s, int64_t b, int64_t e) {
  const size_t k = s.size();
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    if (SumStreamF32(d, s, b, e)) return;
  }
#endif
  switch (std::min<size_t>(k, 4)) {
    case 1:
      Sum1(d, s[0], b, e);
      break;
    case 2:
      Sum2(d, s[0], s[1], b, e);
      break;
    case 3:
      Sum3(d, s[0], s[1], s[2], b, e);
      break;
    default:
      Sum4(d, s[0], s[1], s[2], s[3], b, e);
      break;
  }
  for (size_t g = 4; g < k; g += 4)
    AddGroup(d, s.data() + g, static_cast<int>(std::min<size_t>(4, k - g)), b, e);
}

// 16-bit floats: accumulate blocks in float32, round once.
template <typename T>
void SumRangeLowPrecision(T* d, const std::vector<const T*>& s, int64_t b, int64_t e) {
  constexpr int64_t kBlock = 1024;
  float acc[kBlock];
  for (int64_t blk = b; blk < e; blk += kBlock) {
    const int64_t n = std::min(kBlock, e - blk);
    for (int64_t i = 0; i < n; ++i) acc[i] = Load(s[0][blk + i]);
    for (size_t k = 1; k < s.size(); ++k)
      for (int64_t i = 0; i < n; ++i) acc[i] += Load(s[k][blk + i]);
    for (int64_t i = 0; i < n; ++i) d[blk + i] = Store<T>(acc[i]);
  }
}

void CheckSame(const NDArray& a, const NDArray& dst, const char* what) {
  for (const NDArray* x : {&a, &dst})
    if (!x->device().host_accessible())
      throw UsageError(std::string(what) + " on the CPU cannot read " + x->device().str() +
                       " memory: copy the array to the host first (NDArray::To)");
  CheckSameLayout(a, dst, what);
}

}  // namespace

Reducer::Reducer(int64_t bigarray_bound, int threads) : bound_(bigarray_bound) {
  // More threads than cores only adds switching (MXNet's default of 4 on a
  // 2-core machine measurably slowed the servers' additions).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, cores);
  if (threads > 1) pool_ = std::make_unique<ThreadPool>(threads);
}

template <typename F>
void Reducer::For(int64_t n, F&& f) {
  if (pool_ && n >= bound_) {
    pool_->ParallelFor(n, 1024, f);
  } else {
    f(0, n);
  }
}

void Reducer::Sum(const std::vector<NDArray>& srcs, NDArray* dst) {
  if (srcs.empty()) throw InvalidArgument("Reducer::Sum needs at least one source");
  for (const auto& s : srcs) CheckSame(s, *dst, "reduce");
  // If dst aliases a source other than the first, move that source to the front
  // so every element is read before it is written.
  std::vector<NDArray> order = srcs;
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i].raw() == dst->raw()) std::swap(order[0], order[i]);
  DispatchDType(dst->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<const T*> p;
    for (auto& s : order) p.push_back(s.template data<const T>());
    T* d = dst->template data<T>();
    For(dst->size(), [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, half_t> || std::is_same_v<T, bf16_t>) {
        SumRangeLowPrecision(d, p, b, e);
      } else {
        SumRange(d, p, b, e);
      }
    });
  });
}

void Reducer::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool_ && n > 1) {
    pool_->ParallelFor(n, 1, fn);
  } else if (n > 0) {
    fn(0, n);
  }
}

void Reducer::AddTo(const NDArray& src, NDArray* dst) {
  Sum({*dst, src}, dst);
}

void Reducer::Copy(const NDArray& src, NDArray* dst) {
  CheckSame(src, *dst, "copy");
  if (src.raw() == dst->raw()) return;
  const size_t es = DTypeSize(src.dtype());
  char* d = static_cast<char*>(dst->raw());
  const char* s = static_cast<const char*>(src.raw());
  For(src.size(), [&](int64_t b, int64_t e) { std::memcpy(d + b * es, s + b * es, (e - b) * es); });
}

}  // namespace pskv
