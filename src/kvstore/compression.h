// Gradient compression (docs/mxnet-differences.md): 2-bit and 1-bit quantisation with residual
// error feedback, in MXNet's exact packed bit layout.
//
// 2-bit, threshold t > 0:  r += g; r >= t -> code 0b11 (+t), r -= t
//                                   r <= -t -> code 0b10 (-t), r += t;  else 0b00 (0)
//   element i: byte i/4, bits (7-2s, 6-2s) with s = i%4 (MSB first).
// 1-bit, threshold t (any): r += g; r > t -> bit 1 (+1), r -= 1;  else bit 0 (-1), r += 1
//   element i: byte i/8, bit 7 - i%8.
// Packed size: 4*ceil(N/16) bytes (2-bit), 4*ceil(N/32) bytes (1-bit); unused bits 0.
#pragma once

#include <cstdint>

#include "pskv/kvstore.h"

namespace pskv {

class GradientCompressor {
 public:
  explicit GradientCompressor(CompressionConfig cfg);
  const CompressionConfig& config() const { return cfg_; }
  bool active() const { return cfg_.active(); }
  /// Elements per float32 word of packed output (16 or 32).
  int64_t Factor() const;
  /// Bytes of the packed form of n elements.
  int64_t CompressedBytes(int64_t n) const;
  /// Quantises grad+residual into `out` (CompressedBytes(n) bytes) and updates
  /// the residual in place.
  void Quantize(const float* grad, float* residual, uint8_t* out, int64_t n) const;
  /// out[i] = dequantised value i (Add: out[i] += ...).
  void Dequantize(const uint8_t* in, float* out, int64_t n) const;
  void DequantizeAdd(const uint8_t* in, float* out, int64_t n) const;

 private:
  template <bool kAdd>
  void Deq(const uint8_t* in, float* out, int64_t n) const;
  CompressionConfig cfg_;
  int type_;  // 0 none, 1 one-bit, 2 two-bit
};

}  // namespace pskv
