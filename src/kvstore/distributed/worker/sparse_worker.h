// SparseWorker: DistWorkerStore's row_sparse keys. One request per call, one key per
// server (the values' layout: distributed/wire/sparse_codec.h); every server holding
// rows gets each push, also an empty one (its part of a sync round).
//
// State: a row_sparse key's meta lives in the store's key table beside the dense keys
// (one key namespace, so a key cannot be both); this part borrows the table and the
// lock that guards it, and keeps nothing else. Threads: as the store's calls; the
// operations it schedules run on the store's engine, one at a time per key.
#pragma once

#include <mutex>
#include <vector>

#include "kvstore/distributed/worker/key_table.h"
#include "kvstore/distributed/worker/server_link.h"
#include "kvstore/engine.h"
#include "pskv/row_sparse.h"

namespace pskv::dist {

class SparseWorker {
 public:
  /// Every argument belongs to the store and outlives this; `keys` is guarded by
  /// `keys_mu`.
  SparseWorker(ServerLink& link, Engine& engine, std::mutex& keys_mu, KeyTable& keys,
               KeyTable::Namer name)
      : link_(link), engine_(engine), keys_mu_(keys_mu), keys_(keys), name_(std::move(name)) {}

  /// The collective Init of a row_sparse key (collective_init.h); `compressed`: the
  /// store compresses gradients, which row_sparse keys do not support.
  void Init(int key, const RowSparseNDArray& value, bool compressed);
  /// Schedules the push of the sum of `values`, its rows cut by the key's row ranges.
  void Push(int key, const std::vector<RowSparseNDArray>& values, int priority);
  /// Schedules, per output, the pull of rows `row_ids[i]` into `outs[i]`.
  void Pull(int key, const std::vector<RowSparseNDArray>& outs, const std::vector<NDArray>& row_ids,
            int priority);

 private:
  ServerLink& link_;
  Engine& engine_;
  std::mutex& keys_mu_;
  KeyTable& keys_;
  const KeyTable::Namer name_;
};

}  // namespace pskv::dist
