// Factory of the distributed stores (dist_sync, dist_async, *_device).
#pragma once

#include <memory>
#include <string>

#include "pskv/kvstore.h"

namespace pskv {

/// Creates the worker side of a dist store; in a server or scheduler process
/// (DMLC_ROLE) runs that role to the end of the job and exits the process.
std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type, const Options& options);

}  // namespace pskv
