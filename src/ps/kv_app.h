// KV messaging over a Node: the worker-side client (KVWorker) and the
// server-side request handler interface (KVServer).
//
// Keys are uint64 "ps keys"; the key space is split evenly over the servers
// (server i owns [i*step, (i+1)*step), step = 2^64/S, spec 4.5). A request's keys
// must be strictly ascending; the worker slices it into one message per server
// that owns some of its keys. Values are raw bytes with a length in bytes per key.
//
// Buffers: a Push's `vals` frame is sent without copying (its owner is held until
// sent). A Pull writes the answer straight from the receive buffer into `out`,
// which must stay valid until the callback has run. Every callback runs exactly
// once — on success, on an error reply, or when the job fails — on the node's
// customer thread (or the calling thread if nothing needed sending).
//
// Bookkeeping is bounded: a request's entry is removed when it completes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ps/node.h"

namespace pskv {

/// Error-kind codes carried in error replies, so the worker rethrows the same type.
enum class ErrorKind : int { kGeneric = 0, kKey = 1, kShape = 2, kUsage = 3, kInvalid = 4 };
std::exception_ptr MakeError(ErrorKind kind, const std::string& msg);
ErrorKind KindOf(const std::exception& e);

class KVWorker {
 public:
  using Callback = std::function<void(std::exception_ptr)>;
  explicit KVWorker(Node* node);

  /// Pushes vals (sum(lens) bytes) for keys; `cmd` is passed to the servers.
  void Push(const std::vector<uint64_t>& keys, Frame vals, const std::vector<uint64_t>& lens,
            int cmd, Callback cb, int priority = 0);
  /// Pulls into `out` (sum(lens) bytes).
  void Pull(const std::vector<uint64_t>& keys, char* out, const std::vector<uint64_t>& lens,
            int cmd, Callback cb, int priority = 0);
  /// Push then pull in one round trip; the answer (out_lens per key) goes to out.
  void PushPull(const std::vector<uint64_t>& keys, Frame vals, const std::vector<uint64_t>& lens,
                char* out, const std::vector<uint64_t>& out_lens, int cmd, Callback cb,
                int priority = 0);
  /// Sends (head, body) to every server and waits for all replies; returns the
  /// reply bodies by server rank. Throws the first error reply, NodeFailure or
  /// TimeoutError.
  std::vector<std::string> Command(int head, const std::string& body,
                                   std::chrono::milliseconds timeout);
  /// Number of requests in flight.
  size_t Pending() const;

  /// Key range owned by server `rank`.
  static std::pair<uint64_t, uint64_t> ServerRange(int rank, int num_servers);

 private:
  struct Slice {
    size_t first = 0, count = 0;  // key indices of this server's part
  };
  struct Request {
    int expected = 0, received = 0;
    std::exception_ptr error;
    Callback cb;
    char* out = nullptr;
    std::vector<uint64_t> keys, out_lens, out_offsets;
    std::map<int, Slice> slices;                       // by server id
    std::shared_ptr<std::vector<std::string>> bodies;  // command replies by server rank
  };
  void Issue(const std::vector<uint64_t>& keys, Frame vals, const std::vector<uint64_t>& lens,
             char* out, const std::vector<uint64_t>& out_lens, int cmd, uint8_t flags, Callback cb,
             int priority);
  void OnMessage(Message&& m);
  void OnFailure(std::exception_ptr e);
  void Finish(uint64_t ts, std::unique_lock<std::mutex>& lk);
  /// Completes request `ts` (if still pending) with error `e`.
  void Fail(uint64_t ts, std::exception_ptr e);

  Node* node_;
  mutable std::mutex mu_;
  uint64_t next_ts_ = 1;
  std::map<uint64_t, Request> pending_;
};

/// A request as the server's handler sees it.
struct KVRequest {
  int sender = 0;
  uint64_t timestamp = 0;
  int cmd = 0;
  bool push = false, pull = false;
  Message msg;  // keys, vals, lens
};

class KVServer {
 public:
  /// Must eventually call Respond or RespondError for every request (the sync
  /// server holds requests until a round completes). Runs on the customer thread.
  using Handler = std::function<void(KVRequest&& req, KVServer* server)>;
  /// Runs a command; returns the reply body; an exception becomes an error reply.
  using CommandHandler = std::function<std::string(int sender, int head, const std::string& body)>;

  KVServer(Node* node, Handler handler, CommandHandler command_handler);

  void Respond(const KVRequest& req, const std::vector<uint64_t>& keys = {}, Frame vals = {},
               const std::vector<uint64_t>& lens = {});
  void RespondError(const KVRequest& req, ErrorKind kind, const std::string& msg);
  Node* node() const { return node_; }

 private:
  void OnMessage(Message&& m);
  Node* node_;
  Handler handler_;
  CommandHandler command_handler_;
};

/// Frame of a uint64 array (copied).
Frame U64Frame(const std::vector<uint64_t>& v);

}  // namespace pskv
