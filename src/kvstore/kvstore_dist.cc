// The factory of the dist stores and the server-role entry point. The store itself is
// dist::DistWorkerStore (kvstore/dist/worker/store.h) with this CPU's local reducer.
#include "kvstore/kvstore_dist.h"

#include "common/logging.h"
#include "kvstore/dist/server/role_main.h"
#include "kvstore/dist/worker/store.h"
#include "pskv/error.h"
#include "pskv/process.h"

namespace pskv {

std::optional<int> RunServerRoleIfAsked(const Options& options) {
  if (!options.role_set || options.role == Role::kWorker) return std::nullopt;
  options.ValidateForDistributed();
  // The process becomes this server or scheduler: the program asked, so the
  // process-wide settings are made here (kvstore.h).
  try {
    ConfigureProcess(options);
  } catch (const std::exception& e) {
    PSKV_ERROR("the job failed: " << e.what());
    return 1;
  }
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
  // No process-wide setting changes here (pskv/process.h): PSKV_LOG_LEVEL,
  // PSKV_TIMELINE and PSKV_METRICS_* are the program's, through ConfigureProcess.
  return std::make_unique<dist::DistWorkerStore>(
      type, options,
      std::make_unique<dist::CpuLocalReducer>(options.bigarray_bound, options.reduction_threads));
}

}  // namespace pskv
