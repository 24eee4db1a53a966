// The factory of the dist stores and the server-role entry point. The store itself is
// dist::DistWorkerStore (kvstore/dist/worker/store.h) with this CPU's local reducer.
#include "kvstore/kvstore_dist.h"

#include "common/logging.h"
#include "common/observe.h"  // [observe]
#include "kvstore/dist/server/role_main.h"
#include "kvstore/dist/worker/store.h"
#include "pskv/error.h"

namespace pskv {

std::optional<int> RunServerRoleIfAsked(const Options& options) {
  if (!options.role_set || options.role == Role::kWorker) return std::nullopt;
  options.ValidateForDistributed();
  return RunServerOrScheduler(options);
}

std::optional<int> RunServerRoleIfAsked() {
  return RunServerRoleIfAsked(Options::FromEnv());
}

std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type, const Options& options) {
  if (!options.role_set)
    throw ConfigError("kvstore type '" + type +
                      "' needs DMLC_ROLE (scheduler, server or worker) and "
                      "the other DMLC_* variables; start the job with pskv-launch");
  if (options.role != Role::kWorker)
    throw UsageError("KVStore::Create('" + type +
                     "') in a process with DMLC_ROLE=" + RoleName(options.role) +
                     ": servers and the scheduler do not create stores. Start them with "
                     "pskv-server (pskv-launch does), or begin main with `if (auto rc = "
                     "pskv::RunServerRoleIfAsked()) return *rc;`");
  options.ValidateForDistributed();
  // ---- Process-wide logging and observability, configured by creating a store
  // ---- (the only such place in the dist store; kept together so it can move to
  // ---- the programs as one piece).
  if (!options.log_levels.empty()) SetLogLevels(options.log_levels);  // [observe] PSKV_LOG_LEVEL
  obs::Configure(options, "worker");  // [observe] PSKV_TIMELINE, PSKV_METRICS_PORT
  auto store = std::make_unique<dist::DistWorkerStore>(
      type, options,
      std::make_unique<dist::CpuLocalReducer>(options.bigarray_bound, options.reduction_threads));
  // The log name is set when the process's worker node starts (shared_node.cc).
  // ---- end of the process-wide configuration.
  return store;
}

}  // namespace pskv
