#include "transport/upgrade/incoming_paths.h"

#include <variant>

#include "common/logging.h"
#include "pskv/error.h"

namespace pskv::upgrade {

bool IncomingPaths::HandleControl(const Received& in) {
  if (!IsControl(in.frames)) return false;
  PathControl c;
  try {
    c = DecodeControl(in.frames[0]);
  } catch (const ProtocolError& e) {
    PSKV_LOG_LIMITED(limiter_, "ctl/" + in.peer_addr, "WARN",
                     "ignored a path control message from " << in.peer_addr << ": " << e.what());
    return true;
  }
  auto it = in_.find(in.peer);
  if (const auto* sw = std::get_if<Switch>(&c)) {
    if (it != in_.end() && it->second->nonce == sw->nonce) {
      In& r = *it->second;
      r.active = true;
      const char* why = nullptr;
      if (r.path->Activate(&why) == InPath::Status::kDrop) Drop(it, why);
    }
    return true;
  }
  Accept(in, std::get<Offer>(c), it);
  return true;
}

void IncomingPaths::Accept(const Received& in, const Offer& offer, Map::iterator it) {
  DataPath* kind = nullptr;
  for (auto& k : kinds_)
    if (k->kind() == offer.path) kind = k.get();
  if (!kind) return;  // a path this build does not have: declined
  if (it != in_.end()) {
    if (it->second->seq > offer.seq) return;  // stale (see Offer::seq): declined
    Drop(it, nullptr);                        // the peer restarted its side
  }
  if (in_.size() >= kMaxPaths) {
    PSKV_LOG_LIMITED(
        limiter_, "cap", "WARN",
        "declined a direct path from " << in.peer_addr << ": already " << kMaxPaths << " in use");
    return;
  }
  std::string why;
  std::unique_ptr<InPath> path;
  try {
    path = kind->Accept(offer, in.peer_addr, &why);
  } catch (const ProtocolError& e) {
    why = e.what();
  }
  if (!path) {
    if (!why.empty())
      PSKV_LOG_LIMITED(limiter_, "offer/" + in.peer_addr, "WARN",
                       "declined " << PathName(offer.path) << " from " << in.peer_addr
                                   << ", using ZeroMQ: " << why);
    return;
  }
  auto r = std::make_unique<In>();
  r->token = in.peer;
  r->conn = in.conn;
  r->seq = offer.seq;
  r->addr = in.peer_addr;
  r->nonce = offer.nonce;
  r->path = std::move(path);
  if (r->path->fd() >= 0) fds_[r->path->fd()] = in.peer;
  in_[in.peer] = std::move(r);
}

void IncomingPaths::CameOverControl(const Received& in) {
  // Not a message over another of its connections: a node may hold two to this
  // one, and only one of them has a direct path.
  auto r = in_.find(in.peer);
  if (r != in_.end() && r->second->active && r->second->conn == in.conn) Drop(r, nullptr);
}

void IncomingPaths::Drop(Map::iterator it, const char* why) {
  if (why)
    PSKV_LOG_LIMITED(limiter_, "bad/" + it->second->addr, "WARN",
                     "dropped the direct path from " << it->second->addr << ": " << why);
  In& r = *it->second;
  if (r.path->fd() >= 0) fds_.erase(r.path->fd());
  r.path->Close();
  in_.erase(it);
}

bool IncomingPaths::OnEvent(int fd, uint32_t events) {
  auto s = fds_.find(fd);
  if (s == fds_.end()) return false;
  auto it = in_.find(s->second);
  if (it == in_.end() || it->second->path->fd() != s->first) return true;
  const char* why = nullptr;
  if (it->second->path->OnEvent(events, &why) == InPath::Status::kDrop) Drop(it, why);
  return true;
}

bool IncomingPaths::Pump(Received* out) {
  if (in_.empty()) return false;
  auto it = in_.upper_bound(last_token_);
  for (size_t n = in_.size(); n > 0 && !in_.empty(); --n) {
    if (it == in_.end()) it = in_.begin();
    auto cur = it++;
    In& r = *cur->second;
    const char* why = nullptr;
    if (!r.active) {
      const auto now = Clock::now();
      switch (r.path->Check(now, &why)) {
        case InPath::Status::kOk:
          break;
        case InPath::Status::kDrop:
          Drop(cur, why);
          break;
        case InPath::Status::kDataWaiting:
          // Data came ahead of its SWITCH: wait for the SWITCH (see Pump).
          if (cut_off_ && cut_off_(r.token))
            Drop(cur, "data came but its SWITCH did not, and the writer is cut off");
          break;
      }
      continue;
    }
    switch (r.path->Pump(&out->frames, &why)) {
      case InPath::Read::kNothing:
        continue;
      case InPath::Read::kClosed:
        Drop(cur, nullptr);  // the writer closed and everything was read
        continue;
      case InPath::Read::kBad:
        Drop(cur, why);
        continue;
      case InPath::Read::kMessage:
        break;
    }
    out->peer = r.token;
    out->conn = r.conn;
    out->peer_addr = r.addr;
    last_token_ = cur->first;
    return true;
  }
  return false;
}

bool IncomingPaths::AnyReady() const {
  for (auto& [tok, r] : in_)
    if (r->active && r->path->Ready()) return true;
  return false;
}

bool IncomingPaths::Arm() {
  bool data = false;
  for (auto& [tok, r] : in_) data |= r->path->Arm();
  if (data) Disarm();
  return data;
}

void IncomingPaths::Disarm() {
  for (auto& [tok, r] : in_) r->path->Disarm();
}

void IncomingPaths::Clear() {
  in_.clear();
  fds_.clear();
}

}  // namespace pskv::upgrade
