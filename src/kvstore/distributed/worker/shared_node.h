// The process-wide registry of worker nodes that dist stores share.
//
// One node per worker process, shared by every dist store the process creates
// (MXNet allowed several stores per process, e.g. one per Trainer of a GAN). The
// stores get ids 0, 1, ... in creation order — every worker must create them in
// the same order — and their keys travel in separate namespaces (dist::WireKey).
// The last store to close ends the node: it tells the servers no more pushes come
// from here (kWorkerDone), then waits in the final barrier.
//
// A process may also hold several worker *nodes* of one job (tests and benchmarks
// run a whole job as threads): stores are grouped by (scheduler address, rank hint),
// so stores created with different rank hints (DMLC_TASK_ID) are different workers.
// Starting a node (registration) and ending it (the final barrier) wait for the other
// nodes of the job, so neither runs under the registry's mutex: with two worker nodes
// in one process, the second could otherwise never register, or never reach the final
// barrier the first one waits in.
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "kvstore/engine.h"
#include "ps/kv_app.h"
#include "ps/node.h"
#include "pskv/options.h"

namespace pskv::dist {

class SharedNode {
 public:
  /// Says goodbye (kWorkerDone, final barrier) unless the node never started or a
  /// store aborted it.
  ~SharedNode();

  Node* node() const { return node_.get(); }
  KVWorker* worker() const { return worker_.get(); }
  /// Whether the node's stores are dist_async ones.
  bool async() const { return async_; }

  /// Engines poisoned when a peer fails (each store registers its own while open).
  void AddEngine(Engine* e);
  void RemoveEngine(Engine* e);
  /// A store aborted the node after a failure: the last store does not say goodbye.
  void MarkAborted();

  /// A store's place in its process's worker node.
  struct Lease {
    std::shared_ptr<SharedNode> node;
    int store_id = 0;
  };
  /// Joins (creating and starting it if needed) the worker node of `options`
  /// (scheduler address, rank hint) for a store of kind `async`; `type` names it in
  /// errors. Blocks for registration on first use. UsageError: a sync store after an
  /// async one (or the reverse), or more than dist::kMaxStores stores.
  static Lease Join(const Options& options, bool async, const std::string& type);

 private:
  Options options_;
  bool async_ = false;
  int next_store_ = 0;  // under the registry's mutex
  std::mutex mu_;       // engines_
  std::set<Engine*> engines_;
  std::mutex start_mu_;  // start_done_, start_error_, started_
  bool start_done_ = false;
  std::exception_ptr start_error_;
  std::unique_ptr<Node> node_;  // destroyed before the members above
  std::unique_ptr<KVWorker> worker_;
  bool started_ = false;  // Start() succeeded: the node must say goodbye
  bool aborted_ = false;  // under the registry's mutex
};

}  // namespace pskv::dist
