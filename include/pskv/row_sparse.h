// RowSparseNDArray: MXNet's `row_sparse` storage type — a 2-D (or N-D) array of
// which only some rows are present; every other row is zero. It is what a gradient
// of an embedding table looks like (the rows of the ids a batch used), and what a
// KVStore row_sparse key holds and serves (KVStore::RowSparsePull).
//
//   shape    the full shape, shape[0] = number of rows (N-D: a "row" is one slice
//            along the first axis, of RowSize() = prod(shape[1:]) elements)
//   indices  int64, 1-D, the present rows, strictly ascending
//   data     shape (indices.size(), shape[1:]...), the present rows' values
//
// The canonical form (ascending, unique indices) is an invariant: FromRows sorts
// the row ids it is given and sums the rows of repeated ids (as torch's coalesce()
// does for an uncoalesced sparse gradient of nn.Embedding(sparse=True)).
//
// Like NDArray, a RowSparseNDArray is a handle: copies share one array, and an
// array passed to an asynchronous KVStore call (RowSparsePull's outputs) receives
// its result in place — read it only after Wait/WaitAll. Clone() makes a deep copy.
// Thread safety: as NDArray (concurrent reads are safe).
#pragma once

#include <memory>

#include "pskv/ndarray.h"

namespace pskv {

class RowSparseNDArray {
 public:
  /// An empty handle (no shape); `empty()` is true.
  RowSparseNDArray() = default;
  /// An all-zero array (no rows present) of `shape` (at least one dimension).
  explicit RowSparseNDArray(Shape shape, DType dtype = DType::kFloat32);
  /// From rows: `row_ids` (1-D, any integer dtype, each in [0, shape[0]); may be
  /// unsorted and repeat) and `rows` of shape (row_ids.size(), shape[1:]...) or any
  /// shape of that many elements, of `rows.dtype()`. Repeated ids are summed.
  /// Throws ShapeError / KeyError (id out of range) / InvalidArgument.
  static RowSparseNDArray FromRows(Shape shape, const NDArray& row_ids, const NDArray& rows);
  /// The rows of `dense` that hold a nonzero element (MXNet's tostype('row_sparse')).
  static RowSparseNDArray FromDense(const NDArray& dense);

  bool empty() const { return impl_ == nullptr; }
  const Shape& shape() const;
  DType dtype() const;
  /// shape[0].
  int64_t num_rows() const;
  /// Elements per row: prod(shape[1:]) (1 for a 1-D array).
  int64_t RowSize() const;
  /// Number of present rows.
  int64_t nnz() const;
  /// int64 (nnz), ascending and unique.
  const NDArray& indices() const;
  /// (nnz, shape[1:]...) of dtype().
  const NDArray& data() const;

  /// The dense array (zeros in the absent rows).
  NDArray ToDense() const;
  /// Deep copy.
  RowSparseNDArray Clone() const;
  /// Replaces this array's content (shared by every copy of the handle) with `src`'s
  /// indices and data; shapes must agree in shape[1:] and dtype (ShapeError).
  void Assign(const RowSparseNDArray& src) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  Impl& impl() const;
};

/// Sorted, unique int64 row ids from any integer (or integral float) array of any
/// shape, as MXNet does for row_sparse_pull's `row_ids` (flatten, cast to int64,
/// unique, sort). KeyError if an id is negative or >= `num_rows`.
NDArray CanonicalRowIds(const NDArray& row_ids, int64_t num_rows);

}  // namespace pskv
