#include "pskv/row_sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/dtype_dispatch.h"
#include "pskv/error.h"
#include "sparse/sparse_ops.h"

namespace pskv {

struct RowSparseNDArray::Impl {
  Shape shape;
  DType dtype = DType::kFloat32;
  NDArray indices;  // int64 (nnz)
  NDArray data;     // (nnz, shape[1:]...)
};

namespace {

Shape RowsShape(const Shape& full, int64_t nnz) {
  Shape s = full;
  s[0] = nnz;
  return s;
}

int64_t RowSizeOf(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 1; i < s.size(); ++i) n *= s[i];
  return n;
}

// Also bounds every row offset: the dense table's bytes (id * row bytes for every
// id < shape[0]) fit in 63 bits, checked once here (the shape comes from users).
void CheckShape(const Shape& shape, DType dtype) {
  if (shape.empty())
    throw ShapeError("a row_sparse array needs at least one dimension (the rows); got a scalar");
  NumBytes(shape, dtype);  // negative dimensions, element and byte counts that overflow
}

// Row ids of any integer (or integral float) array as int64, unchecked order.
std::vector<int64_t> IdsOf(const NDArray& ids) {
  std::vector<int64_t> out(static_cast<size_t>(ids.size()));
  DispatchDType(ids.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = ids.data<T>();
    for (int64_t i = 0; i < ids.size(); ++i) {
      const double v = ToDouble(p[i]);
      if (v != std::floor(v) || !std::isfinite(v))
        throw InvalidArgument("row id " + std::to_string(v) + " is not a whole number");
      out[static_cast<size_t>(i)] = static_cast<int64_t>(v);
    }
  });
  return out;
}

void CheckRange(int64_t id, int64_t num_rows) {
  if (id < 0 || id >= num_rows)
    throw KeyError("row id " + std::to_string(id) + " is out of range: the array has " +
                   std::to_string(num_rows) + " rows (valid ids 0.." +
                   std::to_string(num_rows - 1) + ")");
}

}  // namespace

RowSparseNDArray::RowSparseNDArray(Shape shape, DType dtype) : impl_(std::make_shared<Impl>()) {
  CheckShape(shape, dtype);
  impl_->shape = std::move(shape);
  impl_->dtype = dtype;
  impl_->indices = NDArray(Shape{0}, DType::kInt64);
  impl_->data = NDArray(RowsShape(impl_->shape, 0), dtype);
}

RowSparseNDArray::Impl& RowSparseNDArray::impl() const {
  if (!impl_) throw UsageError("use of an empty RowSparseNDArray handle");
  return *impl_;
}

const Shape& RowSparseNDArray::shape() const {
  return impl().shape;
}
DType RowSparseNDArray::dtype() const {
  return impl().dtype;
}
int64_t RowSparseNDArray::num_rows() const {
  return impl().shape[0];
}
int64_t RowSparseNDArray::RowSize() const {
  return RowSizeOf(impl().shape);
}
int64_t RowSparseNDArray::nnz() const {
  return impl().indices.size();
}
const NDArray& RowSparseNDArray::indices() const {
  return impl().indices;
}
const NDArray& RowSparseNDArray::data() const {
  return impl().data;
}

RowSparseNDArray RowSparseNDArray::FromRows(Shape shape, const NDArray& row_ids,
                                            const NDArray& rows) {
  CheckShape(shape, rows.dtype());
  const int64_t u = RowSizeOf(shape);
  if (row_ids.shape().size() > 1)
    throw ShapeError("row ids must be 1-D; got shape " + ShapeToString(row_ids.shape()));
  int64_t need;
  if (__builtin_mul_overflow(row_ids.size(), u, &need) || rows.size() != need)
    throw ShapeError("row_sparse rows have " + std::to_string(rows.size()) + " elements but " +
                     std::to_string(row_ids.size()) + " row ids of rows of " + std::to_string(u) +
                     " elements (shape " + ShapeToString(shape) + ") need that many rows");
  std::vector<int64_t> ids = IdsOf(row_ids);
  for (int64_t id : ids) CheckRange(id, shape[0]);
  std::vector<int64_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return ids[static_cast<size_t>(a)] < ids[static_cast<size_t>(b)];
  });
  int64_t nnz = 0;
  for (size_t i = 0; i < order.size(); ++i)
    if (i == 0 || ids[static_cast<size_t>(order[i])] != ids[static_cast<size_t>(order[i - 1])])
      ++nnz;
  RowSparseNDArray out(shape, rows.dtype());
  Impl& o = *out.impl_;
  o.indices = NDArray(Shape{nnz}, DType::kInt64);
  o.data = NDArray(RowsShape(shape, nnz), rows.dtype());
  const size_t rb = static_cast<size_t>(u) * DTypeSize(rows.dtype());
  const char* src = static_cast<const char*>(rows.raw());
  char* dst = static_cast<char*>(o.data.raw());
  int64_t* oi = o.indices.data<int64_t>();
  int64_t at = -1;
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t id = ids[static_cast<size_t>(order[i])];
    const char* row = src + static_cast<size_t>(order[i]) * rb;
    if (at >= 0 && oi[at] == id) {  // a repeated id: its rows are summed
      sparse::AddElements(rows.dtype(), row, dst + static_cast<size_t>(at) * rb, u);
    } else {
      oi[++at] = id;
      std::memcpy(dst + static_cast<size_t>(at) * rb, row, rb);
    }
  }
  return out;
}

