#include <gtest/gtest.h>

#include "kvstore/compression.h"
#include "pskv/error.h"

using namespace pskv;

namespace {
GradientCompressor Make(const std::string& type, float t) {
  CompressionConfig c;
  c.type = type;
  c.threshold = t;
  return GradientCompressor(c);
}
}  // namespace

TEST(Compression, TwoBitBitLayoutMsbFirst) {
  auto gc = Make("2bit", 0.5f);
  // elements: +, -, 0, +, | -, 0 ...
  std::vector<float> g = {0.6f, -0.6f, 0.1f, 1.0f, -2.0f, 0.0f};
  std::vector<float> r(g.size(), 0.0f);
  std::vector<uint8_t> out(static_cast<size_t>(gc.CompressedBytes(6)));
  ASSERT_EQ(out.size(), 4u);  // ceil(6/16) floats
  gc.Quantize(g.data(), r.data(), out.data(), 6);
  EXPECT_EQ(out[0], 0b11100011);  // slot0=11, slot1=10, slot2=00, slot3=11
  EXPECT_EQ(out[1], 0b10000000);  // slot0=10, others 0
  EXPECT_EQ(out[2], 0);
  EXPECT_EQ(out[3], 0);
  EXPECT_FLOAT_EQ(r[0], 0.6f - 0.5f);
  EXPECT_FLOAT_EQ(r[1], -0.6f + 0.5f);
  EXPECT_FLOAT_EQ(r[2], 0.1f);
  EXPECT_FLOAT_EQ(r[4], -1.5f);
  std::vector<float> d(6);
  gc.Dequantize(out.data(), d.data(), 6);
  EXPECT_EQ(d, (std::vector<float>{0.5f, -0.5f, 0, 0.5f, -0.5f, 0}));
}

TEST(Compression, TwoBitResidualCarriesOverAndUsesFloat32) {
  auto gc = Make("2bit", 0.5f);
  float r = 0, g = 0.4f, d;
  uint8_t out[4];
  gc.Quantize(&g, &r, out, 1);
  gc.Dequantize(out, &d, 1);
  EXPECT_EQ(d, 0.0f);  // below the threshold: nothing sent, kept in the residual
  g = 0.1f;
  gc.Quantize(&g, &r, out, 1);  // 0.4f + 0.1f >= 0.5f in float32
  gc.Dequantize(out, &d, 1);
  EXPECT_EQ(d, 0.5f);
  EXPECT_EQ(r, 0.4f + 0.1f - 0.5f);
  g = 0.5f;  // exactly at the threshold
  r = 0;
  gc.Quantize(&g, &r, out, 1);
  gc.Dequantize(out, &d, 1);
  EXPECT_EQ(d, 0.5f);
  g = -0.5f;
  r = 0;
  gc.Quantize(&g, &r, out, 1);
  gc.Dequantize(out, &d, 1);
  EXPECT_EQ(d, -0.5f);
}

TEST(Compression, OneBitLayoutAndResidual) {
  auto gc = Make("1bit", 0.0f);
  std::vector<float> g(40, -0.25f);
  g[0] = 0.5f;
  g[9] = 3.0f;
  g[39] = 0.1f;
  std::vector<float> r(40, 0.0f);
  std::vector<uint8_t> out(static_cast<size_t>(gc.CompressedBytes(40)));
  ASSERT_EQ(out.size(), 8u);  // ceil(40/32) = 2 floats
  gc.Quantize(g.data(), r.data(), out.data(), 40);
  EXPECT_EQ(out[0], 0x80);
  EXPECT_EQ(out[1], 0x40);       // element 9: byte 1, bit 6
  EXPECT_EQ(out[4], 0x01);       // element 39: byte 4, bit 0
  EXPECT_EQ(out[5], 0);          // unused trailing bits are 0
  EXPECT_FLOAT_EQ(r[0], -0.5f);  // 0.5 - 1
  EXPECT_FLOAT_EQ(r[1], 0.75f);  // -0.25 + 1
  std::vector<float> d(40);
  gc.Dequantize(out.data(), d.data(), 40);
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(d[1], -1.0f);
  EXPECT_EQ(d[9], 1.0f);
}

TEST(Compression, ConfigValidation) {
  EXPECT_THROW(CompressionConfig::FromParams({{"type", "3bit"}}), InvalidArgument);
  EXPECT_THROW(CompressionConfig::FromParams({{"type", "2bit"}, {"threshold", "0"}}),
               InvalidArgument);
  EXPECT_THROW(CompressionConfig::FromParams({{"type", "2bit"}, {"threshold", "-1"}}),
               InvalidArgument);
  EXPECT_THROW(CompressionConfig::FromParams({{"threshold", "0.5"}}), InvalidArgument);
  EXPECT_THROW(CompressionConfig::FromParams({{"type", "2bit"}, {"treshold", "0.5"}}),
               InvalidArgument);
  EXPECT_THROW(CompressionConfig::FromParams({{"type", "2bit"}, {"threshold", "x"}}),
               InvalidArgument);
  auto c = CompressionConfig::FromParams({{"type", "1bit"}, {"threshold", "-0.3"}});
  EXPECT_EQ(c.type, "1bit");
  EXPECT_FLOAT_EQ(c.threshold, -0.3f);
  EXPECT_FLOAT_EQ(CompressionConfig::FromParams({{"type", "2bit"}}).threshold, 0.5f);
}
