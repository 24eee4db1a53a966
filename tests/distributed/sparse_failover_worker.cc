// A dist_sync training loop with row_sparse keys for the failover tests
// (tests/distributed/test_failover_sparse.cc): Adam (lazy row updates) with weight decay and
// a step schedule on a row_sparse table sliced over every server by rows, a small
// row_sparse table held by one server, and a dense key; each worker pushes a
// different subset of rows each round, with gradients that are a function of (rank,
// round, key, row), so an undisturbed job gives the same bits every time.
//
//   sparse_failover_worker ROUNDS OUT_DIR
//
// After round r it creates OUT_DIR/w<rank>.r<r>. Each round pushes every key, then
// pulls the dense key and every row of the tables. At the end it writes the final
// values to OUT_DIR/w<rank>.weights and each round's time in ms to OUT_DIR/w<rank>.times.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "failover_job_io.h"
#include "pskv/kvstore.h"
#include "pskv/row_sparse.h"

using namespace pskv;
using namespace failover_job;

namespace {

struct Table {
  int key;
  int64_t rows, row_size;
};
// Key 11: 200 x 8 = 1600 elements (over MXNET_KVSTORE_BIGARRAY_BOUND=1000: sliced by
// rows over the servers); key 13: 10 x 4 (on one server).
const Table kTables[] = {{11, 200, 8}, {13, 10, 4}};
constexpr int kDense = 3;
constexpr int64_t kDenseSize = 64;

float Value(int rank, int round, int key, int64_t row, int64_t col) {
  return static_cast<float>(((row * 5 + col * 3 + key * 13 + round * 7 + rank * 11) % 17) - 8) /
             16.0f +
         0.001f * static_cast<float>(rank + 1);
}

// This worker's rows of `t` in round `round`: about a third of them, different per
// rank and round (some rounds of key 13 push none: an empty push joins the round).
RowSparseNDArray Grad(const Table& t, int rank, int round) {
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < t.rows; ++r)
    if ((r + rank * 2 + round) % 3 == 0 && !(t.key == 13 && round % 4 == rank)) ids.push_back(r);
  NDArray idx({static_cast<int64_t>(ids.size())}, DType::kInt64);
  NDArray rows({static_cast<int64_t>(ids.size()), t.row_size});
  for (size_t i = 0; i < ids.size(); ++i) {
    idx.data<int64_t>()[i] = ids[i];
    for (int64_t c = 0; c < t.row_size; ++c)
      rows.data<float>()[static_cast<int64_t>(i) * t.row_size + c] =
          Value(rank, round, t.key, ids[i], c);
  }
  return RowSparseNDArray::FromRows({t.rows, t.row_size}, idx, rows);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: sparse_failover_worker ROUNDS OUT_DIR\n");
    return 2;
  }
  const int rounds = std::atoi(argv[1]);
  const std::string out = argv[2];
  try {
    auto kv = KVStore::Create("dist_sync");
    const int rank = kv->Rank();
    Steps steps(out + "/w" + std::to_string(rank));
    for (const Table& t : kTables) {
      NDArray init({t.rows, t.row_size});
      for (int64_t i = 0; i < init.size(); ++i)
        init.data<float>()[i] = 0.5f + 0.01f * static_cast<float>(i % 7);
      kv->Init(t.key, RowSparseNDArray::FromDense(init));
    }
    NDArray dense({kDenseSize});
    dense.Fill(0.25f);
    kv->Init(kDense, dense);
    kv->SetOptimizer(TrainingOptimizer());
    std::vector<RowSparseNDArray> tables;
    std::vector<NDArray> all_rows;
    for (const Table& t : kTables) {
      tables.emplace_back(Shape{t.rows, t.row_size});
      NDArray ids({t.rows}, DType::kInt64);
      for (int64_t r = 0; r < t.rows; ++r) ids.data<int64_t>()[r] = r;
      all_rows.push_back(ids);
    }
    for (int r = 1; r <= rounds; ++r) {
      steps.Begin();
      for (const Table& t : kTables) kv->Push(t.key, {Grad(t, rank, r)});
      NDArray g({kDenseSize});
      for (int64_t i = 0; i < kDenseSize; ++i) g.data<float>()[i] = Value(rank, r, kDense, i, 0);
      kv->Push(kDense, {g});
      kv->Pull(kDense, {dense});
      for (size_t k = 0; k < tables.size(); ++k)
        kv->RowSparsePull(kTables[k].key, {tables[k]}, {all_rows[k]});
      kv->WaitAll();
      steps.End("r", r);
    }
    std::vector<NDArray> finals;
    for (auto& t : tables) finals.push_back(t.ToDense());
    finals.push_back(dense);
    steps.Write(finals);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparse_failover_worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
