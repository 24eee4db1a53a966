// KV messaging over a Node: the worker-side client (KVWorker) and the
// server-side request handler interface (KVServer).
//
// Keys are uint64 "ps keys"; the key space is split evenly over the servers
// (server i owns [i*step, (i+1)*step), step = 2^64/S; docs/design.md, "Key
// placement"). A request's keys must be strictly ascending; the worker slices it
// into one message per server that owns some of its keys. Values are raw bytes
// with a length in bytes per key.
//
// Buffers: a Push's `vals` frame (plain or gathered) is sent without copying (its
// owner is held until sent). A Pull writes the answer straight from the receive buffer into `out`,
// which must stay valid until the callback has run. Every callback runs exactly
// once — on success, on an error reply, or when the job fails — on the node's
// receive thread (or the calling thread if nothing needed sending).
//
// Replies are matched to messages, not counted: a request completes when every
// message it sent has been answered exactly once, by the server it went to (each
// message carries its own timestamp); a duplicated reply, or one from a server that
// was not asked, is ignored (so a duplicate can never complete a sliced pull early
// with part of the output stale).
//
// Priorities: every message of a request carries its priority; the Node sends big
// messages in priority order (node.h, "Send scheduling") and the server's replies
// carry the request's priority too. So two requests to one server are not ordered
// against each other: issue the second from the first's callback when order matters
// (the dist store's engine runs one operation per key at a time).
//
// Waiting: the KV layer blocks in exactly one way, KVWorker::Await — a request's
// completion state is shared (Completion, held by the callback and the waiter), the
// wait has a timeout, logs what it still waits for every stall interval (with
// back-off), and on timeout cancels the request: its entry is removed under the
// lock that reply handling takes, so a late reply finds nothing and writes nowhere.
//
// Bookkeeping is bounded: a request's entry is removed when it completes or is
// cancelled.
//
// Replicated servers (PSKV_REPLICAS >= 1; docs/fault-tolerance.md): a message goes to
// its key range's current primary in the node's range table. Each message keeps a
// copy of itself (its frames, not their bytes) until answered; when a newer table
// names another primary for its range, it is sent again, unchanged, to that one (a
// command to a server that left the job counts as answered). A push message carries
// in its body one u64 per key: how many pushes of that ps key this worker has issued,
// this one included, so that a server can recognise a retried push it already applied
// (PushBody).
//
// Answers from a copy on the worker's host (docs/fault-tolerance.md, "Answers from a
// copy on the worker's host"): with PSKV_REPLICAS=1, a push-pull message of one key
// names, after its push count, its *answerer* when that is not the primary: the first
// replica of the range on this worker's host (Node::HostOf), if the primary is not on
// it. The primary may then have that replica answer the message (over loopback) once
// it applied the round, instead of sending the answer across hosts itself. A message is accepted
// from its primary or from its answerer, once; when a newer range table no longer
// lists its answerer, it is sent again to the primary (a retried push the primary
// holds is answered from its state, one still waiting in its open round is answered
// by the primary itself).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ps/node.h"
#include "ps/push_pacer.h"

