// Answers: the one exit of a key range's replies (docs/design.md, "The server as
// components").
//
// Every answer of a dense data request, an optimizer-states request, a replicated
// change or a part of a range copy leaves through one Answers: an acknowledgement, an
// error, or values pointing at the keys' memory (no copy). ServerAnswers sends them
// with the KVServer; a test may record them instead (tests/distributed/test_range_store.cc).
// row_sparse keys answer through SparseServer, which sends with the KVServer itself.
//
// Thread-safety: from any thread (the shard threads, the receive thread, replication
// callbacks); ServerAnswers only calls KVServer::Respond*, which is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvstore/distributed/server/validate.h"
#include "ps/kv_app.h"
#include "pskv/ndarray.h"

namespace pskv {

/// Keeps a value's memory (and its key's reply token) alive while a reply is sent.
struct ReplyOwner {
  NDArray value;
  std::shared_ptr<int> token;
};
/// Wire keys and the values that answer them, in the request's key order.
using KeyValues = std::vector<std::pair<int64_t, ReplyOwner>>;

class Answers {
 public:
  virtual ~Answers() = default;
  /// Answers `req` with no values (a push, an init, an acknowledged change).
  virtual void Ack(const KVRequest& req) = 0;
  /// Answers `req` with an error the worker raises as `failure.kind`.
  virtual void Error(const KVRequest& req, const Failure& failure) = 0;
  /// Answers `req` with `values` (for a pull; a push without pull is acknowledged).
  virtual void Values(const KVRequest& req, KeyValues values) = 0;
  /// Answers `req` with one blob under ps key `ps_key` (an optimizer-states pull).
  virtual void Blob(const KVRequest& req, uint64_t ps_key,
                    std::shared_ptr<const std::string> blob) = 0;
};

/// Which key range a component serves: `fixed`, or (a plain server, -1) the node's
/// rank, known once the node started.
struct RangeOf {
  const Node* node = nullptr;
  int fixed = -1;
  int index() const { return fixed >= 0 ? fixed : node->rank(); }
  KeyRange keys() const { return KeyRange(index(), node->num_servers()); }
  /// The ps key of wire key `wire_key` of this range.
  uint64_t PsKey(int64_t wire_key) const;
};

/// Answers sent with a KVServer, for the key range `range`.
class ServerAnswers final : public Answers {
 public:
  ServerAnswers(KVServer* server, RangeOf range) : server_(server), range_(range) {}
  void Ack(const KVRequest& req) override { server_->Respond(req); }
  void Error(const KVRequest& req, const Failure& failure) override {
    server_->RespondError(req, failure.kind, failure.message);
  }
  void Values(const KVRequest& req, KeyValues values) override;
  void Blob(const KVRequest& req, uint64_t ps_key,
            std::shared_ptr<const std::string> blob) override;

 private:
  KVServer* server_;
  RangeOf range_;
};

}  // namespace pskv
