#include <gtest/gtest.h>

#include <cstring>

#include "kvstore/reduce.h"
#include "pskv/error.h"

using namespace pskv;

namespace {
std::vector<NDArray> Sources(int k, int64_t n, DType t) {
  std::vector<NDArray> v;
  for (int s = 0; s < k; ++s) {
    NDArray a({n}, t);
    for (int64_t i = 0; i < n; ++i) {
      NDArray one = NDArray::FromVector({static_cast<float>((i % 7) + s)});
      a.Slice1D(i, 1).CopyFrom(one.AsType(t), true);
    }
    v.push_back(a);
  }
  return v;
}
}  // namespace

class ReduceAllTypes : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(ReduceAllTypes, SumsExactly) {
  auto [t, k] = GetParam();
  const int64_t n = 1000;
  Reducer r(/*bound=*/256, /*threads=*/3);  // bound below n: the threaded path runs
  auto srcs = Sources(k, n, t);
  NDArray dst({n}, t);
  r.Sum(srcs, &dst);
  for (int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (int s = 0; s < k; ++s) want += (i % 7) + s;
    ASSERT_EQ(dst.At(i), want) << "i=" << i << " dtype=" << DTypeName(t) << " k=" << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, ReduceAllTypes,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat64,
                                                              DType::kFloat16, DType::kBFloat16,
                                                              DType::kInt32, DType::kInt64,
                                                              DType::kInt8, DType::kUInt8),
                                            ::testing::Values(1, 2, 3, 4, 5, 9)));

TEST(Reduce, ThreadedAndSerialAgree) {
  const int64_t n = (1 << 20) + 37;
  std::vector<NDArray> srcs;
  for (int s = 0; s < 6; ++s) {
    NDArray a({n});
    for (int64_t i = 0; i < n; ++i)
      a.data<float>()[i] = 0.1f * static_cast<float>((i * (s + 3)) % 101);
    srcs.push_back(a);
  }
  Reducer serial(INT64_MAX, 1), threaded(1000, 4);
  NDArray a({n}), b({n});
  serial.Sum(srcs, &a);
  threaded.Sum(srcs, &b);
  ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

TEST(Reduce, Float16AccumulatesInFloat32) {
  // 2048 + 1 + 1 in half: pairwise half sums would lose the ones (2049 is not
  // representable); float32 accumulation gives exactly 2050.
  Reducer r(1 << 20, 1);
  NDArray a({1}, DType::kFloat16), b({1}, DType::kFloat16), c({1}, DType::kFloat16);
  a.Fill(2048);
  b.Fill(1);
  c.Fill(1);
  NDArray d({1}, DType::kFloat16);
  r.Sum({a, b, c}, &d);
  EXPECT_EQ(d.At(0), 2050.0);
}

TEST(Reduce, DestinationMayAliasAnySource) {
  Reducer r(1 << 20, 1);
  NDArray a = NDArray::FromVector({1, 2}), b = NDArray::FromVector({10, 20});
  r.Sum({a, b}, &b);
  EXPECT_EQ(b.ToDoubles(), (std::vector<double>{11, 22}));
}

TEST(Reduce, MismatchIsAnError) {
  Reducer r(1 << 20, 1);
  NDArray a({3}), b({4}), d({3});
  EXPECT_THROW(r.Sum({a, b}, &d), ShapeError);
  NDArray h({3}, DType::kFloat16);
  EXPECT_THROW(r.Sum({a, h}, &d), ShapeError);
  EXPECT_THROW(r.Sum({}, &d), InvalidArgument);
}
