// The direct TCP data path (upgrade/data_path.h): one plain TCP connection per
// direction between peers that share no memory, written by the sending thread and
// read by the Recv thread (direct_tcp.h has the handshake; docs/transport.md,
// "Direct TCP").
#pragma once

#include <memory>

#include "transport/upgrade/data_path.h"

namespace pskv::direct {

/// The socket path of a transport: listens at Bind (not with cfg.encrypt, nor on
/// the scheduler, nor without cfg.tcp_direct), offered to every peer but the
/// scheduler.
std::unique_ptr<upgrade::DataPath> CreateSocketPath(const upgrade::PathHost& host);

}  // namespace pskv::direct
