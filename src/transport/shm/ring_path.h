// The shared-memory data path (upgrade/data_path.h): a sealed memfd ring per
// direction (shm_ring.h) between peers on one host. docs/transport.md, "Shared
// memory", describes the set-up, the checks and the wake-ups.
#pragma once

#include <memory>

#include "transport/upgrade/data_path.h"

namespace pskv::shm {

/// The ring path of a transport: offered per cfg.shm (to peers whose endpoint
/// is an address of this host, to all, or to none), accepted from peers with this
/// host's boot id and namespaces.
std::unique_ptr<upgrade::DataPath> CreateRingPath(const upgrade::PathHost& host);

}  // namespace pskv::shm
