// The worker side of a dynamic embedding table's batch (include/pskv/embedding.h):
// the checks of a call's arrays and the de-duplication of its ids, shared by the
// local table (local_table.h) and the dist one (kvstore/distributed/worker/
// embedding_worker.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pskv/embedding.h"
#include "pskv/ndarray.h"

namespace pskv::embedding {

/// A batch's distinct ids in order of first appearance; where[i] is the index in
/// `ids` of the i-th id of the batch.
struct Distinct {
  std::vector<uint64_t> ids;
  std::vector<uint32_t> where;
};

/// The ids of a call: int64 on the host (InvalidArgument naming the fix otherwise).
const uint64_t* CheckIds(const NDArray& ids, const EmbeddingConfig& cfg, const char* call);
/// The gradients of a push of `n` ids: float32 on the host, n * width elements
/// (ShapeError naming the fix otherwise).
const float* CheckGrads(const NDArray& grads, int64_t n, const EmbeddingConfig& cfg);
/// The distinct ids of ids[0..n).
Distinct DistinctOf(const uint64_t* ids, int64_t n);
/// The sums of the gradient rows of each distinct id (in order of appearance):
/// d.ids.size() * width floats.
std::vector<float> SumGrads(const Distinct& d, const float* grads, int64_t n, int64_t width);

}  // namespace pskv::embedding
