// The backend every node uses ("upgrade", kNodeTransport): ZeroMQ (transport/zmq) for every
// handshake, for control and for liveness, and per peer a faster data path negotiated over it — a
// shared-memory ring for peers on this host (shm/ring_path.h, cfg.shm), a direct TCP connection for
// the others (tcp/socket_path.h, cfg.tcp_direct). The negotiation and the contract of a path are in
// data_path.h; the control messages in control_codec.h.
//
// A path is given up (B goes back to ZeroMQ, and offers again later where the
// path says so) when ZeroMQ reports the peer down, when the path breaks or the
// reader stops reading because B wrote something invalid, and at
// Disconnect/Close; A drops a path when B says it closed and A has read
// everything, or when a message from B arrives over ZeroMQ (B gave the path up:
// unread messages are lost, never reordered). Data that came ahead of its SWITCH
// waits for it, however late, until B is cut off (A's own connection to B down for
// seconds) or offers again (incoming_paths.h). Dead peers are noticed by the
// ZeroMQ connection (DownSince), which stays open.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "transport/data_path_name.h"  // DataPath
#include "transport/transport.h"

namespace pskv {

/// The upgrading transport (see above).
std::unique_ptr<Transport> CreateShmTransport(const TransportConfig& cfg);

/// Wraps the control connection (ZeroMQ) of an upgrading transport.
using ControlWrapper = std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>)>;
/// For tests: the upgrading transport whose control messages — its own OFFERs and
/// SWITCHes too — go through `wrap(zmq)` (e.g. a FaultTransport delaying them).
/// Receiving still sleeps on ZeroMQ's own descriptor.
std::unique_ptr<Transport> CreateShmTransport(const TransportConfig& cfg,
                                              const ControlWrapper& wrap);

/// True when messages from `t` to `peer` currently travel through shared memory
/// (for tests and benchmarks; false for any other backend).
bool SendsThroughShm(Transport& t, int peer);
/// The port `t` listens on for direct TCP connections (0: none; for tests).
int DirectTcpPort(Transport& t);

}  // namespace pskv
