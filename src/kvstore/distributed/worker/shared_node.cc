#include "kvstore/distributed/worker/shared_node.h"

#include <map>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "pskv/error.h"

namespace pskv::dist {

namespace {

std::mutex g_shared_mu;
// (scheduler address, rank hint) -> the worker node of those stores; expired entries
// are dropped at the next lookup (the map holds at most the nodes alive at once).
std::map<std::string, std::weak_ptr<SharedNode>> g_shared;

std::string SharedNodeKey(const Options& o) {
  return o.root_uri + ":" + std::to_string(o.root_port) + "#" + std::to_string(o.rank_hint);
}

}  // namespace

SharedNode::~SharedNode() {
  if (!started_ || aborted_) return;
  if (node_->failure()) {
    node_->Abort("the job had failed");
    return;
  }
  try {
    // Tell the servers no more pushes come from here (so a sync round that waits
    // for this worker fails with a message instead of hanging), then the final
    // barrier over all nodes ("this worker is done": it waits for the others).
    worker_->Command(kWorkerDone, "", options_.op_timeout);
    node_->Finalize(options_.op_timeout);
  } catch (const std::exception& e) {
    PSKV_ERROR("closing the dist store failed: " << e.what());
    node_->Abort(e.what());
  }
}

void SharedNode::AddEngine(Engine* e) {
  std::lock_guard<std::mutex> lk(mu_);
  engines_.insert(e);
  if (auto failed = node_->failure()) e->Poison(failed);
}

void SharedNode::RemoveEngine(Engine* e) {
  std::lock_guard<std::mutex> lk(mu_);
  engines_.erase(e);
}

void SharedNode::MarkAborted() {
  std::lock_guard<std::mutex> lk(g_shared_mu);
  aborted_ = true;
}

SharedNode::Lease SharedNode::Join(const Options& options, bool async, const std::string& type) {
  Lease lease;
  {
    std::lock_guard<std::mutex> lk(g_shared_mu);
    for (auto it = g_shared.begin(); it != g_shared.end();)
      it = it->second.expired() ? g_shared.erase(it) : std::next(it);
    auto& slot = g_shared[SharedNodeKey(options)];
    lease.node = slot.lock();
    if (!lease.node) {
      auto sn = std::make_shared<SharedNode>();
      sn->options_ = options;
      sn->async_ = async;
      sn->node_ = std::make_unique<Node>(options);
      sn->worker_ = std::make_unique<KVWorker>(sn->node_.get());
      SharedNode* raw = sn.get();
      sn->node_->AddFailureHandler([raw](std::exception_ptr e) {
        std::lock_guard<std::mutex> lk(raw->mu_);
        for (Engine* en : raw->engines_) en->Poison(e);
      });
      lease.node = sn;
      slot = sn;
    } else if (lease.node->async_ != async) {
      throw UsageError("the dist stores of one process must all be sync or all async ('" + type +
                       "' after a " + (lease.node->async_ ? "async" : "sync") + " store)");
    }
    lease.store_id = lease.node->next_store_++;
    if (lease.store_id >= kMaxStores) throw UsageError("too many dist stores in one process");
  }
  // Registration waits for the whole job: outside g_shared_mu.
  SharedNode& sn = *lease.node;
  std::lock_guard<std::mutex> lk(sn.start_mu_);
  if (!sn.start_done_) {
    sn.start_done_ = true;
    try {
      sn.node_->Start();
      sn.started_ = true;
    } catch (...) {
      sn.start_error_ = std::current_exception();
    }
  }
  if (sn.start_error_) std::rethrow_exception(sn.start_error_);
  return lease;
}

}  // namespace pskv::dist
