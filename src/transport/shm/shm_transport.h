// Shared-memory backend: ZeroMQ (TCP) for every handshake and for control; a
// shared-memory ring per direction for peers on this host; a direct TCP
// connection per direction for peers on other hosts (cfg.tcp_direct, negotiated
// the same way: tcp/direct_tcp.h), ZeroMQ for the data of the rest.
//
// How a ring comes to carry a pair's messages (sender B, receiver A):
//  1. B connects to A through ZeroMQ as usual (authenticated by the job secret).
//  2. If A's endpoint is an address of this host (PSKV_SHM=auto) or always
//     (PSKV_SHM=1), B creates a sealed memfd ring (shm_ring.h) and sends an OFFER
//     over that connection: its boot id, pid, the memfd's fd number, a random
//     nonce naming it, and B's wake-up pipe. Only an authenticated peer ever
//     learns where the ring is.
//  3. A, on the same host (same boot id and namespaces), maps it through /proc/<pid>/fd after
//     checking it, writes where B can wake A, and marks the ring attached.
//     Otherwise A ignores the offer and B keeps using TCP.
//  4. B sees "attached" on its next Send, sends SWITCH over ZeroMQ and from then
//     on writes that pair's messages into the ring. A starts reading the ring
//     when SWITCH arrives, after everything B sent over ZeroMQ before it: the
//     order of the pair's messages is kept across the switch.
// A ring is given up (B goes back to ZeroMQ, and re-offers after a reconnection)
// when ZeroMQ reports the peer down, when A stops reading because B wrote
// something invalid, and at Disconnect/Close; A drops the ring when B says it
// closed and A has read everything, or when a message from B arrives over
// ZeroMQ (B gave the ring up: unread ring messages are lost, never reordered).
// Dead peers are noticed by the ZeroMQ connection (DownSince), which stays open.
#pragma once

#include <memory>
#include <string>

#include "transport/transport.h"

namespace pskv {

/// The composite transport (see above). `cfg.shm` says which peers get a ring.
std::unique_ptr<Transport> CreateShmTransport(const TransportConfig& cfg);

/// True when messages from `t` to `peer` currently travel through shared memory
/// (for tests and benchmarks; false for any other backend).
bool SendsThroughShm(Transport& t, int peer);
/// How messages from `t` to `peer` travel now: "shm", "tcp" (direct TCP,
/// tcp/direct_tcp.h) or "zmq" (for tests and benchmarks).
std::string DataPath(Transport& t, int peer);
/// The port `t` listens on for direct TCP connections (0: none; for tests).
int DirectTcpPort(Transport& t);

}  // namespace pskv
