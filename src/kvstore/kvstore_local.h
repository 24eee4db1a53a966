// KVStoreLocal: the single-process store behind types `local` and `device`.
//
// With CPU values both reduce on the CPU; `device` also accepts gradient compression
// (each source value is quantised with its own residual, dequantised and summed), as
// MXNet's. With values on devices, `local` stages them through pinned host memory and
// updates on the CPU, `device` reduces and updates on a home device per key
// (kvstore/device_values.h).
//
// Thread model: the caller's thread validates arguments against the key table
// (under meta_mu_) and schedules work on the engine; the engine's dispatcher thread
// runs the work. An entry's value is only touched by engine operations, which the
// engine orders per key, so values need no lock.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "kvstore/compression.h"
#include "kvstore/device_values.h"
#include "kvstore/engine.h"
#include "kvstore/reduce.h"
#include "pskv/kvstore.h"

namespace pskv {

class KVStoreLocal : public KVStore {
 public:
  KVStoreLocal(std::string type, Options options, bool device);
  ~KVStoreLocal() override;

  void SetGradientCompression(const CompressionConfig& config) override;
  void SetOptimizer(const OptimizerConfig& config) override;

 protected:
  void InitImpl(const std::vector<int>& keys, const std::vector<NDArray>& values) override;
  void PushImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                int priority) override;
  void PullImpl(const std::vector<int>& keys, const std::vector<NDArray>& outs,
                int priority) override;
  void PushPullImpl(const std::vector<int>& keys, const std::vector<NDArray>& values,
                    const std::vector<int>& out_keys, const std::vector<NDArray>& outs,
                    int priority) override;
  void WaitImpl(const std::vector<int>* keys, std::chrono::milliseconds timeout) override;
  void SetUpdaterImpl(Updater updater) override;
  void InitRowSparseImpl(int key, const RowSparseNDArray& value) override;
  void PushRowSparseImpl(int key, const std::vector<RowSparseNDArray>& values,
                         int priority) override;
  void RowSparsePullImpl(int key, const std::vector<RowSparseNDArray>& outs,
                         const std::vector<NDArray>& row_ids, int priority) override;

 private:
  struct Entry {
    NDArray value;
    NDArray merge;                   // merge buffer, allocated at the first multi-value push
    std::vector<NDArray> residuals;  // compression residual per source position
    std::vector<uint8_t> packed;     // compression scratch
    // row_sparse key: `value` is the dense table (absent rows are zero rows, which is
    // what a row_sparse value means), of rows of `row_size` elements.
    bool sparse = false;
    int64_t row_size = 0;
    // `device` with values on devices: the home device's merge buffer and weight (the
    // key's value once placed).
    DeviceSlot dev;
  };
  Entry& Lookup(int key, const char* op);
  void CheckPush(const std::map<int, std::vector<NDArray>>& groups);
  void CheckPull(const std::map<int, std::vector<NDArray>>& groups);
  // `device`: chooses home devices for the keys of a push whose values are on devices
  // (under meta_mu_).
  void PlaceKeys(const std::map<int, std::vector<NDArray>>& groups);
  // Engine-thread: every output gets the key's value.
  void DoPull(Entry& e, const std::vector<NDArray>& outs);
  // Engine-thread work.
  void DoPush(int key, Entry& e, const std::vector<NDArray>& values);
  NDArray Reduce(Entry& e, const std::vector<NDArray>& values);

  bool device_;
  Reducer reducer_;
  std::unique_ptr<GradientCompressor> compressor_;
  std::mutex meta_mu_;
  std::map<int, std::unique_ptr<Entry>> store_;
  std::shared_ptr<Updater> updater_;  // swapped atomically under meta_mu_
  // The optimizer when the updater is SetOptimizer's (row_sparse pushes then update
  // only their rows); null for a custom updater. Under meta_mu_.
  std::shared_ptr<Optimizer> sparse_optimizer_;
  Placement placement_;  // under meta_mu_
  Engine engine_;
};

}  // namespace pskv
