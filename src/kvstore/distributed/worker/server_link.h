// ServerLink: one dist store's way to the servers (commands, awaited requests, worker
// barriers) and the store's "broken" state.
//
// Policy: a timeout or a dead peer (TimeoutError, NodeFailure) on any of these calls
// breaks the store: nothing can complete afterwards, so closing it aborts the node at
// once instead of waiting for the final barrier. Usage errors do not break it.
//
// Threads: every method may be called from any thread (a store's calls may come from
// several); the broken state is guarded by its own mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ps/kv_app.h"
#include "ps/node.h"
#include "pskv/options.h"

namespace pskv::dist {

class ServerLink {
 public:
  /// `node` and `worker` are the process's shared worker node (they outlive this);
  /// `store_id` names the store's key namespace and commands.
  ServerLink(Node* node, KVWorker* worker, const Options& options, int store_id)
      : node_(node), worker_(worker), options_(options), store_id_(store_id) {}

  /// A command to the servers (all, or the node ids `to`), op_timeout bounded.
  std::vector<std::string> Command(int head, const std::string& body,
                                   const std::vector<int>& to = {});
  /// Waits for request `ts` (KVWorker::Await: stall reports, cancellation on timeout).
  void Await(uint64_t ts, const std::shared_ptr<Completion>& done, const std::string& what);
  /// A barrier of the workers, announced to the servers: a sync round that waits for
  /// this worker's push while it is in here is reported as a deadlock, not a hang.
  /// `group`: kWorkerGroup, or kEpochGroup (KVStore::EpochPartition).
  void WorkerBarrier(int group = kWorkerGroup);

  void MarkBroken(const std::string& why);
  /// Breaks the store if `e` is a TimeoutError or NodeFailure.
  void MarkBrokenIf(std::exception_ptr e);
  bool broken() const { return broken_.load(); }
  /// Why the store broke ("" while it is not).
  std::string broken_reason() const;

  Node* node() const { return node_; }
  KVWorker* worker() const { return worker_; }
  const Options& options() const { return options_; }
  int store_id() const { return store_id_; }
  int rank() const { return node_->rank(); }

 private:
  Node* node_;
  KVWorker* worker_;
  const Options& options_;  // the store's
  const int store_id_;
  mutable std::mutex broken_mu_;  // broken_reason_
  std::atomic<bool> broken_{false};
  std::string broken_reason_;
};

}  // namespace pskv::dist
