// The sending side of the upgrading transport (sending.h): the per-peer state
// machine of data_path.h and the writer thread.
#include "transport/upgrade/sending.h"

#include <poll.h>

#include <functional>

#include "common/logging.h"
#include "pskv/error.h"
#include "transport/upgrade/negotiator.h"

namespace pskv::upgrade {

using namespace std::chrono_literals;

Sender::Sender(const TransportConfig& cfg, Transport& control,
               const std::vector<std::unique_ptr<DataPath>>& kinds, RateLimiter& limiter, int tx_rd,
               int tx_wr)
    : cfg_(cfg),
      control_(control),
      kinds_(kinds),
      limiter_(limiter),
      tx_rd_(tx_rd),
      tx_wr_(tx_wr) {}

void Sender::Start() {
  writer_ = std::thread([this] { WriterLoop(); });
}

void Sender::Connect(int peer, const std::string& endpoint, uint64_t token) {
  std::unique_lock<std::shared_mutex> lk(peers_mu_);
  auto& o = outs_[peer];
  if (o && o->endpoint == endpoint && o->token == token) return;
  uint64_t pacing = 0;  // a cap set for this peer holds for its new connection too
  if (o) {
    std::lock_guard<std::mutex> g(o->mu);
    Teardown(*o);
    pacing = o->pacing;
  }
  o = std::make_unique<Out>();
  o->endpoint = endpoint;
  o->token = token;
  o->pacing = pacing;
  // One direct path per pair of nodes: another connection to the same node (a
  // second peer id for it) stays on ZeroMQ — the receiver keeps one path per
  // sending node.
  for (auto& [id, other] : outs_)
    if (id != peer && other->token == token) return;
  for (auto& k : kinds_)
    if (k->Wants(endpoint, token)) {
      std::lock_guard<std::mutex> g(o->mu);
      o->kind = k.get();
      Offer(peer, *o, false);
      break;
    }
}

void Sender::Disconnect(int peer) {
  std::unique_ptr<Out> gone;  // destroyed after its mutex is released
  std::unique_lock<std::shared_mutex> lk(peers_mu_);
  auto it = outs_.find(peer);
  if (it == outs_.end()) return;
  gone = std::move(it->second);
  outs_.erase(it);
  std::lock_guard<std::mutex> g(gone->mu);
  Teardown(*gone);
}

void Sender::SetPacingRate(int peer, uint64_t bytes_per_s) {
  std::shared_lock<std::shared_mutex> lk(peers_mu_);
  auto it = outs_.find(peer);
  if (it == outs_.end()) return;  // not connected: nothing to pace
  Out& o = *it->second;
  std::lock_guard<std::mutex> g(o.mu);
  o.pacing = bytes_per_s;
  if (o.path) o.path->SetPacingRate(bytes_per_s);
}

bool Sender::SendStats(int peer, TcpSendStats* out) {
  std::shared_lock<std::shared_mutex> lk(peers_mu_);
  auto it = outs_.find(peer);
  if (it == outs_.end()) return false;
  Out& o = *it->second;
  std::lock_guard<std::mutex> g(o.mu);
  return o.state == Out::kActive && o.path && o.path->SendStats(out);
}

void Sender::Send(int peer, std::vector<Frame> frames) {
  if (frames.empty()) return;
  std::shared_lock<std::shared_mutex> lk(peers_mu_);
  auto it = outs_.find(peer);
  if (it == outs_.end()) return control_.Send(peer, std::move(frames));
  Out& o = *it->second;
  std::lock_guard<std::mutex> g(o.mu);
  Advance(peer, o);
  if (o.state != Out::kActive) return control_.Send(peer, std::move(frames));
  o.pending.push_back(OutMsg::Make(std::move(frames)));
  if (o.pending.size() == 1) WriteSome(peer, o, false);
  // Still waiting (it is the last one queued): frames without an owner are only
  // valid during this call, so they are copied now.
  if (!o.pending.empty()) o.pending.back().OwnAll();
}

std::string Sender::PathTo(int peer) {
  std::shared_lock<std::shared_mutex> lk(peers_mu_);
  auto it = outs_.find(peer);
  if (it == outs_.end()) return "zmq";
  std::lock_guard<std::mutex> g(it->second->mu);
  if (it->second->state != Out::kActive) return "zmq";
  return DataPathName(it->second->kind->kind());
}

bool Sender::CutOff(uint64_t token) {
  std::shared_lock<std::shared_mutex> lk(peers_mu_);
  for (auto& [id, o] : outs_) {
    if (o->token != token) continue;
    const auto since = control_.DownSince(id);
    return since != Clock::time_point{} && Clock::now() - since > kCutOffAfter;
  }
  return false;
}

void Sender::Linger(std::chrono::milliseconds linger) {
  for (const auto end = Clock::now() + linger; Clock::now() < end;) {
    bool any = false;
    {
      std::shared_lock<std::shared_mutex> lk(peers_mu_);
      for (auto& [id, o] : outs_) {
        std::lock_guard<std::mutex> g(o->mu);
        any |= o->state == Out::kActive && !o->pending.empty();
      }
    }
    if (!any) break;
    std::this_thread::sleep_for(1ms);
  }
}

void Sender::StopWriter() {
  if (stop_.exchange(true)) return;
  Signal(tx_wr_);
  if (writer_.joinable()) writer_.join();
}

void Sender::Clear() {
  std::unique_lock<std::shared_mutex> lk(peers_mu_);
  for (auto& [id, o] : outs_) {
    std::lock_guard<std::mutex> g(o->mu);
    Teardown(*o);
  }
  outs_.clear();
}

void Sender::Offer(int peer, Out& o, bool up) {
  upgrade::Offer w;
  std::string why;
  o.path = o.kind->Offer(&w.nonce, &w.details, &why);
  if (!o.path) {
    PSKV_LOG_LIMITED(limiter_, "create", "WARN",
                     why << "; messages to node " << peer << " go through ZeroMQ");
    o.state = Out::kOff;
    return;
  }
  o.path->SetPacingRate(o.pacing);
  w.path = o.kind->kind();
  w.seq = ++offers_;
  o.nonce = w.nonce;
  o.seen_up = up;
  o.offered_up_at = up ? Clock::now() : Clock::time_point{};
  o.state = Out::kOffered;
  if (!SendControl(peer, o, w)) o.state = Out::kDown;  // offered again once it is up
}

bool Sender::SendControl(int peer, Out& o, const upgrade::PathControl& c) {
  try {
    control_.Send(peer, {upgrade::EncodeControl(c)});
    return true;
  } catch (const Error&) {
    Teardown(o);
    o.retry_after = Clock::now() + kRetryBroken;
    return false;
  }
}

void Sender::Teardown(Out& o) {
  if (o.path) o.path->Close(o.state == Out::kActive);
  o.path.reset();
  o.pending.clear();
}

void Sender::GiveUp(int peer, Out& o, const std::string& why, bool for_good,
                    Clock::duration retry) {
  if (!why.empty())
    PSKV_LOG_LIMITED(limiter_, std::string("out/") + upgrade::PathName(o.kind->kind()), "WARN",
                     upgrade::PathName(o.kind->kind())
                         << " with node " << peer << " given up (" << why << "); using ZeroMQ");
  Teardown(o);
  o.state = for_good ? Out::kOff : Out::kDown;
  o.seen_up = false;
  o.retry_after = Clock::now() + retry;
}

void Sender::Advance(int peer, Out& o) {
  if (o.state == Out::kPlain || o.state == Out::kOff) return;
  const bool up = control_.DownSince(peer) == Clock::time_point{};
  if (o.state == Out::kDown) {
    if (up && Clock::now() >= o.retry_after) Offer(peer, o, true);
    return;
  }
  if (!up) {
    if (o.state == Out::kActive || o.seen_up) {
      Teardown(o);
      o.state = Out::kDown;
    }
    return;
  }
  std::string why;
  if (o.state == Out::kOffered) {
    const auto now = Clock::now();
    if (o.offered_up_at == Clock::time_point{}) o.offered_up_at = now;
    o.seen_up = true;
    switch (o.path->Accepted(&why)) {
      case OutPath::Taken::kWaiting:
        // A peer that declines (another host, PSKV_SHM=0, PSKV_TCP_DIRECT=0, no
        // route to the port) says nothing: past the deadline, give the path's
        // resources back and stay on ZeroMQ with this peer (for good, or until
        // the path says to try again).
        if (now - o.offered_up_at > cfg_.shm_attach_deadline) {
          const auto retry = o.kind->RetryDeclinedAfter();
          GiveUp(peer, o, "", retry.count() == 0, retry);
        }
        return;
      case OutPath::Taken::kRefused:
        GiveUp(peer, o, why, true);
        return;
      case OutPath::Taken::kTaken:
        break;
    }
    if (!SendControl(peer, o, upgrade::Switch{o.nonce})) {
      o.state = Out::kDown;
      o.seen_up = false;
      return;
    }
    o.state = Out::kActive;
    PSKV_DEBUG("messages to node " << peer << " now go through "
                                   << upgrade::PathName(o.kind->kind()));
    return;
  }
  if (o.path->ReaderGone(&why)) GiveUp(peer, o, why, true);
}

uint64_t Sender::WriteSome(int peer, Out& o, bool from_writer) {
  uint64_t n = 0;
  std::string why;
  switch (o.path->Write(o.pending, from_writer, &n, &why)) {
    case OutPath::Written::kOk:
      break;
    case OutPath::Written::kBroken:
      // Unread messages are lost, never reordered: the receiver drops the path
      // when the next message arrives through ZeroMQ.
      GiveUp(peer, o, why, false);
      break;
    case OutPath::Written::kInvalid:
      GiveUp(peer, o, why, true);
      break;
  }
  return n;
}

void Sender::WriterLoop() {
  std::vector<pollfd> fds;
  // The paths' own descriptors (a listener): when one is ready, and at least
  // every 100 ms (handshake deadlines; also while sustained writing keeps this
  // loop busy).
  Clock::time_point next_sweep{};
  auto adopt = [this](upgrade::DataPath* kind) {
    return [this, kind](const upgrade::Nonce& nonce, const std::function<bool(OutPath&)>& fn) {
      std::shared_lock<std::shared_mutex> lk(peers_mu_);
      for (auto& [id, o] : outs_) {
        std::lock_guard<std::mutex> g(o->mu);
        if (o->kind != kind || o->state != Out::kOffered || !o->path || o->nonce != nonce) continue;
        return fn(*o->path);
      }
      return false;
    };
  };
  auto service = [&] {
    next_sweep = Clock::now() + 100ms;
    for (auto& k : kinds_) k->Service(adopt(k.get()));
  };
  while (!stop_) {
    bool progress = false;
    fds.assign(1, pollfd{tx_rd_, POLLIN, 0});
    {
      std::shared_lock<std::shared_mutex> lk(peers_mu_);
      for (auto& [id, o] : outs_) {
        std::lock_guard<std::mutex> g(o->mu);
        if (o->state != Out::kActive || o->pending.empty()) continue;
        progress |= WriteSome(id, *o, true) > 0;
        if (o->state == Out::kActive && !o->pending.empty()) o->path->WatchForSpace(&fds);
      }
    }
    if (progress) {  // the locks were released in between; more may fit now
      if (Clock::now() >= next_sweep) service();
      continue;
    }
    const size_t paths_from = fds.size();
    for (auto& k : kinds_) k->PollFds(&fds);
    ::poll(fds.data(), fds.size(), 100);  // bounded: also notices stop_
    Drain(tx_rd_);
    bool ready = false;
    for (size_t i = paths_from; i < fds.size(); ++i) ready |= fds[i].revents != 0;
    if (paths_from == fds.size()) continue;  // nothing of the paths' own
    if (ready || Clock::now() >= next_sweep) service();
  }
}

}  // namespace pskv::upgrade
