// pskv::ConfigureProcess (pskv/process.h): the one place where the process-wide log
// settings and the observability recorder are set from Options.
#include "pskv/process.h"

#include "common/logging.h"
#include "common/observe.h"

namespace pskv {

void ConfigureProcess(const Options& options) {
  const std::string role = options.role_set ? RoleName(options.role) : "worker";
  if (!options.log_levels.empty()) SetLogLevels(options.log_levels);
  // A process of a launched job (DMLC_ROLE set) is one node; without a role it may
  // hold a whole job (benchmarks, tests) and keeps the name "pskv".
  if (options.role_set) SetLogNameFollowingNode(role);
  obs::Configure(options, role);
}

void ConfigureProcess() {
  ConfigureProcess(Options::FromEnv());
}

}  // namespace pskv
