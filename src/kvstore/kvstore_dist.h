// Factory of the distributed stores (dist_sync, dist_async, *_device).
#pragma once

#include <memory>
#include <string>

#include "pskv/kvstore.h"

namespace pskv {

/// Creates the worker side of a dist store. In a server or scheduler process
/// (DMLC_ROLE) it throws UsageError: those roles run through pskv-server or
/// RunServerRoleIfAsked (distributed/server/role_main.h); the library never exits.
std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type, const Options& options);

}  // namespace pskv
