// Errors by kind, Completion and KVServer (ps/kv_app.h); KVWorker is in kv_worker.cc.
#include "ps/kv_app.h"

#include "common/observe.h"  // [observe]

#include <cstring>
#include <future>

#include "common/logging.h"
#include "common/stall.h"
#include "pskv/error.h"

namespace pskv {

std::exception_ptr MakeError(ErrorKind kind, const std::string& msg) {
  switch (kind) {
    case ErrorKind::kKey:
      return std::make_exception_ptr(KeyError(msg));
    case ErrorKind::kShape:
      return std::make_exception_ptr(ShapeError(msg));
    case ErrorKind::kUsage:
      return std::make_exception_ptr(UsageError(msg));
    case ErrorKind::kInvalid:
      return std::make_exception_ptr(InvalidArgument(msg));
    case ErrorKind::kTimeout:
      return std::make_exception_ptr(TimeoutError(msg));
    case ErrorKind::kIO:
      return std::make_exception_ptr(IOError(msg));
    default:
      return std::make_exception_ptr(Error(msg));
  }
}

ErrorKind KindOf(const std::exception& e) {
  if (dynamic_cast<const KeyError*>(&e)) return ErrorKind::kKey;
  if (dynamic_cast<const ShapeError*>(&e)) return ErrorKind::kShape;
  if (dynamic_cast<const UsageError*>(&e)) return ErrorKind::kUsage;
  if (dynamic_cast<const InvalidArgument*>(&e)) return ErrorKind::kInvalid;
  if (dynamic_cast<const TimeoutError*>(&e)) return ErrorKind::kTimeout;
  if (dynamic_cast<const IOError*>(&e)) return ErrorKind::kIO;
  return ErrorKind::kGeneric;
}

PushBody PushBody::Parse(const std::string& body, size_t num_keys) {
  PushBody b;
  const size_t n = num_keys * sizeof(uint64_t);
  if (num_keys == 0 || (body.size() != n && body.size() != n + sizeof(int32_t))) return b;
  b.counts.resize(num_keys);
  std::memcpy(b.counts.data(), body.data(), n);
  if (body.size() > n) {
    int32_t id = -1;
    std::memcpy(&id, body.data() + n, sizeof id);
    b.answerer = id;
  }
  return b;
}

std::string PushBody::Encode(const std::vector<uint64_t>& counts, int answerer) {
  std::string body(reinterpret_cast<const char*>(counts.data()), counts.size() * sizeof(uint64_t));
  if (answerer >= 0) {
    const int32_t id = answerer;
    body.append(reinterpret_cast<const char*>(&id), sizeof id);
  }
  return body;
}

Frame U64Frame(const std::vector<uint64_t>& v) {
  return Frame::Copy(v.data(), v.size() * 8);
}

std::pair<uint64_t, uint64_t> KVWorker::ServerRange(int rank, int num_servers) {
  const uint64_t step = UINT64_MAX / static_cast<uint64_t>(num_servers);
  const uint64_t begin = step * static_cast<uint64_t>(rank);
  const uint64_t end =
      rank + 1 == num_servers ? UINT64_MAX : step * static_cast<uint64_t>(rank + 1);
  return {begin, end};
}

// ------------------------------------------------------------------ completion

std::function<void(std::exception_ptr)> Completion::Callback(const std::shared_ptr<Completion>& c) {
  return [c](std::exception_ptr e) { c->Set(e); };
}

void Completion::Set(std::exception_ptr e) {
  std::lock_guard<std::mutex> lk(mu_);
  if (done_) return;
  error_ = e;
  done_ = true;
  cv_.notify_all();
}

bool Completion::WaitFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, d, [&] { return done_; });
}

std::exception_ptr Completion::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

// ------------------------------------------------------------------ server

KVServer::KVServer(Node* node, Handler handler, CommandHandler command_handler)
    : node_(node), handler_(std::move(handler)), command_handler_(std::move(command_handler)) {
  node_->SetDataHandler([this](Message&& m) { OnMessage(std::move(m)); });
}

void KVServer::OnMessage(Message&& m) {
  if (!(m.h.flags & kRequest)) {
    if (reply_handler_) reply_handler_(std::move(m));
    return;
  }
  KVRequest req;
  req.sender = m.h.sender;
  req.timestamp = m.h.timestamp;
  req.cmd = m.h.head;
  req.push = m.h.flags & kPush;
  req.pull = m.h.flags & kPull;
  req.priority = m.h.priority;
  if (obs::Enabled()) {  // [observe] per-peer bytes and requests (server side)
    req.received_us = obs::NowUs();
    obs::CountPeer(node_->NodeName(m.h.sender), "in", m.h.vals_len);
  }
  if (m.h.flags & kCommand) {
    Message r;
    r.h.flags = kCommand;
    r.h.timestamp = m.h.timestamp;
    try {
      r.body = command_handler_ ? command_handler_(m.h.sender, m.h.head, m.body) : std::string();
    } catch (const std::exception& e) {
      r.h.flags |= kError;
      r.h.head = static_cast<int>(KindOf(e));
      r.body = e.what();
    }
    try {
      node_->Send(m.h.sender, std::move(r));
    } catch (const std::exception& e) {
      PSKV_WARN(node_->Tag() << ": cannot answer a command: " << e.what());
    }
    return;
  }
  req.msg = std::move(m);
  try {
    handler_(std::move(req), this);
  } catch (const std::exception& e) {
    PSKV_ERROR(node_->Tag() << ": request handler threw: " << e.what());
  }
}

void KVServer::Respond(const KVRequest& req, const std::vector<uint64_t>& keys, Frame vals,
                       const std::vector<uint64_t>& lens) {
  Message r;
  r.h.flags = (req.push ? kPush : 0) | (req.pull ? kPull : 0);
  r.h.head = req.cmd;
  r.h.timestamp = req.timestamp;
  r.h.priority = req.priority;
  r.h.num_keys = static_cast<uint32_t>(keys.size());
  if (!keys.empty()) {
    r.keys = U64Frame(keys);
    r.lens = U64Frame(lens);
    r.h.vals_len = vals.size;
    r.vals = std::move(vals);
  }
  if (req.received_us) {  // [observe]
    obs::CountPeer(node_->NodeName(req.sender), "out", r.h.vals_len);
    obs::CountPeerOp(node_->NodeName(req.sender), obs::NowUs() - req.received_us);
  }
  node_->Send(req.sender, std::move(r));
}

void KVServer::RespondError(const KVRequest& req, ErrorKind kind, const std::string& msg) {
  Message r;
  r.h.flags = kError | (req.push ? kPush : 0) | (req.pull ? kPull : 0);
  r.h.head = static_cast<int>(kind);
  r.h.timestamp = req.timestamp;
  r.body = msg.empty() ? "error" : msg;
  if (req.received_us)  // [observe]
    obs::CountPeerOp(node_->NodeName(req.sender), obs::NowUs() - req.received_us, true);
  node_->Send(req.sender, std::move(r));
}

}  // namespace pskv
