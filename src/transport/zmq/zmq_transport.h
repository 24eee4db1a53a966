// ZeroMQ backend: one ROUTER socket bound for receiving, one DEALER socket per
// peer for sending. Payload frames go out with zmq_msg_init_data (no copy); the
// frame's owner is released by ZeroMQ's free callback once the bytes are sent.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace pskv {
/// `wake_fd` (optional): a file descriptor Recv also waits on; when it becomes
/// readable Recv returns false early (the shared-memory backend's wake-up pipe).
std::unique_ptr<Transport> CreateZmqTransport(const TransportConfig& cfg, int wake_fd = -1);
/// The file descriptor (ZMQ_FD) that becomes readable when the bound socket of a
/// "zmq" transport may have something new: a caller sleeping on it (epoll) must
/// look with Recv(in, 0ms) before every sleep. -1 before Bind.
int ZmqReceiveFd(Transport& zmq);
}  // namespace pskv
