// row_sparse keys on the single-machine stores (issue 15): MXNet's
// test_kvstore.py row_sparse cases (test_row_sparse_pull, the updater and
// aggregator tests with stype='row_sparse') with exact expected values, the
// storage-type errors (spec 2.9, 2.14) and the sparse optimizer rules.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/optimizer.h"
#include "pskv/row_sparse.h"

using namespace pskv;

namespace {
const Shape kShape = {4, 4};

NDArray Full(Shape s, double v, DType t = DType::kFloat32) {
  NDArray a(s, t);
  a.Fill(v);
  return a;
}
NDArray Ids(const std::vector<int64_t>& v, Shape s = {}) {
  NDArray a(s.empty() ? Shape{static_cast<int64_t>(v.size())} : s, DType::kInt64);
  for (size_t i = 0; i < v.size(); ++i) a.data<int64_t>()[i] = v[i];
  return a;
}
// A row_sparse value with rows `ids` all equal to `v`.
RowSparseNDArray Rows(const std::vector<int64_t>& ids, double v, Shape s = kShape,
                      DType t = DType::kFloat32) {
  Shape rs = s;
  rs[0] = static_cast<int64_t>(ids.size());
  return RowSparseNDArray::FromRows(s, Ids(ids), Full(rs, v, t));
}
std::unique_ptr<KVStore> Make(const std::string& type = "local") {
  Options o;
  return KVStore::Create(type, o);
}
std::vector<int64_t> IndicesOf(const RowSparseNDArray& a) {
  return {a.indices().data<int64_t>(), a.indices().data<int64_t>() + a.nnz()};
}
}  // namespace

TEST(RowSparseArray, FromRowsSortsAndSumsRepeatedIds) {
  // torch's uncoalesced sparse gradient of nn.Embedding: ids 3, 1, 3.
  NDArray rows = NDArray::FromVector({1, 1, 2, 2, 4, 4}, {3, 2});
  auto a = RowSparseNDArray::FromRows({5, 2}, Ids({3, 1, 3}), rows);
  EXPECT_EQ(IndicesOf(a), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(a.data().ToDoubles(), (std::vector<double>{2, 2, 5, 5}));
  EXPECT_EQ(a.ToDense().ToDoubles(), (std::vector<double>{0, 0, 2, 2, 0, 0, 5, 5, 0, 0}));
  EXPECT_THROW(RowSparseNDArray::FromRows({5, 2}, Ids({5}), Full({1, 2}, 1)), KeyError);
  EXPECT_THROW(RowSparseNDArray::FromRows({5, 2}, Ids({1, 2}), Full({1, 2}, 1)), ShapeError);
  auto d = RowSparseNDArray::FromDense(a.ToDense());
  EXPECT_EQ(IndicesOf(d), (std::vector<int64_t>{1, 3}));
}

class SparseStores : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Types, SparseStores, ::testing::Values("local", "device"));

// MXNet test_row_sparse_pull: init ones, pull random (repeating, unsorted, 2-D) row
// ids into 1..3 outputs: requested rows are 1, all others 0.
// Issue 22 item 5: (2^53, 256) float64 passed the element-count check, its bytes
// wrapped to 0 and the local store copied a 2 KiB row before a 64-byte block.
TEST(RowSparseArray, ShapesWhoseBytesOverflowAreShapeErrors) {
  const Shape huge = {int64_t{1} << 53, 256};
  EXPECT_THROW(RowSparseNDArray(huge, DType::kFloat64), ShapeError);
  NDArray ids({1}, DType::kInt64), rows({1, 256}, DType::kFloat64);
  ids.data<int64_t>()[0] = 5;
  EXPECT_THROW(RowSparseNDArray::FromRows(huge, ids, rows), ShapeError);
  // rows x row size wrapping to the rows' element count
  NDArray four({4}, DType::kInt64);
  EXPECT_THROW(RowSparseNDArray::FromRows({8, int64_t{1} << 62}, four, NDArray({0})), ShapeError);
  for (const char* type : {"local", "device"}) {
    auto kv = KVStore::Create(type);
    RowSparseNDArray small({8, 256}, DType::kFloat64);
    EXPECT_THROW(kv->RowSparsePull(0, {RowSparseNDArray(huge, DType::kFloat64)}, {ids}),
                 ShapeError);
    kv->Init(0, small);
    kv->WaitAll();
  }
}

