// A copy whose destination goes to memory, not into the cache: for large copies
// whose destination will not be read again soon (a message far larger than the
// last-level cache, copied a piece at a time).
//
// Why: glibc's memcpy switches to non-temporal stores only for single copies above
// its threshold (¾ of the shared cache, tens of MiB); pskv copies a large value in
// pieces of at most 1 MiB (wire frames, ring steps), each far below it, so each
// piece's destination lines were first read from memory (read-for-ownership) and
// later written back: a 64 MiB value copied in 1 MiB memcpys took 11-15 ms on the
// 2-core VM where one 64 MiB memcpy takes 7-9 ms, streamed pieces 9.8-10.4 ms
// (docs/performance.md, "Where the rest goes").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace pskv {

/// Copies n bytes like memcpy (no overlap), writing the destination with
/// non-temporal stores where the CPU has them: afterwards the destination is in
/// memory and not in any cache. Use only where nothing reads it again soon.
inline void StreamCopy(char* dst, const char* src, size_t n) {
#if defined(__SSE2__)
  size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (head >= n || n < 256) {
    std::memcpy(dst, src, n);
    return;
  }
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // the streamed stores are visible before anything written later
#else
  std::memcpy(dst, src, n);
#endif
}

/// Messages at least this large are copied with StreamCopy past their first
/// kStreamAfterBytes: larger than a last-level cache, their early bytes are gone
/// from it by the time the whole message is there to be read.
constexpr uint64_t kStreamAfterBytes = uint64_t{8} << 20;

}  // namespace pskv
