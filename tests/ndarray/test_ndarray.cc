#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "pskv/error.h"
#include "pskv/ndarray.h"

using namespace pskv;

TEST(NDArray, OwningIsZeroFilledAndAligned) {
  NDArray a({3, 4}, DType::kFloat32);
  EXPECT_EQ(a.size(), 12);
  EXPECT_EQ(a.nbytes(), 48u);
  EXPECT_FALSE(a.is_view());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.raw()) % 64, 0u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(a.data<float>()[i], 0.0f);
}

TEST(NDArray, HandlesShareMemoryCloneDoesNot) {
  NDArray a({4});
  NDArray b = a;
  b.Fill(2);
  EXPECT_EQ(a.At(3), 2.0);
  NDArray c = a.Clone();
  c.Fill(5);
  EXPECT_EQ(a.At(0), 2.0);
  EXPECT_EQ(c.At(0), 5.0);
}

TEST(NDArray, WrapDoesNotCopyAndKeepsAlive) {
  auto buf = std::make_shared<std::vector<double>>(6, 1.5);
  NDArray v = NDArray::Wrap(buf->data(), {2, 3}, DType::kFloat64, buf);
  double* p = buf->data();
  buf.reset();  // the NDArray keeps the vector alive
  EXPECT_TRUE(v.is_view());
  EXPECT_EQ(v.data<double>(), p);
  EXPECT_EQ(v.At(5), 1.5);
  v.data<double>()[0] = 7;
  EXPECT_EQ(p[0], 7);
}

TEST(NDArray, EveryDTypeHasSizeNameAndRoundTrips) {
  const std::pair<DType, size_t> types[] = {
      {DType::kFloat32, 4}, {DType::kFloat64, 8}, {DType::kFloat16, 2}, {DType::kBFloat16, 2},
      {DType::kInt32, 4},   {DType::kInt64, 8},   {DType::kInt8, 1},    {DType::kUInt8, 1}};
  for (auto [t, sz] : types) {
    EXPECT_EQ(DTypeSize(t), sz);
    EXPECT_EQ(ParseDType(DTypeName(t)), t);
    NDArray a({5}, t);
    a.Fill(3);
    EXPECT_EQ(a.At(4), 3.0) << DTypeName(t);
    NDArray f = a.AsType(DType::kFloat32);
    EXPECT_EQ(f.At(2), 3.0);
  }
  EXPECT_THROW(ParseDType("float8"), InvalidArgument);
}

TEST(NDArray, HalfConversionsAreExactOnRepresentableValues) {
  for (float f :
       {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f})
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), f) << f;
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  // Round to nearest even: 1 + 2^-11 is halfway between 1 and 1+2^-10 -> 1.
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 0.00048828125f)), 1.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 0.00048828125f * 3)), 1.0f + 0.001953125f);
  // Every half bit pattern (finite) round-trips.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    EXPECT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h);
  }
}

TEST(NDArray, BFloat16Conversions) {
  for (float f : {0.0f, 1.0f, -3.0f, 0.5f, 1024.0f})
    EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(f)), f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.00390625f)), 1.0f);  // halfway -> even
}

TEST(NDArray, CopyFromConvertsAndChecksSize) {
  NDArray a = NDArray::FromVector({1, 2, 3, 4}, {2, 2});
  NDArray h({2, 2}, DType::kFloat16);
  h.CopyFrom(a);
  EXPECT_EQ(h.At(3), 4.0);
  NDArray wrong({3});
  EXPECT_THROW(wrong.CopyFrom(a), ShapeError);
  NDArray flat({4});
  EXPECT_THROW(flat.CopyFrom(a), ShapeError);
  flat.CopyFrom(a, /*allow_reshape=*/true);
  EXPECT_EQ(flat.At(1), 2.0);
}

TEST(NDArray, SliceAndReshapeShareMemory) {
  NDArray a = NDArray::FromVector({0, 1, 2, 3, 4, 5});
  NDArray s = a.Slice1D(2, 3);
  EXPECT_EQ(s.size(), 3);
  EXPECT_EQ(s.At(0), 2.0);
  s.data<float>()[0] = 9;
  EXPECT_EQ(a.At(2), 9.0);
  EXPECT_THROW(a.Slice1D(4, 3), InvalidArgument);
  EXPECT_EQ(a.Reshape({2, 3}).shape(), (Shape{2, 3}));
  EXPECT_THROW(a.Reshape({4}), ShapeError);
}

TEST(NDArray, SizesAre64Bit) {
  // Shape arithmetic beyond 2^31 elements without allocating.
  EXPECT_EQ(NumElements({65536, 65536}), int64_t{1} << 32);
  EXPECT_THROW(NumElements({int64_t{1} << 62, 8}), ShapeError);
  EXPECT_THROW(NumElements({-1}), ShapeError);
  // A view of a (virtual) 3 GiB range reports the right byte count.
  static char byte;
  NDArray v = NDArray::Wrap(&byte, {int64_t{3} << 30}, DType::kUInt8);
  EXPECT_EQ(v.nbytes(), size_t{3} << 30);
}

TEST(NDArray, LargerThan2GiBWorks) {
  // 2^31 + 16 uint8 elements: allocation, fill and element access past 2^31.
  const int64_t n = (int64_t{1} << 31) + 16;
  NDArray a({n}, DType::kUInt8);
  a.data<uint8_t>()[n - 1] = 7;
  EXPECT_EQ(a.At(n - 1), 7.0);
  EXPECT_EQ(a.nbytes(), static_cast<size_t>(n));
}

// Issue 22 item 5: a shape whose byte size wraps (2^53 x 256 float64 is 2^64 bytes,
// i.e. 0) allocated 64 bytes and let rows be copied before them.
TEST(NDArray, ByteSizesThatOverflowAreShapeErrors) {
  const int64_t big = int64_t{1} << 53;
  EXPECT_THROW(NDArray({big, 256}, DType::kFloat64), ShapeError);
  EXPECT_THROW(NumBytes({big, 256}, DType::kFloat64), ShapeError);
  EXPECT_THROW(NDArray({int64_t{1} << 62, 2}, DType::kInt8), ShapeError);  // elements: 2^63
  // A zero dimension does not hide an overflowing row size.
  EXPECT_THROW(NumElements({0, int64_t{1} << 40, int64_t{1} << 40}), ShapeError);
  EXPECT_THROW(NDArray({0, int64_t{1} << 61}, DType::kFloat64), ShapeError);
  float x = 0;
  EXPECT_THROW(NDArray::Wrap(&x, {int64_t{1} << 62, 4}, DType::kFloat32), ShapeError);
  EXPECT_EQ(NumBytes({3, 5}, DType::kFloat64), 120u);
  EXPECT_EQ(NumBytes({0, 5}, DType::kFloat64), 0u);
  NDArray a({4});
  EXPECT_THROW(a.Slice1D(INT64_MAX, 2), InvalidArgument);  // begin + count wrapped
}
