// NodeStart: the phases of Node::Start that act on the node (the transport's bind and
// connections, the status channel, the wait for the node table and the error a failed
// start ends with, abandoning a start, liveness over the node table's peers), as a
// helper of Node given the node it starts. It holds no state of its own: what a start
// waits for (the node table, a refusal) is the Node's, set by its receive thread. The
// phases that need only the options (the transport's configuration, the host to bind,
// the warning about an open job) are free functions in node_start.cc.
//
// Lock rule: as Node's (Node::mu_); each method says whether it is called with that
// mutex held ("mu_ held") or not ("no lock held"). Threads: the application's (Start);
// the timer thread's (StartWatching, for a standby that takes over).
#pragma once

#include <chrono>
#include <exception>
#include <mutex>

#include "transport/transport.h"

namespace pskv {

class Node;

class NodeStart {
 public:
  using Clock = std::chrono::steady_clock;
  explicit NodeStart(Node& node) : n_(node) {}

  /// No lock held: creates the transport from `tc`, binds it and connects to the
  /// scheduler (the scheduler binds only); sets the node's address.
  void BindAndConnect(const TransportConfig& tc);
  /// No lock held: the launcher's status channel, this node's first record.
  void OpenStatusChannel();
  /// Waits (lk on mu_ held) for the node table, a refusal or a failure, at most
  /// PSKV_REGISTER_TIMEOUT; returns why the start failed, or null.
  std::exception_ptr AwaitNodeTable(std::unique_lock<std::mutex>& lk);
  /// mu_ held: the error a start that waited for the node table ends with (null: none).
  std::exception_ptr FailureLocked() const;
  /// No lock held: reports `err`, tells the nodes that registered (`refuse_registered`:
  /// the scheduler before the job formed), stops the threads and throws `err`.
  [[noreturn]] void Abandon(std::exception_ptr err, bool refuse_registered);
  /// mu_ held: Liveness watches the peers of the node table.
  void StartWatching();

 private:
  Node& n_;
};

}  // namespace pskv
