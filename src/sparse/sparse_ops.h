// Row operations on row_sparse values shared by the local store, the dist worker
// and the dist server: sums of row-sparse arrays (union of rows), gathers and
// scatters between a dense row table and (row ids, rows), for every pskv dtype.
// float16/bfloat16 rows are added in float32 and rounded once per addition.
#pragma once

#include <cstdint>
#include <vector>

#include "pskv/ndarray.h"
#include "pskv/row_sparse.h"

namespace pskv::sparse {

/// dst[0..n) += src[0..n), both of dtype `t`.
void AddElements(DType t, const void* src, void* dst, int64_t n);

/// The sum of `values` (all of one shape[1:] and dtype): the union of their rows,
/// rows present in several values added (in the order given). Canonical result.
RowSparseNDArray Sum(const std::vector<RowSparseNDArray>& values);

/// Rows `ids` (ascending int64, each < table rows) of `table` (R x row elements,
/// any shape whose first dim is R) as a new array of shape (ids.size(), row elements).
NDArray Gather(const NDArray& table, const int64_t* ids, int64_t n, int64_t row_size);

/// table rows ids[i] = rows[i] (`add`: +=). rows has n * row_size elements.
void Scatter(const NDArray& rows, const int64_t* ids, int64_t n, int64_t row_size, NDArray* table,
             bool add);

}  // namespace pskv::sparse
