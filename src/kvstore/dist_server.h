// DistServer: the server side of the dist KVStore (spec 4.6), and the entry point
// that runs a scheduler or server process to the end of a job.
//
// Per key (its slice on this server): the value, an optional merge buffer, and the
// open sync round (which workers pushed, and their requests). All of it is touched
// only by the node's customer thread, which handles one message at a time — so
// updates of one key never run concurrently and arrive in arrival order.
//
// Sync mode: a round of key K completes when every worker pushed K exactly once;
// then the optimizer runs on the sum (or, without an optimizer, the sum becomes
// the value) and every request of the round is answered. A second push by the same
// worker in one round is an error; so is a round that can no longer complete
// because a worker already declared itself done (kWorkerDone): its waiting pushes
// fail with a message naming that worker, instead of hanging (MXNet hung).
// Async mode: every push is applied at once (an optimizer is required).
#pragma once

#include <map>
#include <memory>
#include <set>

#include "kvstore/compression.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/reduce.h"
#include "ps/kv_app.h"
#include "pskv/optimizer.h"

namespace pskv {

class DistServer {
 public:
  /// Installs itself as `node`'s request handler; call before node->Start().
  explicit DistServer(Node* node);

 private:
  struct KeyState {
    NDArray value;
    NDArray merge;  // float32 when compressed or multi-precision, else value's dtype
    std::set<int> pushed;
    std::vector<KVRequest> waiting;
    std::shared_ptr<int> token = std::make_shared<int>(0);  // held by in-flight replies
    int64_t rounds = 0;
    int64_t wire_key = 0;  // (store id << 32) | key
  };
  void Handle(KVRequest&& req, KVServer* srv);
  std::string Command(int sender, int head, const std::string& body);
  void HandleKey(const KVRequest& req, KVServer* srv, size_t i, uint64_t offset, bool* answered);
  void Merge(KeyState& st, const KVRequest& req, uint64_t off, uint64_t len);
  void ApplyRound(int64_t key, KeyState& st);
  void Reply(KVServer* srv, const KVRequest& req,
             const std::vector<std::pair<int64_t, KeyState*>>& keys);
  /// The optimizer of the store that `wire_key` belongs to, or null.
  Optimizer* OptimizerOf(int64_t wire_key) const;
  void FailRound(KeyState& st, const std::string& why);
  /// Before modifying a value: if a reply still references its memory, move to a copy.
  void Detach(KeyState& st);
  std::string WorkerName(int id) const;

  Node* node_;
  KVServer server_;
  Reducer reducer_;
  bool sync_ = false;
  // Keys are wire keys: (store id << 32) | key (dist_protocol.h); one optimizer
  // per store of the worker processes (store 0 for single-store jobs).
  std::map<int, std::unique_ptr<Optimizer>> optimizers_;
  std::unique_ptr<GradientCompressor> compressor_;
  std::map<int64_t, KeyState> store_;
  std::set<int> done_workers_;
  std::map<int64_t, std::string> string_keys_;  // wire id -> name, as first reported
  std::map<int64_t, int> string_key_source_;    // wire id -> worker that reported it first
};

/// Runs this process's role (options.role must be server or scheduler) until the
/// job ends. Returns the process exit status: 0 on a clean end, 1 on a failure
/// (which is printed).
int RunServerOrScheduler(const Options& options);

}  // namespace pskv
