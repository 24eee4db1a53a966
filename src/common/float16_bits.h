// Bit-level conversions between float32 and the 16-bit floats (IEEE binary16 and
// bfloat16), written once for the CPU (ndarray.cc, the Reducer) and the CUDA kernels
// (cuda/kernels.cu). Both sides must round identically for a GPU sum to be
// bit-identical to the CPU's: round to nearest even, overflow to infinity, subnormals
// kept, a NaN stays a NaN (quiet bit set). Plain C++ for the host; with nvcc the same
// functions are also compiled for the device.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PSKV_HOST_DEVICE __host__ __device__
#else
#define PSKV_HOST_DEVICE
#endif

namespace pskv::fp16 {

PSKV_HOST_DEVICE inline float FloatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

PSKV_HOST_DEVICE inline uint32_t BitsOfFloat(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

PSKV_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ff;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return FloatFromBits(u);
}

PSKV_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  const uint32_t u = BitsOfFloat(f);
  const uint32_t sign = (u >> 16) & 0x8000;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00 | (absu > 0x7f800000u ? 0x200 : 0));
  }
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (absu < 0x38800000u) {                                      // subnormal or zero in half
    if (absu < 0x33000000u) return static_cast<uint16_t>(sign);  // rounds to 0
    // |f| = man24 * 2^(exp-150); in units of the half subnormal step 2^-24 that is
    // man24 >> (126 - exp), rounded to nearest even. 126 - exp is in [14, 25].
    const uint32_t exp = absu >> 23;
    const uint32_t man = (absu & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - exp;
    uint32_t res = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (res & 1))) ++res;
    return static_cast<uint16_t>(sign | res);
  }
  const uint32_t exp = (absu >> 23) - 127 + 15;
  const uint32_t man = absu & 0x7fffff;
  uint32_t res = (exp << 10) | (man >> 13);
  const uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (res & 1))) ++res;  // may carry into exponent: fine
  return static_cast<uint16_t>(sign | res);
}

PSKV_HOST_DEVICE inline float BFloat16ToFloat(uint16_t b) {
  return FloatFromBits(static_cast<uint32_t>(b) << 16);
}

PSKV_HOST_DEVICE inline uint16_t FloatToBFloat16(float f) {
  const uint32_t u = BitsOfFloat(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // nan
  const uint32_t rounding = 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>((u + rounding) >> 16);
}

}  // namespace pskv::fp16
