// ServerCommands: commands (dist_protocol.h, Command), one method each, run in
// exclusive sections of the shard pool (commands.h). A command's exception becomes its
// error reply.
#include <iterator>

#include "common/logging.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/commands.h"
#include "kvstore/distributed/server/embedding_server.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/error.h"

namespace pskv {

std::string ServerCommands::Run(int sender, int head, const std::string& body) {
  static constexpr std::pair<int, Fn> kCommands[] = {
      {dist::kSetMode, &ServerCommands::SetMode},
      {dist::kSetOptimizer, &ServerCommands::SetOptimizer},
      {dist::kSetCompression, &ServerCommands::SetCompression},
      {dist::kWorkerDone, &ServerCommands::WorkerDone},
      {dist::kHasOptimizer, &ServerCommands::HasOptimizer},
      {dist::kReportInit, &ServerCommands::ReportInit},
      {dist::kCheckInit, &ServerCommands::CheckInit},
      {dist::kBarrierState, &ServerCommands::BarrierState},
      {dist::kRoundStatus, &ServerCommands::RoundStatus},
      {dist::kStatesSize, &ServerCommands::StatesSize},
  };
  const int command = head & 0xff;
  const Call call{sender, head >> 8, body};  // bits 8..: the worker-side store it concerns
  for (const auto& [id, fn] : kCommands)
    if (id == command) return pool_->Exclusive([&] { return (this->*fn)(call); });
  throw InvalidArgument("unknown command " + std::to_string(command));
}

std::string ServerCommands::SetMode(const Call& c) {
  store_->config().sync = payload::DecodeMode(c.body);
  return {};
}

std::string ServerCommands::SetOptimizer(const Call& c) {
  // Built before it is stored: a config that fails to decode leaves no empty entry.
  auto optimizer = std::make_unique<Optimizer>(payload::DecodeOptimizer(c.body));
  if (node_->options().verbose >= 1)
    PSKV_INFO(node_->Tag() << ": optimizer " << optimizer->config().type);
  store_->config().optimizers[c.store] = std::move(optimizer);
  return {};
}

std::string ServerCommands::SetCompression(const Call& c) {
  const CompressionConfig config = payload::DecodeCompression(c.body);
  if (!store_->empty())
    throw UsageError("SetGradientCompression must be called before the first Init");
  store_->config().compressor =
      config.active() ? std::make_unique<GradientCompressor>(config) : nullptr;
  return {};
}

// A worker finished: no more pushes from it. Open rounds that need its push fail.
std::string ServerCommands::WorkerDone(const Call& c) {
  store_->config().done_workers.insert(c.sender);
  barriers_->Left(c.sender);
  store_->sparse().WorkerDone(c.sender, server_, [this](int id) { return node_->NodeName(id); });
  tables_->WorkerDone(c.sender, server_);
  store_->WorkerDone(c.sender);
  return {};
}

std::string ServerCommands::HasOptimizer(const Call& c) {
  const auto& optimizers = store_->config().optimizers;
  auto it = optimizers.find(c.store);
  return payload::EncodeHasOptimizer(it != optimizers.end() && it->second != nullptr);
}

std::string ServerCommands::BarrierState(const Call& c) {
  if (payload::DecodeBarrierState(c.body))
    barriers_->Entered(c.sender, BarrierBoard::Clock::now());
  else
    barriers_->Left(c.sender);
  return {};
}

// Records the keys of an Init call as `c.sender` saw them (to server 0).
std::string ServerCommands::ReportInit(const Call& c) {
  init_checks_.Report(c.sender, c.body, [this](int id) { return node_->NodeName(id); });
  return {};
}

// Fails (the same way for every worker) if the reports for these keys disagreed.
std::string ServerCommands::CheckInit(const Call& c) {
  init_checks_.Check(c.body);
  return {};
}

std::string ServerCommands::RoundStatus(const Call& c) {
  return inspector_->RoundStatus(c.sender);
}

}  // namespace pskv
