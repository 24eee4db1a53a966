#include "common/status_reporter.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "pskv/error.h"

namespace pskv {

void StatusReporter::Configure(StatusChannel channel, std::string role, std::string host) {
  std::lock_guard<std::mutex> lk(mu_);
  channel_ = channel;
  role_ = std::move(role);
  host_ = std::move(host);
  enabled_.store(channel_.enabled(), std::memory_order_release);
}

void StatusReporter::SetRank(int rank) {
  std::lock_guard<std::mutex> lk(mu_);
  rank_ = rank;
}

void StatusReporter::SetPhase(StatusPhase phase) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (base_ == StatusPhase::kFailed || base_ == phase) return;
  base_ = phase;
  if (phase == StatusPhase::kFinished) waits_.clear();
  EmitLocked();
}

void StatusReporter::Failed(const std::string& kind, const std::string& message,
                            const std::vector<NodeRef>& culprits) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (base_ == StatusPhase::kFailed) return;
  base_ = StatusPhase::kFailed;
  kind_ = kind;
  message_ = message;
  culprits_ = culprits;
  EmitLocked();
}

void StatusReporter::Waiting(const std::string& key, const std::string& what,
                             std::vector<NodeRef> missing, int64_t more,
                             std::chrono::milliseconds waited) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (base_ == StatusPhase::kFailed || base_ == StatusPhase::kFinished) return;
  waits_[key] = Wait{what, std::move(missing), more, waited.count(), ++reports_};
  EmitLocked();
}

void StatusReporter::Resumed(const std::string& key) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (waits_.erase(key) == 0) return;
  if (base_ != StatusPhase::kFailed) EmitLocked();
}

void StatusReporter::SetJob(int64_t replicas, int64_t detect_ms) {
  std::lock_guard<std::mutex> lk(mu_);
  replicas_ = replicas;
  detect_ms_ = detect_ms;
}

void StatusReporter::Departed(const NodeRef& node) {
  AddOnce(&departed_, node);
}

void StatusReporter::Joined(const NodeRef& node) {
  AddOnce(&joined_, node);
}

void StatusReporter::Returned(const NodeRef& node) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = std::find(departed_.begin(), departed_.end(), node);
  if (it == departed_.end()) return;
  departed_.erase(it);
  EmitLocked();
}

void StatusReporter::AddOnce(std::vector<NodeRef>* list, const NodeRef& node) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (std::find(list->begin(), list->end(), node) != list->end()) return;
  list->push_back(node);
  EmitLocked();
}

StatusRecord StatusReporter::Snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  return SnapshotLocked();
}

StatusRecord StatusReporter::SnapshotLocked() const {
  StatusRecord r;
  r.role = role_;
  r.rank = rank_;
  r.host = host_;
  r.pid = ::getpid();
  r.phase = base_;
  r.replicas = replicas_;
  r.detect_ms = detect_ms_;
  r.departed = departed_;
  r.joined = joined_;
  if (base_ == StatusPhase::kFailed) {
    r.kind = kind_;
    r.message = message_;
    r.missing = culprits_;
    return r;
  }
  if (waits_.empty()) return r;
  r.phase = StatusPhase::kWaiting;
  const Wait* latest = nullptr;
  for (auto& [key, w] : waits_) {
    if (!latest || w.order > latest->order) latest = &w;
    r.more += w.more;
    for (auto& m : w.missing)
      if (std::find(r.missing.begin(), r.missing.end(), m) == r.missing.end()) {
        if (r.missing.size() < kMaxRefs)
          r.missing.push_back(m);
        else
          ++r.more;
      }
  }
  r.wait = latest->what;
  r.waited_ms = latest->waited_ms;
  return r;
}

void StatusReporter::EmitLocked() const {
  channel_.Write(SnapshotLocked());
}

StatusWait::~StatusWait() {
  if (reporter_ && !key_.empty()) reporter_->Resumed(key_);
}

void StatusWait::Report(const std::string& what, std::vector<NodeRef> missing, int64_t more,
                        std::chrono::milliseconds waited) {
  if (!reporter_ || !reporter_->enabled()) return;
  if (key_.empty()) {
    static std::atomic<uint64_t> next{0};
    key_ = "wait/" + std::to_string(++next);
  }
  missing_ = missing;
  reporter_->Waiting(key_, what, std::move(missing), more, waited);
}

void StatusWait::Fail(const std::string& kind, const std::string& message) {
  if (reporter_) reporter_->Failed(kind, message, missing_);
}

std::string ErrorKindName(std::exception_ptr e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const InvalidArgument&) {
    return "InvalidArgument";
  } catch (const KeyError&) {
    return "KeyError";
  } catch (const ShapeError&) {
    return "ShapeError";
  } catch (const UsageError&) {
    return "UsageError";
  } catch (const ConfigError&) {
    return "ConfigError";
  } catch (const TimeoutError&) {
    return "TimeoutError";
  } catch (const ProtocolError&) {
    return "ProtocolError";
  } catch (const NodeFailure&) {
    return "NodeFailure";
  } catch (const IOError&) {
    return "IOError";
  } catch (const InternalError&) {
    return "InternalError";
  } catch (const Error&) {
    return "Error";
  } catch (...) {
  }
  return "exception";
}

std::string ErrorMessage(std::exception_ptr e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
  }
  return {};
}

}  // namespace pskv
