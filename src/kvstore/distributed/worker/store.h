// DistWorkerStore: the worker side of the dist stores (dist_sync, dist_async and their
// _device variants), reusable by other store types.
//
// Per key: the values a call pushes are reduced locally (LocalReducer, the seam for
// a store whose arrays live elsewhere), optionally compressed, then sent to the
// servers holding the key's slices; pulls land in the first output and are copied to
// the others. Every key's operations run in order on the engine; different keys
// overlap, higher priority first.
//
// The parts, one concern each (this folder):
//   shared_node      the process's worker node, shared by its stores
//   server_link      commands, awaited requests, worker barriers, the broken state
//   key_table        keys, placement, the checks of a call, strict rounds (RoundRules)
//   collective_init  Init of dense and row_sparse keys
//   fusion           small keys of one call travel in one message
//   sparse_worker.cc row_sparse push, pull and init (wire: distributed/wire/sparse_codec.h)
//   stall            Wait with stall reports and deadlock diagnosis
//   states_transfer  optimizer states between the servers and a states file
//   device_exchange  values on devices (docs/gpu.md, "The dist stores on devices"):
//                    dist_*_device reduces on a home device per key and sends the sum
//                    in pieces as each piece's d2h copy lands; the plain dist stores
//                    stage every device value through pinned memory and sum on the CPU
//
// Blocking: every wait for the servers goes through KVWorker::Await (ServerLink) or,
// for scheduled operations, through the engine (stall.h). After a timeout or a dead
// peer the store is broken: closing it aborts at once instead of waiting for the final
// barrier.
//
// Threads: calls may come from several threads. mu_ guards the key table and the
// strict-rounds state; a key's merge/residual buffers belong to its engine operation.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kvstore/compression.h"
#include "kvstore/device_values.h"
#include "kvstore/distributed/worker/key_table.h"
#include "kvstore/distributed/worker/local_reducer.h"
#include "kvstore/distributed/worker/server_link.h"
#include "kvstore/distributed/worker/shared_node.h"
#include "kvstore/engine.h"
#include "kvstore/states_layout.h"
#include "pskv/kvstore.h"

namespace pskv::dist {

class DistWorkerStore : public KVStore {
 public:
  /// Joins the process's worker node (registering it with the job on first use) and
  /// meets the other workers. `type` contains "async" for a dist_async store.
  DistWorkerStore(std::string type, Options options, std::unique_ptr<LocalReducer> reducer);
  ~DistWorkerStore() override;

  int Rank() const override { return link_->rank(); }
  int NumWorkers() const override { return node_->num_workers(); }
  void Barrier() override { link_->WorkerBarrier(); }
  void SetOptimizer(const OptimizerConfig& config) override;
  void SetGradientCompression(const CompressionConfig& config) override;
  /// Neither call is collective: on ranks other than 0 both only WaitAll. In sync
  /// mode no round can complete while rank 0 is inside, so the states saved or loaded
  /// are those between two rounds.
  void SaveOptimizerStates(const std::string& fname, bool dump_optimizer) override;
  void LoadOptimizerStates(const std::string& fname) override;

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
  void SetUpdaterImpl(Updater) override;
  // row_sparse keys (sparse_worker.cc): one request per call, one key per server;
  // every server holding rows gets each push, also an empty one (its part of a sync
  // round).
  void InitRowSparseImpl(int key, const RowSparseNDArray& value) override;
  void PushRowSparseImpl(int key, const std::vector<RowSparseNDArray>& values,
                         int priority) override;
  void RowSparsePullImpl(int key, const std::vector<RowSparseNDArray>& outs,
                         const std::vector<NDArray>& row_ids, int priority) override;

  /// One key's values ready to send: reduced (LocalReducer) and, with gradient
  /// compression, quantised per server slice. Engine thread. Returns the frame, its
  /// per-ps-key lengths and the request's cmd.
  std::tuple<Frame, std::vector<uint64_t>, int> Prepare(KeyMeta& m,
                                                        const std::vector<NDArray>& vals);

