// ZeroMQ backend: one ROUTER socket bound for receiving, one DEALER socket per
// peer for sending. Payload frames go out with zmq_msg_init_data (no copy); the
// frame's owner is released by ZeroMQ's free callback once the bytes are sent.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace pskv {
std::unique_ptr<Transport> CreateZmqTransport(const TransportConfig& cfg);
}
