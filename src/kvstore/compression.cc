#include "kvstore/compression.h"

#include <cstring>

#include "pskv/error.h"

namespace pskv {

GradientCompressor::GradientCompressor(CompressionConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.Validate();
  type_ = cfg_.type == "2bit" ? 2 : cfg_.type == "1bit" ? 1 : 0;
}

int64_t GradientCompressor::Factor() const {
  return type_ == 2 ? 16 : type_ == 1 ? 32 : 1;
}

int64_t GradientCompressor::CompressedBytes(int64_t n) const {
  if (type_ == 0) return n * 4;
  return (n + Factor() - 1) / Factor() * 4;
}

void GradientCompressor::Quantize(const float* grad, float* residual, uint8_t* out,
                                  int64_t n) const {
  const int64_t bytes = CompressedBytes(n);
  std::memset(out, 0, static_cast<size_t>(bytes));
  const float t = cfg_.threshold;
  if (type_ == 2) {
    const float neg_t = -t;
    for (int64_t i = 0; i < n; ++i) {
      float r = residual[i] + grad[i];
      const int shift = 6 - 2 * static_cast<int>(i & 3);
      if (r >= t) {
        out[i >> 2] |= static_cast<uint8_t>(0x3 << shift);
        r -= t;
      } else if (r <= neg_t) {
        out[i >> 2] |= static_cast<uint8_t>(0x2 << shift);
        r += t;
      }
      residual[i] = r;
    }
  } else if (type_ == 1) {
    for (int64_t i = 0; i < n; ++i) {
      float r = residual[i] + grad[i];
      if (r > t) {
        out[i >> 3] |= static_cast<uint8_t>(0x80 >> (i & 7));
        r -= 1.0f;
      } else {
        r += 1.0f;
      }
      residual[i] = r;
    }
  } else {
    throw UsageError("Quantize called with gradient compression off");
  }
}

template <bool kAdd>
void GradientCompressor::Deq(const uint8_t* in, float* out, int64_t n) const {
  const float t = cfg_.threshold;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if (type_ == 2) {
      const int code = (in[i >> 2] >> (6 - 2 * static_cast<int>(i & 3))) & 0x3;
      v = code == 0x3 ? t : code == 0x2 ? -t : 0.0f;
    } else {
      v = (in[i >> 3] & (0x80 >> (i & 7))) ? 1.0f : -1.0f;
    }
    if constexpr (kAdd) {
      out[i] += v;
    } else {
      out[i] = v;
    }
  }
}

void GradientCompressor::Dequantize(const uint8_t* in, float* out, int64_t n) const {
  if (type_ == 0) throw UsageError("Dequantize called with gradient compression off");
  Deq<false>(in, out, n);
}

void GradientCompressor::DequantizeAdd(const uint8_t* in, float* out, int64_t n) const {
  if (type_ == 0) throw UsageError("Dequantize called with gradient compression off");
  Deq<true>(in, out, n);
}

}  // namespace pskv
