// pskv::Trainer's sparse parameters (docs/sparse.md): row_sparse keys whose gradients
// are pushed as the rows they have and whose rows are pulled into the local weight.
#include <string>
#include <vector>

#include "pskv/error.h"
#include "pskv/row_sparse.h"
#include "trainer_impl.h"

namespace pskv {
namespace trainer_detail {

NDArray RowIds(const torch::Tensor& ids) {
  return TensorView(ids.detach().to(torch::kLong).reshape({-1}).contiguous()).Clone();
}

void PullRows(Trainer::Impl& m, size_t i, const NDArray& ids) {
  const torch::Tensor& w = m.replicas[0][i];
  RowSparseNDArray out(m.weights0[i].shape(), m.weights0[i].dtype());
  m.kv->RowSparsePull(m.Key(i), {out}, {ids});
  m.kv->Wait(std::vector<int>{m.Key(i)});
  if (out.nnz() == 0) return;
  torch::NoGradGuard no_grad;
  auto idx = torch::from_blob(out.indices().raw(), {out.nnz()}, torch::kLong);
  std::vector<int64_t> rs(w.sizes().begin(), w.sizes().end());
  rs[0] = out.nnz();
  auto rows = torch::from_blob(out.data().raw(), rs, w.options().requires_grad(false));
  w.detach().index_copy_(0, idx, rows);
}

NDArray PushRows(Trainer::Impl& m, size_t i, double ratio) {
  const torch::Tensor& p = m.replicas[0][i];
  const Shape shape(p.sizes().begin(), p.sizes().end());
  torch::Tensor g = p.grad();
  RowSparseNDArray rsp(shape, m.weights0[i].dtype());
  if (g.defined()) {
    g = g.detach();
    if (!g.is_sparse()) g = g.to_sparse(1);  // a dense gradient: its nonzero rows
    if (ratio != 1.0) g = g * ratio;
    g = g.coalesce();
    rsp = RowSparseNDArray::FromRows(shape, RowIds(g.indices()[0]),
                                     TensorView(g.values().contiguous()));
  }
  m.kv->Push(m.Key(i), std::vector<RowSparseNDArray>{rsp}, static_cast<int>(i));
  return rsp.indices();
}
}  // namespace trainer_detail

void Trainer::RowSparsePull(size_t index, const torch::Tensor& row_ids) {
  Impl& m = *impl_;
  if (!m.Sparse(index))
    throw InvalidArgument("RowSparsePull: parameter " + std::to_string(index) +
                          " is not a sparse parameter of this Trainer");
  trainer_detail::PullRows(m, index, trainer_detail::RowIds(row_ids));
  m.RecordVersions();  // our own write, not a change from outside
}

}  // namespace pskv