TEST_P(SparseStores, RowSparsePullOfRandomIds) {
  auto kv = Make(GetParam());
  kv->Init(7, RowSparseNDArray::FromDense(Full(kShape, 1)));
  const std::vector<std::vector<int64_t>> idsets = {{3, 0, 3, 3}, {2, 2, 1, 0}, {1, 1, 1, 1}};
  for (size_t count = 1; count <= 3; ++count) {
    std::vector<RowSparseNDArray> outs;
    std::vector<NDArray> ids;
    for (size_t i = 0; i < count; ++i) {
      outs.emplace_back(kShape);
      ids.push_back(Ids(idsets[i], {2, 2}));
    }
    kv->RowSparsePull(7, outs, ids);
    kv->WaitAll();
    for (size_t i = 0; i < count; ++i) {
      std::set<int64_t> want(idsets[i].begin(), idsets[i].end());
      EXPECT_EQ(IndicesOf(outs[i]), std::vector<int64_t>(want.begin(), want.end()));
      auto dense = outs[i].ToDense();
      for (int64_t r = 0; r < 4; ++r)
        for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(dense.At(r * 4 + c), want.count(r) ? 1 : 0);
    }
  }
  // One row_ids array for several outputs: every output gets those rows.
  std::vector<RowSparseNDArray> outs = {RowSparseNDArray(kShape), RowSparseNDArray(kShape)};
  kv->RowSparsePull(7, outs, {Ids({2})});
  kv->WaitAll();
  for (auto& o : outs) EXPECT_EQ(IndicesOf(o), (std::vector<int64_t>{2}));
  // Empty row ids: an empty result.
  RowSparseNDArray empty(kShape);
  kv->RowSparsePull(7, {empty}, {Ids({})});
  kv->WaitAll();
  EXPECT_EQ(empty.nnz(), 0);
}

// MXNet test_updater / check_updater with stype row_sparse: updater `local += recv`,
// values of 4 devices summed; only pushed rows change.
TEST_P(SparseStores, UpdaterSeesSumOfDevices) {
  auto kv = Make(GetParam());
  kv->Init(3, RowSparseNDArray::FromDense(Full(kShape, 1)));
  kv->SetUpdater([](int, const NDArray& recv, NDArray* local) {
    for (int64_t i = 0; i < local->size(); ++i) local->data<float>()[i] += recv.data<float>()[i];
  });
  const int num_devs = 4, num_push = 4;
  for (int p = 0; p < num_push; ++p) {
    std::vector<RowSparseNDArray> vals;
    for (int d = 0; d < num_devs; ++d) vals.push_back(Rows({0, 2}, 1));
    kv->Push(3, vals);
  }
  RowSparseNDArray out(kShape);
  kv->RowSparsePull(3, {out}, {Ids({0, 1, 2, 3})});
  kv->WaitAll();
  auto dense = out.ToDense();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 4; ++c)
      EXPECT_EQ(dense.At(r * 4 + c), (r == 0 || r == 2) ? 1 + num_devs * num_push : 1);
}

// No updater: the stored value becomes the pushed sum (union of rows; rows not
// pushed become zero, MXNet's assignment); an empty push stores zeros.
TEST_P(SparseStores, PushWithoutUpdaterAssignsTheSum) {
  auto kv = Make(GetParam());
  kv->Init(1, RowSparseNDArray::FromDense(Full(kShape, 9)));
  kv->Push(1, {Rows({1}, 2), Rows({3, 1}, 3)});
  RowSparseNDArray out(kShape);
  kv->RowSparsePull(1, {out}, {Ids({0, 1, 2, 3})});
  kv->WaitAll();
  EXPECT_EQ(out.ToDense().ToDoubles(),
            (std::vector<double>{0, 0, 0, 0, 5, 5, 5, 5, 0, 0, 0, 0, 3, 3, 3, 3}));
  kv->Push(1, {RowSparseNDArray(kShape)});
  kv->RowSparsePull(1, {out}, {Ids({1})});
  kv->WaitAll();
  EXPECT_EQ(out.ToDense().ToDoubles(), std::vector<double>(16, 0));
}

TEST_P(SparseStores, EveryDtype) {
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                  DType::kInt32, DType::kInt64, DType::kInt8, DType::kUInt8}) {
    auto kv = Make(GetParam());
    kv->Init(0, RowSparseNDArray::FromDense(Full({3, 2}, 1, t)));
    kv->SetUpdater([](int, const NDArray& recv, NDArray* local) {
      NDArray sum = local->AsType(DType::kFloat64);
      NDArray r = recv.AsType(DType::kFloat64);
      for (int64_t i = 0; i < sum.size(); ++i) sum.data<double>()[i] += r.data<double>()[i];
      local->CopyFrom(sum);
    });
    kv->Push(0, {Rows({2, 2}, 3, {3, 2}, t)});
    RowSparseNDArray out({3, 2}, t);
    kv->RowSparsePull(0, {out}, {Ids({2, 0})});
    kv->WaitAll();
    EXPECT_EQ(out.dtype(), t);
    EXPECT_EQ(out.ToDense().ToDoubles(), (std::vector<double>{1, 1, 0, 0, 7, 7})) << DTypeName(t);
  }
}

