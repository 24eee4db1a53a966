#include "kvstore/dist/server/role_main.h"

#include <memory>

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist/server/dist_server.h"
#include "ps/node.h"

namespace pskv {

namespace {
// [process-wide] The process's log name, log levels and observability (PSKV_LOG_LEVEL,
// PSKV_TIMELINE, PSKV_METRICS_PORT): the only process-wide settings a server or
// scheduler process makes, all here.
void ConfigureProcess(const Options& options, const char* role) {
  SetLogName(role);
  if (!options.log_levels.empty()) SetLogLevels(options.log_levels);
  obs::Configure(options, role);
}
}  // namespace

int RunServerOrScheduler(const Options& options) {
  const char* role = options.role == Role::kServer ? "server" : "scheduler";
  try {
    ConfigureProcess(options, role);
    Node node(options);
    std::unique_ptr<DistServer> server;
    if (options.role == Role::kServer) server = std::make_unique<DistServer>(&node);
    node.Start();
    SetLogName(node.Tag());  // [process-wide] the node's name once it has one
    node.Finalize(std::chrono::milliseconds(0));
    return 0;
  } catch (const std::exception& e) {
    PSKV_ERROR("the job failed: " << e.what());
    return 1;
  }
}

}  // namespace pskv
