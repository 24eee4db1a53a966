// The entry point of a server or scheduler process: runs its role to the end of the
// job. Programs reach it through the public pskv::RunServerRoleIfAsked (kvstore.h).
#pragma once

#include "pskv/options.h"

namespace pskv {

/// Runs this process's role (options.role must be server or scheduler) until the
/// job ends. Changes no process-wide setting (the public RunServerRoleIfAsked
/// configures the process first). Returns the process exit status: 0 on a clean
/// end, 1 on a failure (which is printed).
int RunServerOrScheduler(const Options& options);

}  // namespace pskv
