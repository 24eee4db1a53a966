// Which data path a transport's messages to a peer take now, for tests and
// benchmarks that must know what they measure. Defined by the upgrading transport
// (upgrade/upgrading_transport.cc), the only backend with more than one path; a
// separate header so that layers above the transport ask without including a
// backend's.
#pragma once

#include <string>

#include "transport/transport.h"

namespace pskv {

/// How messages from `t` to `peer` travel now: "shm", "tcp" (direct TCP) or
/// "zmq" (also for any other backend).
std::string DataPath(Transport& t, int peer);

}  // namespace pskv