namespace pskv {

/// Error-kind codes carried in error replies, so the worker rethrows the same type.
enum class ErrorKind : int {
  kGeneric = 0,
  kKey = 1,
  kShape = 2,
  kUsage = 3,
  kInvalid = 4,
  kTimeout = 5,
  kIO = 6,
};
std::exception_ptr MakeError(ErrorKind kind, const std::string& msg);
ErrorKind KindOf(const std::exception& e);

/// Completion state of one request, shared by its callback and its waiter (so a
/// callback that runs after the waiter gave up touches only this heap object).
class Completion {
 public:
  /// A callback that records the outcome; keeps this object alive.
  static std::function<void(std::exception_ptr)> Callback(const std::shared_ptr<Completion>& c);
  void Set(std::exception_ptr e);
  /// Waits up to `d`; true if completed.
  bool WaitFor(std::chrono::milliseconds d);
  std::exception_ptr error() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class KVWorker {
 public:
  using Callback = std::function<void(std::exception_ptr)>;
  /// With `message_bytes` given, no message of a request carries more than this part
  /// of its bytes for the server (a key bigger than that aside): where links are the
  /// limit, a step then takes at most 1 + 1/8 of their bound (docs/performance.md).
  static constexpr uint64_t kMessagesPerPart = 8;
  explicit KVWorker(Node* node);

  /// Pushes vals (sum(lens) bytes) for keys; `cmd` is passed to the servers.
  /// Returns the request's id (for Await / Cancel). `ahead` > 0 paces the request's
  /// messages (ps/push_pacer.h: at most `ahead` bytes per server unanswered), which
  /// is deadlock-free only for the pieces of one key. A server's keys travel in
  /// messages of up to `message_bytes` (cut at key boundaries; 0: the wire chunk
  /// size, PSKV_WIRE_CHUNK_BYTES; 1: one key per message), and where it is given (> 0)
  /// of at most a kMessagesPerPart-th of the server's part, where its keys allow: a
  /// sync server answers a message once all of it arrived, so that the answers lag the
  /// pushes by a message.
  uint64_t Push(const std::vector<uint64_t>& keys, Frame vals, const std::vector<uint64_t>& lens,
                int cmd, Callback cb, int priority = 0, uint64_t ahead = 0,
                uint64_t message_bytes = 0);
  /// Pulls into `out` (sum(lens) bytes).
  uint64_t Pull(const std::vector<uint64_t>& keys, char* out, const std::vector<uint64_t>& lens,
                int cmd, Callback cb, int priority = 0);
  /// Push then pull in one round trip; the answer (out_lens per key) goes to out.
  /// `ahead` and `message_bytes` as for Push.
  uint64_t PushPull(const std::vector<uint64_t>& keys, Frame vals,
                    const std::vector<uint64_t>& lens, char* out,
                    const std::vector<uint64_t>& out_lens, int cmd, Callback cb, int priority = 0,
                    uint64_t ahead = 0, uint64_t message_bytes = 0);
  /// Pull and PushPull scattering the answer: key i's bytes go to outs[i] (each valid
  /// until the callback has run), straight from the receive buffer.
  uint64_t Pull(const std::vector<uint64_t>& keys, std::vector<char*> outs,
                const std::vector<uint64_t>& lens, int cmd, Callback cb, int priority = 0);
  uint64_t PushPull(const std::vector<uint64_t>& keys, Frame vals,
                    const std::vector<uint64_t>& lens, std::vector<char*> outs,
                    const std::vector<uint64_t>& out_lens, int cmd, Callback cb, int priority = 0);
  /// Sends (head, body) to the servers `to` (all servers if empty) and waits for all
  /// replies; returns the reply bodies by server rank (empty for servers not asked).
  /// Throws the first error reply, NodeFailure or TimeoutError (naming the servers
  /// that did not answer).
  std::vector<std::string> Command(int head, const std::string& body,
                                   std::chrono::milliseconds timeout,
                                   const std::vector<int>& to = {});

  /// The KV layer's one blocking wait: waits for request `ts` whose callback was
  /// made by Completion::Callback(c). Every `stall` (doubling; 0 = never) logs which
  /// servers have not answered. On timeout cancels the request (a late reply is then
  /// dropped) and throws TimeoutError naming `what` and the silent servers. Rethrows
  /// the request's error.
  void Await(uint64_t ts, const std::shared_ptr<Completion>& c, std::chrono::milliseconds timeout,
             std::chrono::milliseconds stall, const std::string& what);
  /// Forgets request `ts` without running its callback (a late reply is dropped).
  /// Returns false if it had completed already.
  bool Cancel(uint64_t ts);
  /// Names of the servers request `ts` still waits for ("server[0] at h:p, ...");
  /// empty if it is not pending.
  std::string Missing(uint64_t ts) const;
  /// One line per pending request older than `min_age`: its keys and the servers
  /// that have not answered (for stall reports); at most kReportItems lines, then
  /// "and N more" (common/stall.h).
  std::vector<std::string> DescribePending(std::chrono::milliseconds min_age) const;
  /// The servers request `ts` still waits for (ts 0: every pending request), as
  /// status records name them.
  std::vector<NodeRef> WaitedServers(uint64_t ts = 0) const;
  /// Number of requests in flight.
  size_t Pending() const;

  /// Key range owned by server `rank`.
  static std::pair<uint64_t, uint64_t> ServerRange(int rank, int num_servers);

 private:
  struct Slice {
    size_t first = 0, count = 0;  // key indices of this message's part
  };
  /// One message of a request (a server's keys, or a piece of them: with
  /// PSKV_WIRE_CHUNK_BYTES a server's part is cut into messages of about that many
  /// bytes at key boundaries, so that other requests' messages can go between them).
  /// Its timestamp is the request's id + its index.
  struct Part {
    int server = 0;
    Slice slice;
    int range = -1;                   // the key range of its keys (-1: a command)
    std::unique_ptr<Message> resend;  // replicated servers only: the message, to send again
    int answerer = -1;  // replicated: a replica that may answer instead of `server` (or -1)
  };
  struct Request {
    uint64_t num_parts = 0;            // timestamps [id, id + num_parts)
    std::map<uint64_t, Part> waiting;  // parts (by timestamp) that have not been answered
    std::chrono::steady_clock::time_point issued = std::chrono::steady_clock::now();
    int cmd = 0;
    uint8_t flags = 0;
    std::exception_ptr error;
    Callback cb;
    char* out = nullptr;
    std::vector<char*> outs;  // per key, instead of `out` (scattering pulls)
    std::vector<uint64_t> keys, out_lens, out_offsets;
    std::shared_ptr<std::vector<std::string>> bodies;  // command replies by server rank
    std::unique_ptr<PushPacer> pacer;                  // paced requests only
    std::map<uint64_t, std::pair<int, Message>> held;  // by timestamp: (server, message) unsent
  };
  uint64_t Issue(const std::vector<uint64_t>& keys, Frame vals, const std::vector<uint64_t>& lens,
                 char* out, std::vector<char*> outs, const std::vector<uint64_t>& out_lens, int cmd,
                 uint8_t flags, Callback cb, int priority, uint64_t ahead = 0,
                 uint64_t message_bytes = 0);
  /// Cuts a request into its messages (one per server's keys, or pieces of them at
  /// key boundaries: PSKV_WIRE_CHUNK_BYTES or `message_bytes`) and their parts.
  void Split(const std::vector<uint64_t>& keys, const Frame& vals,
             const std::vector<uint64_t>& lens, const std::vector<uint64_t>& out_lens, int cmd,
             uint8_t flags, int priority, uint64_t message_bytes,
             std::vector<std::pair<int, Message>>& msgs, std::vector<Part>& parts) const;
  /// Sends the messages of request `ts` not held back (to < 0), in `order` if paced.
  void SendIssued(uint64_t ts, std::vector<std::pair<int, Message>>& msgs,
                  const std::vector<size_t>& order);
  /// Copies a pull answer for part `s` of `req` into its outputs; "" or what is wrong.
  static std::string TakePullAnswer(const Message& m, const Slice& s, Request& req);
  void OnMessage(Message&& m);
  void OnFailure(std::exception_ptr e);
  /// A newer range table: messages whose range moved are sent to the new primary.
  void OnRangeTable(const RangeTable& table);
  /// Replicated: sends each message of a request issued at `ts` to its range's
  /// primary, numbers its pushes per key and keeps a copy to send again.
  void RouteLocked(const std::vector<uint64_t>& keys, uint8_t flags, uint64_t ts,
                   std::vector<std::pair<int, Message>>& msgs, std::vector<Part>& parts);
  /// Replicated: the answerer of this worker's one-key push-pulls of `range` (ps/kv_app.h):
  /// the primary if it is on this worker's host, else the range's first replica on it,
  /// else -1 (the primary answers).
  int AnswererLocked(int range) const;
  /// Sets `part`'s answerer (AnswererLocked, for a one-key push-pull) and writes it into
  /// the body of its message `m` after the push count.
  void AddressLocked(Part& part, Message& m) const;
  /// Replicated: learns every server's host (once the node table is known).
  void LearnHosts();
  void Finish(uint64_t ts, std::unique_lock<std::mutex>& lk);
  std::string MissingLocked(const Request& r) const;
  /// Completes request `ts` (if still pending) with error `e`.
  void Fail(uint64_t ts, std::exception_ptr e);
  /// The pending request a reply's timestamp belongs to (pending_.end() if none).
  std::map<uint64_t, Request>::iterator FindLocked(uint64_t reply_ts);

  Node* node_;
  const bool replicated_;
  mutable std::mutex mu_;
  uint64_t next_ts_ = 1;
  std::map<uint64_t, Request> pending_;
  RangeTable table_;                            // replicated: the node's, as last applied
  std::map<uint64_t, uint64_t> pushes_of_key_;  // replicated: pushes issued per ps key
  std::once_flag hosts_once_;
  std::string host_;                  // replicated: this node's host
  std::map<int, std::string> hosts_;  // replicated: every server's host (LearnHosts)
};

/// The body of a replicated job's push message (ps/kv_app.h, "Replicated servers"):
/// per key the worker's push count, then, for a one-key push-pull, optionally the node
/// id of its answerer (int32).
struct PushBody {
  std::vector<uint64_t> counts;  // empty: not a push body of that many keys
  int answerer = -1;             // -1: none named (the primary answers)
  /// Parses `body` of a message of `num_keys` keys.
  static PushBody Parse(const std::string& body, size_t num_keys);
  /// The counts' bytes of such a body, then `answerer` unless it is -1.
  static std::string Encode(const std::vector<uint64_t>& counts, int answerer);
};

/// A request as the server's handler sees it.
struct KVRequest {
  int sender = 0;
  uint64_t timestamp = 0;
  int cmd = 0;
  int priority = 0;  // the request's; its reply is sent with it
  bool push = false, pull = false;
  Message msg;               // keys, vals, lens
  uint64_t received_us = 0;  // when it arrived (obs::NowUs), if metrics are on
};

class KVServer {
 public:
  /// Must eventually call Respond or RespondError for every request (the sync
  /// server holds requests until a round completes). Runs on the node's receive
  /// thread, or on a DistServer shard thread when the server dispatches to shards.
  using Handler = std::function<void(KVRequest&& req, KVServer* server)>;
  /// Runs a command; returns the reply body; an exception becomes an error reply.
  using CommandHandler = std::function<std::string(int sender, int head, const std::string& body)>;

  KVServer(Node* node, Handler handler, CommandHandler command_handler);
  /// Answers to requests this server sent (a primary's replication to its replicas),
  /// on the receive thread; without one they are dropped. Set before node->Start().
  void SetReplyHandler(std::function<void(Message&&)> h) { reply_handler_ = std::move(h); }

  void Respond(const KVRequest& req, const std::vector<uint64_t>& keys = {}, Frame vals = {},
               const std::vector<uint64_t>& lens = {});
  void RespondError(const KVRequest& req, ErrorKind kind, const std::string& msg);
  Node* node() const { return node_; }

 private:
  void OnMessage(Message&& m);
  Node* node_;
  Handler handler_;
  CommandHandler command_handler_;
  std::function<void(Message&&)> reply_handler_;
};

/// Frame of a uint64 array (copied).
Frame U64Frame(const std::vector<uint64_t>& v);

}  // namespace pskv
