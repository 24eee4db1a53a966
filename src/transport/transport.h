// Transport: moves framed messages between nodes. Nothing else — registration,
// barriers, heartbeats and resend live in the protocol layer above (src/ps).
//
// A backend lives in its own folder (zmq/, fault/) and is created by
// CreateTransport(kind). Contract every backend meets (tests/test_transport.cc
// runs the same suite against each):
//  * Bind() once, before anything else; it returns the "host:port" bound.
//  * Connect(peer, endpoint) may be called again for the same peer with a new
//    endpoint; Send() to a peer not connected is an IOError.
//  * Send() is thread-safe, never blocks on a slow or dead peer, and sends the
//    frames' memory without copying it; each frame's owner is released once the
//    backend no longer needs the memory.
//  * Recv() is called by one thread only; it returns false on timeout.
//  * Messages between one pair of nodes arrive in order, or not at all.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace pskv {

/// A view of bytes plus whatever keeps them alive.
struct Frame {
  const char* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;

  /// A frame owning a copy of `s`.
  static Frame Copy(const void* p, size_t n);
  static Frame FromString(std::string s);
};

class Transport {
 public:
  virtual ~Transport() = default;
  /// Binds to host:port (port 0: any free port). Returns the bound "host:port".
  virtual std::string Bind(const std::string& host, int port) = 0;
  virtual void Connect(int peer, const std::string& endpoint) = 0;
  virtual void Disconnect(int peer) = 0;
  virtual void Send(int peer, std::vector<Frame> frames) = 0;
  virtual bool Recv(std::vector<Frame>* frames, std::chrono::milliseconds timeout) = 0;
  /// Releases sockets; waits at most `linger` for queued messages to go out.
  virtual void Close(std::chrono::milliseconds linger) = 0;
  virtual std::string Name() const = 0;
};

/// Creates a backend: "zmq" (TCP through ZeroMQ).
std::unique_ptr<Transport> CreateTransport(const std::string& kind);

}  // namespace pskv
