#include "transport/upgrade/upgrading_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/rate_limit.h"
#include "pskv/error.h"
#include "transport/auth.h"
#include "transport/framing.h"
#include "transport/shm/ring_path.h"
#include "transport/tcp/socket_path.h"
#include "transport/upgrade/control_codec.h"
#include "transport/upgrade/data_path.h"
#include "transport/upgrade/incoming_paths.h"
#include "transport/zmq/zmq_transport.h"

// Threads of this backend (the negotiation is in data_path.h):
//  * senders (any thread) write into a peer's path under that peer's Out::mu,
//    as much as fits; what does not fit waits in Out::pending, whose frames keep
//    their owners (no copy until the bytes go into the path);
//  * the writer thread moves pending bytes into paths when they have room; it
//    sleeps on this process's tx pipe (ring readers write to it) and on what the
//    paths ask it to watch (POLLOUT of sockets, the direct TCP listener);
//  * the Recv caller owns the incoming paths (incoming_, under in_mu_ only so that
//    Close from another thread is safe) and the inner transport's Recv; it
//    sleeps in one epoll set holding ZeroMQ's descriptor, the rx pipe that ring
//    writers use and the paths' descriptors.
// Lock order: in_mu_, then a DataPath's own lock (the listener), then peers_mu_,
// then an Out's mu, then the inner transport's locks. The Recv thread takes
// peers_mu_ (shared) under in_mu_ only to ask whether a writer is cut off.

namespace pskv {

namespace upgrade {
void Signal(int fd) {
  if (fd < 0) return;
  const char b = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &b, 1);  // EAGAIN: a wake-up is pending anyway
}
}  // namespace upgrade