RowSparseNDArray RowSparseNDArray::FromDense(const NDArray& dense) {
  CheckShape(dense.shape(), dense.dtype());
  const int64_t R = dense.shape()[0], u = RowSizeOf(dense.shape());
  const size_t es = DTypeSize(dense.dtype()), rb = static_cast<size_t>(u) * es;
  std::vector<int64_t> present;
  const char* p = static_cast<const char*>(dense.raw());
  for (int64_t r = 0; r < R; ++r) {
    const char* row = p + static_cast<size_t>(r) * rb;
    bool nz = false;
    DispatchDType(dense.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = reinterpret_cast<const T*>(row);
      for (int64_t j = 0; j < u && !nz; ++j) nz = ToDouble(x[j]) != 0;
    });
    if (nz) present.push_back(r);
  }
  RowSparseNDArray out(dense.shape(), dense.dtype());
  out.impl_->indices = NDArray(Shape{static_cast<int64_t>(present.size())}, DType::kInt64);
  std::copy(present.begin(), present.end(), out.impl_->indices.data<int64_t>());
  out.impl_->data = sparse::Gather(dense, present.data(), static_cast<int64_t>(present.size()), u)
                        .Reshape(RowsShape(dense.shape(), static_cast<int64_t>(present.size())));
  return out;
}

NDArray RowSparseNDArray::ToDense() const {
  const Impl& s = impl();
  NDArray out(s.shape, s.dtype);
  sparse::Scatter(s.data, s.indices.data<int64_t>(), s.indices.size(), RowSize(), &out, false);
  return out;
}

RowSparseNDArray RowSparseNDArray::Clone() const {
  const Impl& s = impl();
  RowSparseNDArray out;
  out.impl_ = std::make_shared<Impl>(Impl{s.shape, s.dtype, s.indices.Clone(), s.data.Clone()});
  return out;
}

void RowSparseNDArray::Assign(const RowSparseNDArray& src) const {
  Impl& d = impl();
  const Impl& s = src.impl();
  if (s.dtype != d.dtype || RowSizeOf(s.shape) != RowSizeOf(d.shape) || s.shape[0] != d.shape[0])
    throw ShapeError("row_sparse output has shape " + ShapeToString(d.shape) + " " +
                     DTypeName(d.dtype) + " but the value is " + ShapeToString(s.shape) + " " +
                     DTypeName(s.dtype));
  d.indices = s.indices;
  d.data = s.data;
}

NDArray CanonicalRowIds(const NDArray& row_ids, int64_t num_rows) {
  std::vector<int64_t> ids = IdsOf(row_ids);
  for (int64_t id : ids) CheckRange(id, num_rows);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  NDArray out(Shape{static_cast<int64_t>(ids.size())}, DType::kInt64);
  std::copy(ids.begin(), ids.end(), out.data<int64_t>());
  return out;
}

// ------------------------------------------------------------------ sparse ops

namespace sparse {

void AddElements(DType t, const void* src, void* dst, int64_t n) {
  DispatchDType(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* s = static_cast<const T*>(src);
    T* d = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = Store<T>(Load(d[i]) + Load(s[i]));
  });
}

RowSparseNDArray Sum(const std::vector<RowSparseNDArray>& values) {
  if (values.empty()) throw InvalidArgument("sum of no row_sparse values");
  if (values.size() == 1) return values[0];
  const RowSparseNDArray& v0 = values[0];
  int64_t total = 0;
  for (auto& v : values) {
    if (v.dtype() != v0.dtype() || v.shape() != v0.shape())
      throw ShapeError("row_sparse values of one key differ: " + ShapeToString(v0.shape()) + " " +
                       DTypeName(v0.dtype()) + " and " + ShapeToString(v.shape()) + " " +
                       DTypeName(v.dtype()));
    total += v.nnz();
  }
  int64_t elements;
  if (__builtin_mul_overflow(total, v0.RowSize(), &elements))
    throw ShapeError("the sum of " + std::to_string(values.size()) + " row_sparse values has " +
                     std::to_string(total) + " rows: too many to hold");
  NDArray ids(Shape{total}, DType::kInt64), rows(Shape{elements}, v0.dtype());
  int64_t at = 0;
  const size_t rb = static_cast<size_t>(v0.RowSize()) * DTypeSize(v0.dtype());
  for (auto& v : values) {
    std::memcpy(ids.data<int64_t>() + at, v.indices().raw(), static_cast<size_t>(v.nnz()) * 8);
    std::memcpy(static_cast<char*>(rows.raw()) + static_cast<size_t>(at) * rb, v.data().raw(),
                static_cast<size_t>(v.nnz()) * rb);
    at += v.nnz();
  }
  // FromRows's stable sort keeps the values' order among equal ids: added in order.
  return RowSparseNDArray::FromRows(v0.shape(), ids, rows);
}

NDArray Gather(const NDArray& table, const int64_t* ids, int64_t n, int64_t row_size) {
  NDArray out(Shape{n, row_size}, table.dtype());
  const size_t rb = static_cast<size_t>(row_size) * DTypeSize(table.dtype());
  const char* src = static_cast<const char*>(table.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst + static_cast<size_t>(i) * rb, src + static_cast<size_t>(ids[i]) * rb, rb);
  return out;
}

void Scatter(const NDArray& rows, const int64_t* ids, int64_t n, int64_t row_size, NDArray* table,
             bool add) {
  const size_t rb = static_cast<size_t>(row_size) * DTypeSize(table->dtype());
  const char* src = static_cast<const char*>(rows.raw());
  char* dst = static_cast<char*>(table->raw());
  for (int64_t i = 0; i < n; ++i) {
    char* d = dst + static_cast<size_t>(ids[i]) * rb;
    const char* s = src + static_cast<size_t>(i) * rb;
    if (add)
      AddElements(table->dtype(), s, d, row_size);
    else
      std::memcpy(d, s, rb);
  }
}

}  // namespace sparse
}  // namespace pskv