  /// Values on devices (device_exchange.cc). Engine operations of one key:
  ///  * DevicePushPull (dist_*_device, no compression, device values): the sum on the
  ///    key's home device, its d2h copy in pieces (one per wire chunk), each piece pushed
  ///    (or push-pulled into the key's pinned receive buffer) from a host callback as
  ///    soon as it landed; with `outs`, then one h2d and device-to-device copies.
  ///  * DevicePull: into the key's pinned receive buffer, then to `outs`
  ///    (CopyToOutputsAsync: one h2d and a fan-out on dist_*_device, one h2d per device
  ///    output otherwise).
  ///  * StagedPushPull: Prepare (which stages device values) then a push-pull into the
  ///    pinned receive buffer, then to `outs` as DevicePull.
  void DevicePushPull(KeyMeta& m, const std::vector<NDArray>& vals,
                      const std::vector<NDArray>& outs, int priority, Engine::Done done);
  void DevicePull(KeyMeta& m, const std::vector<NDArray>& outs, int priority, Engine::Done done);
  void StagedPushPull(KeyMeta& m, const std::vector<NDArray>& vals,
                      const std::vector<NDArray>& outs, int priority, Engine::Done done);
  /// Whether a key's push of `vals` takes DevicePushPull.
  bool ReducesOnDevice(const std::vector<NDArray>& vals) const {
    return device_ && !compressor_ && AnyOnDevice(vals);
  }

  ServerLink& link() { return *link_; }
  Engine& engine() { return engine_; }
  int store_id() const { return store_id_; }

 private:
  void CheckAsyncHasOptimizer() const;
  /// Where the optimizer states of this store's keys live over `num_servers` servers
  /// (states_transfer.h). Takes mu_.
  states::Layout StatesLayout(int num_servers);
  /// The metas of a call's dense keys, checked; with strict rounds (dist_sync) the
  /// call is also admitted by RoundRules (all checks pass before anything is
  /// recorded). Takes mu_.
  std::vector<KeyMeta*> LookUp(const Grouped& groups, const std::vector<NDArray>& arrays,
                               const char* op, const char* what,
                               const RoundRules::Step* step = nullptr);
  /// Whether a push of `nvals` values of `m` may start on the calling thread (Engine):
  /// only when preparing it is no work (one value, sent as it is) and small enough
  /// that the transport's copy (shared memory) is cheap too.
  bool StartsHere(const KeyMeta& m, const std::vector<NDArray>& vals) const;
  /// Before a call's operations are scheduled (takes mu_): the device state of every
  /// key with arrays on devices, and on dist_*_device the home devices of the keys
  /// pushed with device values for the first time (Placement, as the `device` store).
  void PrepareDevices(const std::vector<KeyMeta*>& metas, const Grouped& groups,
                      const std::vector<NDArray>& arrays, bool pushed);
  /// The sum of a key's values as a host array when some are on devices: on
  /// dist_*_device (placed keys) the device sum copied to the key's pinned send buffer;
  /// otherwise every device value staged through pinned memory and summed on the CPU
  /// (MXNet's CommCPU). Waits for the device work.
  NDArray StagedSum(KeyMeta& m, const std::vector<NDArray>& vals);
  /// PushPacer's `ahead` for a key's pushes: PSKV_WIRE_AHEAD_BYTES, or 0 (none) where
  /// the kernel paces the connections (PSKV_LINK_RATE, distributed/link_pacing.h): each
  /// flow then keeps its share's rate by itself, and a lane's answers, paced too,
  /// would come too slowly to release the next piece in time (a co-located
  /// server's lane of one chunk alternated push and answer, twice the step).
  uint64_t PushAhead() const {
    return options_.link_rate > 0 ? 0 : static_cast<uint64_t>(options_.wire_ahead_bytes);
  }
  /// Chunks per big slice (PlaceDense): finer where the kernel paces the connections
  /// (PSKV_LINK_RATE: links are the limit, and a step's answers lag its pushes by
  /// the biggest message; dist_protocol.h, kFineChunksPerSlice), each chunk then its
  /// own message (MessageBytes); else the chunk size alone, and a server's
  /// consecutive chunks go in messages of up to the chunk size.
  int64_t ChunksPerSlice() const { return options_.link_rate > 0 ? kFineChunksPerSlice : 1; }
  uint64_t MessageBytes() const { return options_.link_rate > 0 ? 1 : 0; }

  const bool async_;
  const bool device_;  // dist_sync_device, dist_async_device
  SharedNode::Lease lease_;
  int store_id_ = 0;
  Node* node_ = nullptr;         // lease_'s
  std::vector<int64_t> shares_;  // of a big dense key per server (PlaceKey); empty: even
  std::unique_ptr<ServerLink> link_;
  bool has_server_optimizer_ = false;
  std::unique_ptr<LocalReducer> reducer_;
  std::unique_ptr<GradientCompressor> compressor_;
  std::mutex mu_;
  dist::KeyTable keys_;
  Placement placement_;  // home devices of dist_*_device keys; under mu_
  Engine engine_;
};

}  // namespace pskv::dist
