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
//   sparse_worker    row_sparse push, pull and init (wire: distributed/wire/sparse_codec.h)
//   stall            Wait with stall reports and deadlock diagnosis
//   states_transfer  optimizer states between the servers and a states file
//   device_exchange  values on devices (docs/gpu.md, "The dist stores on devices"):
//                    dist_*_device reduces on a home device per key and sends the sum
//                    in pieces as each piece's d2h copy lands; the plain dist stores
//                    stage every device value through pinned memory and sum on the CPU
//   wire_shape       how keys are cut into messages and paced (PSKV_LINK_RATE)
// The store coordinates them: it checks a call (key_table), hands its keys to the part
// that serves them and schedules the operations on its engine.
//
// Blocking: every wait for the servers goes through KVWorker::Await (ServerLink) or,
// for scheduled operations, through the engine (stall.h). After a timeout or a dead
// peer the store is broken: closing it aborts at once instead of waiting for the final
// barrier.
//
// Threads: calls may come from several threads. mu_ guards the key table and the
// strict-rounds state (also for sparse_); a key's merge/residual buffers belong to its
// engine operation.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kvstore/compression.h"
#include "kvstore/device_values.h"
#include "kvstore/distributed/link_pacing.h"
#include "kvstore/distributed/worker/device_exchange.h"
#include "kvstore/distributed/worker/key_table.h"
#include "kvstore/distributed/worker/local_reducer.h"
#include "kvstore/distributed/worker/server_link.h"
#include "kvstore/distributed/worker/shared_node.h"
#include "kvstore/distributed/worker/sparse_worker.h"
#include "kvstore/distributed/worker/wire_shape.h"
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
  /// A worker that joined a running elastic job skips the barriers before its first
  /// EpochPartition (the others passed them long ago).
  void Barrier() override {
    if (!catching_up_) link_->WorkerBarrier();
  }
  std::pair<int, int> EpochPartition() override;
  void SetOptimizer(const OptimizerConfig& config) override;
  void SetGradientCompression(const CompressionConfig& config) override;
  /// Neither call is collective: on ranks other than 0 both only WaitAll. In sync
  /// mode no round can complete while rank 0 is inside, so the states saved or loaded
  /// are those between two rounds.
  void SaveOptimizerStates(const std::string& fname, bool dump_optimizer) override;
  void LoadOptimizerStates(const std::string& fname) override;
  /// The store's way to the servers, for the parts that talk to them on their own:
  /// the dynamic embedding tables (embedding_worker.h).
  ServerLink& link() { return *link_; }

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
  // row_sparse keys: SparseWorker (sparse_worker.h).
  void InitRowSparseImpl(int key, const RowSparseNDArray& value) override {
    sparse_->Init(key, value, compressor_ != nullptr);
  }
  void PushRowSparseImpl(int key, const std::vector<RowSparseNDArray>& values,
                         int priority) override {
    CheckAsyncHasOptimizer();
    sparse_->Push(key, values, priority);
  }
  void RowSparsePullImpl(int key, const std::vector<RowSparseNDArray>& outs,
                         const std::vector<NDArray>& row_ids, int priority) override {
    sparse_->Pull(key, outs, row_ids, priority);
  }

 private:
  /// One key's values ready to send: reduced (LocalReducer; values on devices:
  /// DeviceExchange::StagedSum) and, with gradient compression, quantised per server
  /// slice. Engine thread. Returns the frame, its per-ps-key lengths and the request's cmd.
  std::tuple<Frame, std::vector<uint64_t>, int> Prepare(KeyMeta& m,
                                                        const std::vector<NDArray>& vals);
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

  const bool async_;
  WireShape wire_;  // set once the node table is known (LinksPaced), then fixed
  SharedNode::Lease lease_;
  int store_id_ = 0;
  Node* node_ = nullptr;         // lease_'s
  std::vector<int64_t> shares_;  // of a big dense key per server (PlaceKey); empty: even
  std::unique_ptr<ServerLink> link_;
  bool has_server_optimizer_ = false;
  // Elastic workers: this worker joined a running job (Node::joined) and has not yet
  // called EpochPartition: the collective start-up calls (the constructor's barrier,
  // SetOptimizer, SetGradientCompression, Init, Barrier) send nothing and wait for no
  // one — the servers already hold what the job's first workers set up.
  bool catching_up_ = false;
  std::unique_ptr<LocalReducer> reducer_;
  std::unique_ptr<GradientCompressor> compressor_;
  std::mutex mu_;
  dist::KeyTable keys_;
  Engine engine_;
  std::unique_ptr<SparseWorker> sparse_;     // row_sparse keys
  std::unique_ptr<DeviceExchange> devices_;  // values and outputs on devices
  std::unique_ptr<LinkPacer> pacer_;         // the node's (first store's), link_pacing.h
};

}  // namespace pskv::dist
