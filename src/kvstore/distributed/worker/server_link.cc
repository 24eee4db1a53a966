#include "kvstore/distributed/worker/server_link.h"

#include "kvstore/dist_protocol.h"
#include "protocol/payload.h"
#include "pskv/error.h"

namespace pskv::dist {

std::vector<std::string> ServerLink::Command(int head, const std::string& body,
                                             const std::vector<int>& to) {
  try {
    return worker_->Command(head, body, options_.op_timeout, to);
  } catch (...) {
    MarkBrokenIf(std::current_exception());
    throw;
  }
}

void ServerLink::Await(uint64_t ts, const std::shared_ptr<Completion>& done,
                       const std::string& what) {
  try {
    worker_->Await(ts, done, options_.op_timeout, options_.stall_warning, what);
  } catch (...) {
    MarkBrokenIf(std::current_exception());
    throw;
  }
}

void ServerLink::WorkerBarrier(int group) {
  Command(kBarrierState, payload::EncodeBarrierState(true));
  try {
    node_->Barrier(group, options_.op_timeout);
  } catch (...) {
    MarkBrokenIf(std::current_exception());
    throw;
  }
  Command(kBarrierState, payload::EncodeBarrierState(false));
}

void ServerLink::MarkBroken(const std::string& why) {
  std::lock_guard<std::mutex> lk(broken_mu_);
  if (!broken_) broken_reason_ = why;
  broken_ = true;
}

void ServerLink::MarkBrokenIf(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError& t) {
    MarkBroken(t.what());
  } catch (const NodeFailure& f) {
    MarkBroken(f.what());
  } catch (...) {
  }
}

std::string ServerLink::broken_reason() const {
  std::lock_guard<std::mutex> lk(broken_mu_);
  return broken_reason_;
}

}  // namespace pskv::dist