TEST_P(SparseStores, StorageTypeRulesAreTypedErrors) {
  auto kv = Make(GetParam());
  kv->Init(0, RowSparseNDArray::FromDense(Full(kShape, 1)));
  kv->Init(1, Full(kShape, 1));
  NDArray dense = Full(kShape, 0);
  EXPECT_THROW(kv->Pull(0, {dense}), UsageError);  // dense pull of row_sparse
  EXPECT_THROW(kv->Push(0, {dense}), UsageError);  // dense push to row_sparse
  EXPECT_THROW(kv->PushPull(0, {dense}, {dense}), UsageError);
  EXPECT_THROW(kv->Push(1, {Rows({0}, 1)}), UsageError);  // row_sparse push to dense
  RowSparseNDArray out(kShape);
  EXPECT_THROW(kv->RowSparsePull(1, {out}, {Ids({0})}), UsageError);
  EXPECT_THROW(kv->RowSparsePull(0, {out}, {Ids({4})}), KeyError);  // row id out of range
  EXPECT_THROW(kv->RowSparsePull(0, {out}, {Ids({-1})}), KeyError);
  EXPECT_THROW(kv->Init(0, RowSparseNDArray::FromDense(Full(kShape, 1))), KeyError);  // twice
  EXPECT_THROW(kv->Push(0, {Rows({0}, 1, {4, 3})}), ShapeError);
  EXPECT_THROW(kv->Push(0, {Rows({0}, 1, kShape, DType::kFloat64)}), ShapeError);
  EXPECT_THROW(kv->RowSparsePull(0, {out, out}, {Ids({0}), Ids({1}), Ids({2})}), InvalidArgument);
  try {
    kv->Pull(0, {dense});
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("row_sparse_pull"), std::string::npos) << e.what();
  }
}

TEST(SparseStores, CompressionOnSparseKeysIsRefused) {
  auto kv = Make("device");
  CompressionConfig c;
  c.type = "2bit";
  kv->SetGradientCompression(c);
  EXPECT_THROW(kv->Init(0, RowSparseNDArray::FromDense(Full(kShape, 1))), UsageError);
}

// Lazy SGD (MXNet sgd lazy_update=True with momentum and wd): rows not pushed keep
// their weight and momentum; pushed rows follow the dense rule.
TEST(SparseOptimizer, LazySgdMomentumTouchesOnlyPushedRows) {
  auto kv = Make("local");
  OptimizerConfig c;
  c.type = "sgd";
  c.learning_rate = 0.1;
  c.momentum = 0.9;
  c.wd = 0.01;
  kv->SetOptimizer(c);
  kv->Init(0, RowSparseNDArray::FromDense(Full({3, 2}, 1)));
  kv->Push(0, {Rows({1}, 0.5, {3, 2})});
  kv->Push(0, {Rows({1}, 0.5, {3, 2})});
  kv->Push(0, {Rows({2}, 1.0, {3, 2})});
  RowSparseNDArray out({3, 2});
  kv->RowSparsePull(0, {out}, {Ids({0, 1, 2})});
  kv->WaitAll();
  // Row 1: m1 = -0.1*(0.5+0.01) = -0.051, w1 = 0.949;
  //        m2 = 0.9*-0.051 - 0.1*(0.5 + 0.01*0.949) = -0.096849, w2 = 0.852151.
  // Row 2: one step: w = 1 - 0.1*(1 + 0.01) = 0.899.  Row 0: untouched.
  auto d = out.ToDense().ToDoubles();
  EXPECT_EQ(d[0], 1.0);
  EXPECT_NEAR(d[2], 0.852151, 1e-6);
  EXPECT_NEAR(d[4], 0.899, 1e-6);
}

TEST(SparseOptimizer, NonLazySgdAppliesWeightDecayToEveryRow) {
  auto kv = Make("local");
  OptimizerConfig c;
  c.type = "sgd";
  c.learning_rate = 0.1;
  c.wd = 0.5;
  c.lazy_update = false;
  kv->SetOptimizer(c);
  kv->Init(0, RowSparseNDArray::FromDense(Full({2, 1}, 1)));
  kv->Push(0, {Rows({1}, 1, {2, 1})});
  RowSparseNDArray out({2, 1});
  kv->RowSparsePull(0, {out}, {Ids({0, 1})});
  kv->WaitAll();
  EXPECT_NEAR(out.ToDense().At(0), 1 - 0.1 * 0.5, 1e-7);
  EXPECT_NEAR(out.ToDense().At(1), 1 - 0.1 * 1.5, 1e-7);
}

// Adam and AdaGrad on rows equal the dense rule applied to those rows (MXNet's
// lazy adam and sparse adagrad), and leave other rows and their states alone.
TEST(SparseOptimizer, AdamAndAdagradRowsEqualDenseRule) {
  for (const char* type : {"adam", "adagrad"}) {
    OptimizerConfig c;
    c.type = type;
    c.learning_rate = 0.05;
    Optimizer sparse_opt(c), dense_opt(c);
    NDArray table = Full({4, 3}, 1), dense_row = Full({3}, 1);
    const int64_t ids[] = {2};
    for (int step = 0; step < 3; ++step) {
      NDArray g = NDArray::FromVector({0.1f * static_cast<float>(step + 1), -0.2f, 0.3f}, {1, 3});
      sparse_opt.UpdateRows(0, ids, 1, g, 3, &table);
      dense_opt.Update(0, g.Reshape({3}), &dense_row);
    }
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_FLOAT_EQ(static_cast<float>(table.At(2 * 3 + j)), static_cast<float>(dense_row.At(j)))
          << type;
      EXPECT_EQ(table.At(j), 1.0) << type;  // row 0 untouched
    }
  }
}
