// DistServer: commands (dist_protocol.h, Command), one method each, run in exclusive
// sections of the shard pool. A command's exception becomes its error reply.
#include <iterator>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/dist_server.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/error.h"

namespace pskv {

std::string DistServer::Command(int sender, int head, const std::string& body) {
  static constexpr std::pair<int, CommandFn> kCommands[] = {
      {dist::kSetMode, &DistServer::SetMode},
      {dist::kSetOptimizer, &DistServer::SetOptimizer},
      {dist::kSetCompression, &DistServer::SetCompression},
      {dist::kWorkerDone, &DistServer::WorkerDone},
      {dist::kHasOptimizer, &DistServer::HasOptimizer},
      {dist::kReportInit, &DistServer::ReportInit},
      {dist::kCheckInit, &DistServer::CheckInit},
      {dist::kBarrierState, &DistServer::BarrierState},
      {dist::kRoundStatus, &DistServer::RoundStatus},
      {dist::kStatesSize, &DistServer::StatesSize},
  };
  const int command = head & 0xff;
  const Call call{sender, head >> 8, body};  // bits 8..: the worker-side store it concerns
  for (const auto& [id, fn] : kCommands)
    if (id == command) return pool_.Exclusive([&] { return (this->*fn)(call); });
  throw InvalidArgument("unknown command " + std::to_string(command));
}

std::string DistServer::SetMode(const Call& c) {
  sync_ = payload::DecodeMode(c.body);
  return {};
}

std::string DistServer::SetOptimizer(const Call& c) {
  // Built before it is stored: a config that fails to decode leaves no empty entry.
  auto optimizer = std::make_unique<Optimizer>(payload::DecodeOptimizer(c.body));
  if (node_->options().verbose >= 1)
    PSKV_INFO(node_->Tag() << ": optimizer " << optimizer->config().type);
  optimizers_[c.store] = std::move(optimizer);
  return {};
}

std::string DistServer::SetCompression(const Call& c) {
  const CompressionConfig config = payload::DecodeCompression(c.body);
  for (auto& keys : keys_)
    if (!keys.empty())
      throw UsageError("SetGradientCompression must be called before the first Init");
  compressor_ = config.active() ? std::make_unique<GradientCompressor>(config) : nullptr;
  return {};
}

// A worker finished: no more pushes from it. Open rounds that need its push fail.
std::string DistServer::WorkerDone(const Call& c) {
  done_workers_.insert(c.sender);
  LeftBarrier(c.sender);
  sparse_.WorkerDone(c.sender, server_, [this](int id) { return WorkerName(id); });
  ForEachKey([&](int64_t key, KeyState& st) {
    if (st.round.NeedsPushFrom(c.sender))
      FailRound(st.round.Take(), {ErrorKind::kUsage,
                                  FinishedWithoutPushing("key " + std::to_string(key),
                                                         WorkerName(c.sender), st.round.round())});
  });
  return {};
}

std::string DistServer::HasOptimizer(const Call& c) {
  auto it = optimizers_.find(c.store);
  return payload::EncodeHasOptimizer(it != optimizers_.end() && it->second != nullptr);
}

std::string DistServer::BarrierState(const Call& c) {
  if (!payload::DecodeBarrierState(c.body)) {
    LeftBarrier(c.sender);
    return {};
  }
  std::lock_guard<std::mutex> blk(barrier_mu_);
  in_barrier_[c.sender] = Clock::now();
  return {};
}

// Records the keys of an Init call as `c.sender` saw them (to server 0); the first
// disagreement per key is kept, with its error kind, for CheckInit.
std::string DistServer::ReportInit(const Call& c) {
  payload::InitReport report = payload::DecodeInitReport(c.body);
  // Rank 0 could not initialise these keys (the servers refused them).
  for (auto& f : report.failures)
    init_conflicts_.emplace(f.id, Failure{ErrorKind::kKey, std::move(f.message)});
  for (auto& e : report.entries) {
    const int64_t id = e.id;
    InitRecord rec{std::move(e.name), std::move(e.dtype), std::move(e.shape), c.sender};
    auto [it, fresh] = init_reports_.emplace(id, rec);
    if (fresh || init_conflicts_.count(id)) continue;
    const InitRecord& a = it->second;
    if (a.name != rec.name) {
      init_conflicts_[id] = {
          ErrorKind::kKey, "string keys were initialised in a different order: " +
                               WorkerName(c.sender) + " gave id " + std::to_string(id) + " to " +
                               rec.name + " but " + WorkerName(a.worker) + " gave it to " + a.name +
                               "; every worker must init string keys in the same order"};
    } else if (a.dtype != rec.dtype || a.shape != rec.shape) {
      init_conflicts_[id] = {ErrorKind::kShape,
                             "key " + a.name + " was initialised with shape " + rec.shape + " " +
                                 rec.dtype + " by " + WorkerName(c.sender) + " but with shape " +
                                 a.shape + " " + a.dtype + " by " + WorkerName(a.worker) +
                                 "; every worker must init a key with the same shape and dtype"};
    }
  }
  return {};
}

// Fails (the same way for every worker) if the reports for these keys disagreed.
std::string DistServer::CheckInit(const Call& c) {
  for (int64_t id : payload::DecodeCheckInit(c.body)) {
    auto it = init_conflicts_.find(id);
    if (it != init_conflicts_.end())
      std::rethrow_exception(MakeError(it->second.kind, it->second.message));
  }
  return {};
}

}  // namespace pskv