namespace {

using namespace std::chrono_literals;
using upgrade::Clock;
using upgrade::OutPath;
using upgrade::Signal;

// Spin (TransportConfig::spin) only after messages of at most this many bytes.
constexpr uint64_t kSpinAfterBytes = 64 << 10;
// A path that broke (a failed write, a failed OFFER or SWITCH) is offered again
// after this, once the control connection is up.
constexpr auto kRetryBroken = std::chrono::seconds(1);
// A writer whose control connection (this node's to it) has been down this long is
// cut off: a SWITCH of its that has not come never will (IncomingPaths::CutOff).
// Longer than a reconnection, which ZeroMQ makes at once.
constexpr auto kCutOffAfter = std::chrono::seconds(5);

// Empties a wake-up pipe — bounded: a peer that keeps writing into it cannot keep
// the caller here (what is left makes the next poll return at once; the paths'
// own state, not the bytes, says what is to be done).
void Drain(int fd) {
  char buf[4096];
  for (int i = 0; i < 16 && ::read(fd, buf, sizeof buf) == static_cast<ssize_t>(sizeof buf); ++i) {
  }
}

using framing::OutMsg;

// The producer side of one peer: kPlain (no path for this peer), kOffered,
// kActive (SWITCH sent: messages go into the path), kDown (the path broke or the
// control connection is down: offered again later), kOff (never again).
struct Out {
  std::mutex mu;
  enum State { kPlain, kOffered, kActive, kDown, kOff } state = kPlain;
  std::string endpoint;
  uint64_t token = 0;                 // the identity the peer proves (Connect)
  upgrade::DataPath* kind = nullptr;  // the path offered to this peer
  std::unique_ptr<OutPath> path;
  upgrade::Nonce nonce{};  // names the current offer
  bool seen_up = false;
  Clock::time_point retry_after{};    // kDown: no new offer before then
  Clock::time_point offered_up_at{};  // kOffered: when the connection was first seen up
  std::deque<OutMsg> pending;
};

class UpgradingTransport final : public Transport {
 public:
  UpgradingTransport(const TransportConfig& cfg, const ControlWrapper& wrap)
      : cfg_(cfg), keys_(cfg.secret, cfg.job) {
    int rx[2], tx[2];
    if (::pipe2(rx, O_NONBLOCK | O_CLOEXEC) != 0) throw IOError("pipe2 failed");
    if (::pipe2(tx, O_NONBLOCK | O_CLOEXEC) != 0) {
      ::close(rx[0]);
      ::close(rx[1]);
      throw IOError("pipe2 failed");
    }
    rx_rd_ = rx[0];
    rx_wr_ = rx[1];
    tx_rd_ = tx[0];
    tx_wr_ = tx[1];
    try {
      epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
      if (epfd_ < 0) throw IOError(std::string("epoll_create1 failed: ") + std::strerror(errno));
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = rx_rd_;
      if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, rx_rd_, &ev) != 0) throw IOError("epoll_ctl failed");
      auto zmq = CreateZmqTransport(cfg, epfd_);
      zmq_ = zmq.get();
      inner_ = wrap ? wrap(std::move(zmq)) : std::move(zmq);
      upgrade::PathHost host;
      host.cfg = &cfg_;
      host.keys = &keys_;
      host.pid = ::getpid();
      host.rx_wake = rx_wr_;
      host.tx_wake = tx_wr_;
      host.epfd = epfd_;
      // In order of preference: a peer gets the first path that wants it.
      kinds_.push_back(shm::CreateRingPath(host));
      kinds_.push_back(direct::CreateSocketPath(host));
    } catch (...) {
      for (int fd : {rx_rd_, rx_wr_, tx_rd_, tx_wr_, epfd_})
        if (fd >= 0) ::close(fd);
      throw;
    }
    writer_ = std::thread([this] { WriterLoop(); });
  }
  ~UpgradingTransport() override { Close(0ms); }

  std::string Bind(const std::string& host, int port) override {
    std::string ep = inner_->Bind(host, port);
    {
      std::lock_guard<std::mutex> g(in_mu_);
      zmq_fd_ = ZmqReceiveFd(*zmq_);
      if (zmq_fd_ >= 0 && !Watch(zmq_fd_, EPOLL_CTL_ADD, EPOLLIN)) zmq_fd_ = -1;
    }
    for (auto& k : kinds_) k->Bind(host);
    return ep;
  }

  void Connect(int peer, const std::string& endpoint, uint64_t token) override {
    inner_->Connect(peer, endpoint, token);
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    auto& o = outs_[peer];
    if (o && o->endpoint == endpoint && o->token == token) return;
    if (o) {
      std::lock_guard<std::mutex> g(o->mu);
      Teardown(*o);
    }
    o = std::make_unique<Out>();
    o->endpoint = endpoint;
    o->token = token;
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

  void Disconnect(int peer) override {
    std::unique_ptr<Out> gone;  // destroyed after its mutex is released
    {
      std::unique_lock<std::shared_mutex> lk(peers_mu_);
      auto it = outs_.find(peer);
      if (it != outs_.end()) {
        gone = std::move(it->second);
        outs_.erase(it);
        std::lock_guard<std::mutex> g(gone->mu);
        Teardown(*gone);
      }
    }
    inner_->Disconnect(peer);
  }

  void Send(int peer, std::vector<Frame> frames) override {
    if (frames.empty()) return;
    std::shared_lock<std::shared_mutex> lk(peers_mu_);
    auto it = outs_.find(peer);
    if (it == outs_.end()) return inner_->Send(peer, std::move(frames));
    Out& o = *it->second;
    std::lock_guard<std::mutex> g(o.mu);
    Advance(peer, o);
    if (o.state != Out::kActive) return inner_->Send(peer, std::move(frames));
    o.pending.push_back(OutMsg::Make(std::move(frames)));
    if (o.pending.size() == 1) WriteSome(peer, o, false);
    // Still waiting (it is the last one queued): frames without an owner are only
    // valid during this call, so they are copied now.
    if (!o.pending.empty()) o.pending.back().OwnAll();
  }

  bool Recv(Received* in, std::chrono::milliseconds timeout) override {
    in->frames.clear();
    in->peer = 0;
    in->conn = 0;
    in->peer_addr.clear();
    const auto deadline = Clock::now() + timeout;
    std::lock_guard<std::mutex> lk(in_mu_);
    // Alternate which source is looked at first, so neither starves the other.
    zmq_first_ = !zmq_first_;
    // False right after ZeroMQ was found empty and nothing says it changed: skip
    // one look. Nothing is missed: its descriptor is in the epoll set, and each
    // sleep is preceded by a look.
    bool zmq_maybe = true;
    if (epfd_ < 0) {  // closed
      std::this_thread::sleep_for(std::min(timeout, 100ms));
      return false;
    }
    for (int pass = 0;; ++pass) {
      bool got = false;
      const bool look = zmq_maybe;
      if (zmq_first_ && look) got = inner_->Recv(in, 0ms);
      if (!got && PumpAll(in)) return true;
      if (!got && !zmq_first_ && look) got = inner_->Recv(in, 0ms);
      zmq_maybe = true;
      if (!got && zmq_fd_ >= 0 && SpinFor(deadline)) {
        zmq_maybe = spun_zmq_;
        continue;
      }
      if (!got) {
        // Nothing anywhere: ask the paths' writers for a wake-up, then sleep on
        // the epoll set.
        const bool data = Arm();
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        if (left.count() <= 0 && pass > 0) {
          Disarm();
          return false;
        }
        if (data) {
          zmq_maybe = !look;  // looked at (and empty) in this pass: skip one look
          continue;
        }
        if (zmq_fd_ < 0) {  // not bound (a sender only): ZeroMQ's own wait
          got = inner_->Recv(in, std::max(left, 0ms));
          Disarm();
          if (!got) {
            if (Clock::now() >= deadline) return PumpAll(in);
            continue;
          }
        } else {
          epoll_event evs[64];
          const int n = ::epoll_wait(epfd_, evs, 64, static_cast<int>(std::max(left, 0ms).count()));
          Disarm();
          zmq_maybe = HandleEvents(evs, std::max(n, 0));
          events_fresh_ = true;
          if (n <= 0 && Clock::now() >= deadline) {
            if (PumpAll(in)) return true;
            got = inner_->Recv(in, 0ms);
            if (!got) return false;
          } else {
            continue;
          }
        }
      }
      NoteMessage(*in);
      if (incoming_.HandleControl(*in)) continue;
      incoming_.CameOverControl(*in);
      return true;
    }
  }

  std::string RefusedBy(int peer) override { return inner_->RefusedBy(peer); }
  Clock::time_point DownSince(int peer) override { return inner_->DownSince(peer); }

  void Close(std::chrono::milliseconds linger) override {
    if (closed_.exchange(true)) return;
    // Give pending messages up to `linger` to go into their paths.
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
    stop_ = true;
    Signal(tx_wr_);
    if (writer_.joinable()) writer_.join();
    for (auto& k : kinds_) k->Close();
    {
      std::unique_lock<std::shared_mutex> lk(peers_mu_);
      for (auto& [id, o] : outs_) {
        std::lock_guard<std::mutex> g(o->mu);
        Teardown(*o);
      }
      outs_.clear();
    }
    {
      std::lock_guard<std::mutex> lk(in_mu_);
      incoming_.Clear();  // each path stops reading (a ring is marked closed)
    }
    inner_->Close(linger);
    for (int* fd : {&rx_rd_, &rx_wr_, &tx_rd_, &tx_wr_, &epfd_}) {
      ::close(*fd);
      *fd = -1;
    }
  }

  std::string Name() const override { return "shm+" + inner_->Name(); }

  std::string PathTo(int peer) {
    std::shared_lock<std::shared_mutex> lk(peers_mu_);
    auto it = outs_.find(peer);
    if (it == outs_.end()) return "zmq";
    std::lock_guard<std::mutex> g(it->second->mu);
    if (it->second->state != Out::kActive) return "zmq";
    return it->second->kind->kind() == upgrade::PathKind::kTcp ? "tcp" : "shm";
  }
  int DirectPort() const {
    for (auto& k : kinds_)
      if (k->Port()) return k->Port();
    return 0;
  }

 private:
  // ---------------------------------------------------------------- producer

  // Makes o.kind's sending end for `peer` and offers it over ZeroMQ. Under o.mu.
  void Offer(int peer, Out& o, bool up) {
    upgrade::Offer w;
    std::string why;
    o.path = o.kind->Offer(&w.nonce, &w.details, &why);
    if (!o.path) {
      PSKV_LOG_LIMITED(limiter_, "create", "WARN",
                       why << "; messages to node " << peer << " go through ZeroMQ");
      o.state = Out::kOff;
      return;
    }
    w.path = o.kind->kind();
    w.seq = ++offers_;
    o.nonce = w.nonce;
    o.seen_up = up;
    o.offered_up_at = up ? Clock::now() : Clock::time_point{};
    o.state = Out::kOffered;
    if (!SendControl(peer, o, w)) o.state = Out::kDown;  // offered again once it is up
  }

  // Sends an OFFER or SWITCH over ZeroMQ. A failure (the connection is being
  // replaced or was refused) gives the path up; false then. Under o.mu.
  bool SendControl(int peer, Out& o, const upgrade::PathControl& c) {
    try {
      inner_->Send(peer, {upgrade::EncodeControl(c)});
      return true;
    } catch (const Error&) {
      Teardown(o);
      o.retry_after = Clock::now() + kRetryBroken;
      return false;
    }
  }

  // Gives the path up: the reader drains what was written, then drops it. Under o.mu.
  void Teardown(Out& o) {
    if (o.path) o.path->Close(o.state == Out::kActive);
    o.path.reset();
    o.pending.clear();
  }

  // Gives the path up after a failure: kOff (never again) or kDown (again after
  // `retry`, once ZeroMQ says the peer is up). Under o.mu.
  void GiveUp(int peer, Out& o, const std::string& why, bool for_good,
              Clock::duration retry = kRetryBroken) {
    if (!why.empty())
      PSKV_LOG_LIMITED(limiter_, std::string("out/") + upgrade::PathName(o.kind->kind()), "WARN",
                       upgrade::PathName(o.kind->kind())
                           << " with node " << peer << " given up (" << why << "); using ZeroMQ");
    Teardown(o);
    o.state = for_good ? Out::kOff : Out::kDown;
    o.seen_up = false;
    o.retry_after = Clock::now() + retry;
  }

  // The state machine of data_path.h, run before each Send. Under o.mu.
  void Advance(int peer, Out& o) {
    if (o.state == Out::kPlain || o.state == Out::kOff) return;
    const bool up = inner_->DownSince(peer) == Clock::time_point{};
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

  // Moves pending bytes into the path (bounded per call, so that o.mu and the
  // Send callers and heartbeats waiting for it are never held for long; the
  // writer thread carries on). Returns the bytes written. Under o.mu.
  uint64_t WriteSome(int peer, Out& o, bool from_writer) {
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

  void WriterLoop() {
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
          if (o->kind != kind || o->state != Out::kOffered || !o->path || o->nonce != nonce)
            continue;
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

  // ---------------------------------------------------------------- consumer

  bool Watch(int fd, int op, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    return ::epoll_ctl(epfd_, op, fd, &ev) == 0;
  }

  // Handles what the epoll set reports for the paths' descriptors. Recv thread.
  void Events() {
    epoll_event evs[64];
    HandleEvents(evs, std::max(0, ::epoll_wait(epfd_, evs, 64, 0)));
  }
  // Returns whether ZeroMQ's descriptor was among the events.
  bool HandleEvents(const epoll_event* evs, int n) {
    bool zmq = false;
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == zmq_fd_) {
        zmq = true;
        continue;
      }
      if (evs[i].data.fd == rx_rd_) {
        Drain(rx_rd_);  // a ring writer's wake-up: the rings are looked at below
        continue;
      }
      incoming_.OnEvent(evs[i].data.fd, evs[i].events);
    }
    return zmq;
  }

  // A small message: a latency-bound exchange, worth a spin before the next sleep
  // (after big ones the threads that copy need the cores more).
  void NoteMessage(const Received& m) {
    if (spin_.count() <= 0) return;
    uint64_t bytes = 0;
    for (const Frame& f : m.frames) bytes += f.size;
    if (bytes <= kSpinAfterBytes) last_small_msg_ = Clock::now();
  }

  // Before sleeping, shortly after a small message: looks again for up to the
  // spin budget without sleeping, giving the core to any other runnable thread
  // between looks. True if something arrived (spun_zmq_: on ZeroMQ's descriptor).
  bool SpinFor(Clock::time_point deadline) {
    if (spin_.count() <= 0) return false;
    const auto now = Clock::now();
    if (now - last_small_msg_ > 20 * spin_) return false;  // idle: sleep at once
    const auto until = std::min(deadline, now + spin_);
    for (int i = 0; i < 100000 && Clock::now() < until; ++i) {
      epoll_event evs[64];
      const int n = ::epoll_wait(epfd_, evs, 64, 0);
      if (n > 0) {
        spun_zmq_ = HandleEvents(evs, n);
        events_fresh_ = true;
        return true;
      }
      if (incoming_.AnyReady()) {
        spun_zmq_ = false;
        return true;
      }
      ::sched_yield();
    }
    return false;
  }

  // One complete message from any active path (round robin). Recv thread.
  bool PumpAll(Received* out) {
    if (incoming_.size() == 0) return false;
    if (!std::exchange(events_fresh_, false)) Events();
    if (!incoming_.Pump(out)) return false;
    NoteMessage(*out);
    return true;
  }

  // Before sleeping: asks every path for a wake-up. True if data arrived
  // meanwhile (then do not sleep).
  bool Arm() { return incoming_.Arm(); }

  // IncomingPaths::CutOff: this node's control connection to the node proving
  // `token` has been down for kCutOffAfter. Recv thread, under in_mu_.
  bool CutOff(uint64_t token) {
    std::shared_lock<std::shared_mutex> lk(peers_mu_);
    for (auto& [id, o] : outs_) {
      if (o->token != token) continue;
      const auto since = inner_->DownSince(id);
      return since != Clock::time_point{} && Clock::now() - since > kCutOffAfter;
    }
    return false;
  }
  void Disarm() { incoming_.Disarm(); }

  TransportConfig cfg_;
  const JobKeys keys_;
  int rx_rd_ = -1, rx_wr_ = -1;       // wakes the Recv thread (in the epoll set)
  int tx_rd_ = -1, tx_wr_ = -1;       // wakes the writer thread
  int epfd_ = -1;                     // ZeroMQ's descriptor, the rx pipe, the paths' descriptors
  std::unique_ptr<Transport> inner_;  // the control connection: ZeroMQ (zmq_), or a test's wrapper
  Transport* zmq_ = nullptr;
  std::vector<std::unique_ptr<upgrade::DataPath>> kinds_;  // fixed after construction
  RateLimiter limiter_;
  std::atomic<bool> closed_{false}, stop_{false};
  std::atomic<uint64_t> offers_{0};  // numbers this node's offers (upgrade::Offer::seq)

  std::shared_mutex peers_mu_;
  std::map<int, std::unique_ptr<Out>> outs_;
  std::thread writer_;

  std::mutex in_mu_;  // the Recv caller's: incoming_ and what follows
  upgrade::IncomingPaths incoming_{kinds_, limiter_,
                                   [this](uint64_t token) { return CutOff(token); }};
  bool zmq_first_ = false;
  int zmq_fd_ = -1;            // ZeroMQ's receiving socket's ZMQ_FD (in the epoll set)
  bool events_fresh_ = false;  // the epoll set was just read (by the sleep)
  bool spun_zmq_ = false;
  Clock::time_point last_small_msg_{};
  const std::chrono::microseconds spin_{cfg_.spin};
};

}  // namespace

std::unique_ptr<Transport> CreateShmTransport(const TransportConfig& cfg) {
  return std::make_unique<UpgradingTransport>(cfg, nullptr);
}

std::unique_ptr<Transport> CreateShmTransport(const TransportConfig& cfg,
                                              const ControlWrapper& wrap) {
  return std::make_unique<UpgradingTransport>(cfg, wrap);
}

std::string DataPath(Transport& t, int peer) {
  auto* s = dynamic_cast<UpgradingTransport*>(&t);
  return s ? s->PathTo(peer) : "zmq";
}

bool SendsThroughShm(Transport& t, int peer) {
  return DataPath(t, peer) == "shm";
}

namespace {
const bool registered = [] {
  auto create = [](const TransportConfig& cfg) { return CreateShmTransport(cfg); };
  return RegisterTransport(kNodeTransport, create) && RegisterTransport("shm", create);
}();
}  // namespace

int DirectTcpPort(Transport& t) {
  auto* s = dynamic_cast<UpgradingTransport*>(&t);
  return s ? s->DirectPort() : 0;
}

}  // namespace pskv
