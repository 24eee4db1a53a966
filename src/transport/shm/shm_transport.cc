#include "transport/shm/shm_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/net.h"
#include "common/rate_limit.h"
#include "pskv/error.h"
#include "transport/auth.h"
#include "transport/framing.h"
#include "transport/shm/shm_ring.h"
#include "transport/tcp/direct_tcp.h"
#include "transport/upgrade/control_codec.h"
#include "transport/zmq/zmq_transport.h"

// Threads of this backend (the protocol is in shm_transport.h):
//  * senders (any thread) write into a peer's ring under that peer's Out::mu,
//    as much as fits; what does not fit waits in Out::pending, whose frames keep
//    their owners (no copy until the bytes go into the ring);
//  * the writer thread moves pending bytes into rings when their readers free
//    space; it sleeps on this process's tx pipe, which readers write to;
//  * the Recv caller owns the incoming rings and direct sockets (in_, under
//    in_mu_ only so that Close from another thread is safe) and the inner
//    transport's Recv; it sleeps in ZeroMQ's poll, which also watches an epoll
//    set holding the rx pipe that ring writers use and the direct sockets.
// Direct TCP (tcp/direct_tcp.h) works like a ring whose writer is the socket:
// senders write into it under Out::mu, the writer thread finishes what did not
// fit (POLLOUT) and runs the listener that accepts receivers' connections.
// Lock order: lst_mu_, then peers_mu_, then an Out's mu, then the inner
// transport's locks. in_mu_ is never held with the others.

namespace pskv {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using shm::Ring;
using shm::Shared;

template <class T>
std::atomic_ref<T> A(T& x) {
  return std::atomic_ref<T>(x);
}

// Incoming rings and direct sockets, at most (further offers are declined).
constexpr size_t kMaxIncomingRings = 128;
// Bytes one Send or one writer turn puts into a direct socket before letting go
// of the peer's lock; bytes one Recv reads from one socket before looking at others.
constexpr uint64_t kSocketBudget = 4 << 20;
// Spin (TransportConfig::spin) only after messages of at most this many bytes.
constexpr uint64_t kSpinAfterBytes = 64 << 10;
// A direct TCP offer nobody took (declined, or crowded out at the listener) is
// made again after this.
constexpr auto kTcpReofferAfter = std::chrono::seconds(30);
// Data on a direct socket whose SWITCH has not come after this: the SWITCH was
// lost (ZeroMQ drops what is in flight when its connection breaks); the socket is
// dropped, the sender's write fails and it goes back to ZeroMQ.
constexpr auto kSwitchGrace = std::chrono::seconds(5);

// Which "host" this process is on, as far as a ring can be shared: the kernel's
// boot id, and the network and PID namespaces. Processes in other network
// namespaces of the same kernel (containers, or the cluster tests' namespace
// "hosts") share /dev/shm and could map a ring, but they are separate machines to
// the job: their traffic must take the network they were given (rate limits,
// DMLC_INTERFACE), and a peer in another PID namespace cannot open
// /proc/<pid>/fd anyway. "" (no shared memory) when the boot id is unreadable.
std::string ReadBootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  if (s.empty()) return s;
  for (const char* ns : {"/proc/self/ns/net", "/proc/self/ns/pid"}) {
    struct stat st {};
    if (::stat(ns, &st) == 0) s += "/" + std::to_string(static_cast<unsigned long>(st.st_ino));
  }
  return s.size() < 64 ? s : std::string();
}

void Signal(int fd) {
  if (fd < 0) return;
  const char b = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &b, 1);  // EAGAIN: a wake-up is pending anyway
}

// Empties a wake-up pipe — bounded: a peer that keeps writing into it cannot keep
// the caller here (what is left makes the next poll return at once; the rings'
// shared flags, not the bytes, say what is to be done).
void Drain(int fd) {
  char buf[4096];
  for (int i = 0; i < 16 && ::read(fd, buf, sizeof buf) == static_cast<ssize_t>(sizeof buf); ++i) {
  }
}

using framing::OutMsg;

// The producer side of one peer.
struct Out {
  std::mutex mu;
  enum State { kPlain, kOffered, kActive, kDown, kOff } state = kPlain;
  std::string endpoint;
  uint64_t token = 0;  // the identity the peer proves (Connect)
  std::unique_ptr<Ring> ring;
  int peer_pipe = -1;  // the reader's wake-up pipe
  uint64_t head = 0;   // private copy of the ring's head
  bool tcp = false;    // offered a direct TCP connection (not a ring)
  shm::Nonce nonce{};  // tcp: names the offer
  int sock = -1;       // tcp: the receiver's proven connection
  bool seen_up = false;
  Clock::time_point retry_after{};    // kDown: no new offer before then
  Clock::time_point offered_up_at{};  // kOffered: when the connection was first seen up
  std::deque<OutMsg> pending;
};

// The consumer side of one ring or direct socket.
struct In {
  explicit In(uint64_t max_frame) : parser(max_frame) {}
  uint64_t token = 0;
  uint64_t conn = 0;  // the writer's ZeroMQ connection that made the offer
  uint64_t seq = 0;   // the offer's number (upgrade::Offer::seq)
  std::string addr;
  shm::Nonce nonce{};
  bool active = false;  // SWITCH arrived: the writer uses this path now
  // Ring:
  std::unique_ptr<Ring> ring;
  int peer_pipe = -1;  // the writer's wake-up pipe
  uint64_t tail = 0;   // private copy of the ring's tail
  framing::Parser parser;
  // Direct TCP: connecting, reading the sender's ACK, parked (ACK read, SWITCH
  // not yet: not watched), reading messages.
  int sock = -1;
  enum { kConnecting, kAck, kParked, kReading } sst = kConnecting;
  Clock::time_point since{};           // connecting started
  Clock::time_point parked_data_at{};  // data waits for its SWITCH (parked socket, closed ring)
  std::unique_ptr<direct::Reader> reader;
  bool readable = false;
  ~In() {
    if (peer_pipe >= 0) ::close(peer_pipe);
    if (sock >= 0) ::close(sock);
  }
};

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const TransportConfig& cfg)
      : cfg_(cfg),
        boot_id_(ReadBootId()),
        local_(LocalIPv4Addresses()),
        pid_(::getpid()),
        keys_(cfg.secret, cfg.job),
        listener_(keys_, cfg.handshake_timeout,
                  static_cast<size_t>(std::max(0, cfg.max_pending_connections))) {
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
      inner_ = CreateZmqTransport(cfg, epfd_);
    } catch (...) {
      for (int fd : {rx_rd_, rx_wr_, tx_rd_, tx_wr_, epfd_})
        if (fd >= 0) ::close(fd);
      throw;
    }
    writer_ = std::thread([this] { WriterLoop(); });
  }
  ~ShmTransport() override { Close(0ms); }

  std::string Bind(const std::string& host, int port) override {
    std::string ep = inner_->Bind(host, port);
    {
      std::lock_guard<std::mutex> g(in_mu_);
      zmq_fd_ = ZmqReceiveFd(*inner_);
      if (zmq_fd_ >= 0 && !Watch(zmq_fd_, EPOLL_CTL_ADD, EPOLLIN)) zmq_fd_ = -1;
    }
    if (cfg_.tcp_direct && !cfg_.encrypt && !cfg_.scheduler) {
      std::lock_guard<std::mutex> g(lst_mu_);
      try {
        listener_.Open(host);
        direct_ip_ = listener_.ip();
        direct_port_ = listener_.port();
      } catch (const Error& e) {
        PSKV_WARN(
            "direct TCP unavailable, messages to other hosts go through ZeroMQ: " << e.what());
      }
    }
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
    if (WantShm(endpoint)) {
      std::lock_guard<std::mutex> g(o->mu);
      Offer(peer, *o, false);
    } else if (direct_port_ != 0 && token != kSchedulerToken) {
      // Not with the scheduler: its messages are few and not latency bound, and it
      // would hold two more sockets per node.
      std::lock_guard<std::mutex> g(o->mu);
      o->tcp = true;
      Offer(peer, *o, false);
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
    if (o.pending.size() == 1) WriteSome(peer, o);
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
        // Nothing anywhere: ask the ring writers for a wake-up, then sleep on the
        // epoll set (ZeroMQ's socket, the rx pipe, the direct sockets).
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
      if (HandleControl(*in)) continue;
      // A message over the ZeroMQ connection whose ring (or socket) is active: the
      // peer gave that path up. (Not one over another of its connections: a node
      // may hold two to this one, and only one of them has a direct path.)
      auto r = in_.find(in->peer);
      if (r != in_.end() && r->second->active && r->second->conn == in->conn) DropIn(r, nullptr);
      return true;
    }
  }

  std::string RefusedBy(int peer) override { return inner_->RefusedBy(peer); }
  Clock::time_point DownSince(int peer) override { return inner_->DownSince(peer); }

  void Close(std::chrono::milliseconds linger) override {
    if (closed_.exchange(true)) return;
    // Give pending messages up to `linger` to go into their rings and sockets.
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
    {
      std::lock_guard<std::mutex> g(lst_mu_);
      listener_.Close();
    }
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
      for (auto& [tok, r] : in_)
        if (r->ring) A(r->ring->shared()->consumer_closed).store(1);
      in_.clear();
      socks_.clear();
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
    return it->second->tcp ? "tcp" : "shm";
  }
  uint16_t DirectPort() const { return direct_port_; }

 private:
  bool WantShm(const std::string& endpoint) const {
    if (boot_id_.empty() || cfg_.shm == TransportConfig::Shm::kOff) return false;
    if (cfg_.shm == TransportConfig::Shm::kOn) return true;
    const std::string host = endpoint.substr(0, endpoint.rfind(':'));
    return IsLoopback(host) || local_.count(host) > 0;
  }

  // ---------------------------------------------------------------- producer

  // Creates a ring (or, for o.tcp, a nonce for a direct connection) for `peer`
  // and offers it over ZeroMQ. Under o.mu.
  void Offer(int peer, Out& o, bool up) {
    upgrade::Offer w;
    if (o.tcp) {
      randombytes_buf(o.nonce.data(), o.nonce.size());
      w.path = upgrade::PathKind::kTcp;
      w.details = upgrade::EncodeTcpDetails({direct_ip_, direct_port_});
    } else {
      try {
        o.ring = Ring::Create(cfg_.shm_ring_bytes);
      } catch (const Error& e) {
        PSKV_LOG_LIMITED(limiter_, "create", "WARN",
                         "shared memory unavailable, using TCP: " << e.what());
        o.state = Out::kOff;
        return;
      }
      o.nonce = o.ring->nonce();
      w.path = upgrade::PathKind::kRing;
      w.details =
          upgrade::EncodeRingDetails({pid_, o.ring->fd(), tx_wr_, o.ring->capacity(), boot_id_});
    }
    w.nonce = o.nonce;
    w.seq = ++offers_;
    o.head = 0;
    o.seen_up = up;
    o.offered_up_at = up ? Clock::now() : Clock::time_point{};
    o.state = Out::kOffered;
    if (!SendControl(peer, o, w)) o.state = Out::kDown;  // offered again once it is up
  }

  // Sends an OFFER or SWITCH over ZeroMQ. A failure (the connection is being
  // replaced or was refused) gives the ring up; false then. Under o.mu.
  bool SendControl(int peer, Out& o, const upgrade::PathControl& c) {
    try {
      inner_->Send(peer, {upgrade::EncodeControl(c)});
      return true;
    } catch (const Error&) {
      Teardown(o);
      o.retry_after = Clock::now() + 1s;
      return false;
    }
  }

  // Gives the ring or socket up: the reader drains what was written, then drops
  // it (a socket's kernel buffer still goes out before its end). Under o.mu.
  void Teardown(Out& o) {
    if (o.ring) {
      A(o.ring->shared()->producer_closed).store(1, std::memory_order_seq_cst);
      if (o.state == Out::kActive) Signal(o.peer_pipe);
    }
    o.ring.reset();
    if (o.peer_pipe >= 0) ::close(o.peer_pipe);
    o.peer_pipe = -1;
    if (o.sock >= 0) ::close(o.sock);
    o.sock = -1;
    o.pending.clear();
  }

  // The state machine of shm_transport.h, run before each Send. Under o.mu.
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
    Shared* s = o.tcp ? nullptr : o.ring->shared();
    if (o.state == Out::kOffered) {
      const auto now = Clock::now();
      if (o.offered_up_at == Clock::time_point{}) o.offered_up_at = now;
      o.seen_up = true;
      if (o.tcp ? o.sock < 0 : !A(s->attached).load(std::memory_order_acquire)) {
        // A peer that declines (another host, PSKV_SHM=0, PSKV_TCP_DIRECT=0, no
        // route to the port) says nothing: past the deadline, give the ring's
        // memory back and stay on ZeroMQ with this peer.
        if (now - o.offered_up_at > cfg_.shm_attach_deadline) {
          Teardown(o);
          // A ring: never (another host). A direct connection: perhaps only
          // crowded out at the listener, so again later.
          o.state = o.tcp ? Out::kDown : Out::kOff;
          o.seen_up = false;
          o.retry_after = now + kTcpReofferAfter;
        }
        return;
      }
      if (!o.tcp) {
        std::string why;
        o.peer_pipe = shm::OpenPeerPipe(s->consumer_pid, s->consumer_pipe, &why);
        if (o.peer_pipe < 0) {
          PSKV_LOG_LIMITED(limiter_, "attach", "WARN",
                           "shared memory with node " << peer << " not used: " << why);
          Teardown(o);
          o.state = Out::kOff;
          return;
        }
      }
      if (!SendControl(peer, o, upgrade::Switch{o.nonce})) {
        o.state = Out::kDown;
        o.seen_up = false;
        return;
      }
      o.state = Out::kActive;
      PSKV_DEBUG("messages to node " << peer << " now go through "
                                     << (o.tcp ? "a direct TCP connection" : "shared memory"));
      return;
    }
    if (!o.tcp && A(s->consumer_closed).load(std::memory_order_acquire)) {
      PSKV_LOG_LIMITED(limiter_, "closed", "WARN",
                       "node " << peer << " stopped reading shared memory; using TCP");
      Teardown(o);
      o.state = Out::kOff;
    }
  }

  // Moves pending bytes into the ring or socket (bounded per call, so that o.mu
  // and the Send callers and heartbeats waiting for it are never held for long;
  // the writer thread carries on). Returns the bytes written. Under o.mu.
  uint64_t WriteSome(int peer, Out& o, bool from_writer = false) {
    if (!o.tcp) return WriteRing(o);
    int err = 0;
    const uint64_t n = direct::Write(o.sock, o.pending, kSocketBudget, &err);
    if (err) {
      // The receiver closed (it found something invalid, or it died: ZeroMQ will
      // say so too). Unread messages are lost, never reordered: the receiver
      // drops the socket when the next message arrives through ZeroMQ.
      PSKV_LOG_LIMITED(limiter_, "direct", "WARN",
                       "direct TCP connection to node " << peer << " failed (" << std::strerror(err)
                                                        << "); using ZeroMQ");
      Teardown(o);
      o.state = Out::kDown;
      o.seen_up = false;
      o.retry_after = Clock::now() + 1s;
      return n;
    }
    // The writer thread carries on (it waits for POLLOUT); it need not wake itself.
    if (!o.pending.empty() && !from_writer) Signal(tx_wr_);
    return n;
  }

  // Copies pending bytes into the ring as far as it has space, at most one ring's
  // worth per call. Under o.mu.
  uint64_t WriteRing(Out& o) {
    Shared* s = o.ring->shared();
    const uint64_t cap = o.ring->capacity();
    uint64_t written = 0;
    for (;;) {
      const uint64_t tail = A(s->tail).load(std::memory_order_seq_cst);
      if (tail > o.head || o.head - tail > cap) {  // the reader is not a pskv node
        PSKV_LOG_LIMITED(limiter_, "tail", "WARN",
                         "a shared-memory reader wrote an invalid position; using TCP");
        Teardown(o);
        o.state = Out::kOff;
        return written;
      }
      uint64_t space = cap - (o.head - tail);
      const uint64_t start = o.head;
      while (space && !o.pending.empty() && written < cap) {
        OutMsg& m = o.pending.front();
        auto [p, len] = m.Piece(m.piece);
        const uint64_t n = std::min({len - m.offset, space, cap - written});
        if (n) o.ring->CopyIn(o.head, p + m.offset, n);
        o.head += n;
        space -= n;
        written += n;
        m.offset += n;
        if (m.offset == len) {
          m.offset = 0;
          if (++m.piece == m.pieces()) o.pending.pop_front();  // releases the owners
        }
      }
      if (o.head != start) {
        A(s->head).store(o.head, std::memory_order_seq_cst);
        if (A(s->consumer_waiting).exchange(0, std::memory_order_seq_cst)) Signal(o.peer_pipe);
      }
      if (o.pending.empty()) return written;
      if (written >= cap) {  // enough for one turn: the writer thread goes on
        Signal(tx_wr_);
        return written;
      }
      // Full: ask the reader for a wake-up, then look once more (it may have
      // freed space before seeing the request).
      A(s->producer_waiting).store(1, std::memory_order_seq_cst);
      if (A(s->tail).load(std::memory_order_seq_cst) == tail) return written;
    }
  }

  void WriterLoop() {
    std::vector<pollfd> fds;
    // The listener: when one of its descriptors is ready, and at least every 100 ms
    // (handshake deadlines; also while sustained writing keeps this loop busy).
    Clock::time_point next_sweep{};
    auto service_listener = [&] {
      next_sweep = Clock::now() + 100ms;
      std::lock_guard<std::mutex> g(lst_mu_);
      listener_.Service([this](const direct::Nonce& nonce, int fd) { return Claim(nonce, fd); });
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
          if (o->tcp && o->sock >= 0 && !o->pending.empty()) fds.push_back({o->sock, POLLOUT, 0});
        }
      }
      if (progress) {  // the locks were released in between; more may fit now
        if (Clock::now() >= next_sweep) service_listener();
        continue;
      }
      const size_t lst_from = fds.size();
      {
        std::lock_guard<std::mutex> g(lst_mu_);
        listener_.PollFds(&fds);
      }
      ::poll(fds.data(), fds.size(), 100);  // bounded: also notices stop_
      Drain(tx_rd_);
      bool listener_ready = false;
      for (size_t i = lst_from; i < fds.size(); ++i) listener_ready |= fds[i].revents != 0;
      if (lst_from == fds.size()) continue;  // no listener
      if (listener_ready || Clock::now() >= next_sweep) service_listener();
    }
  }

  // A receiver proved the nonce of an offer (writer thread, under lst_mu_): the
  // socket becomes that peer's, and the ACK tells the receiver it reached us.
  bool Claim(const direct::Nonce& nonce, int fd) {
    std::shared_lock<std::shared_mutex> lk(peers_mu_);
    for (auto& [id, o] : outs_) {
      std::lock_guard<std::mutex> g(o->mu);
      if (!o->tcp || o->state != Out::kOffered || o->sock >= 0 || o->nonce != nonce) continue;
      if (!direct::SendAll(fd, direct::Proof(keys_, false, nonce))) return false;
      direct::KeepAlive(fd, cfg_.keepalive_interval, cfg_.keepalive_timeout);
      o->sock = fd;
      return true;
    }
    return false;
  }

  // ---------------------------------------------------------------- consumer

  // An OFFER or SWITCH from the authenticated peer in->peer. Recv thread.
  bool HandleControl(const Received& in) {
    if (!upgrade::IsControl(in.frames)) return false;
    upgrade::PathControl c;
    try {
      c = upgrade::DecodeControl(in.frames[0]);
    } catch (const ProtocolError& e) {
      PSKV_LOG_LIMITED(limiter_, "ctl/" + in.peer_addr, "WARN",
                       "ignored a path control message from " << in.peer_addr << ": " << e.what());
      return true;
    }
    auto it = in_.find(in.peer);
    if (const auto* sw = std::get_if<upgrade::Switch>(&c)) {
      if (it != in_.end() && it->second->nonce == sw->nonce) {
        In& r = *it->second;
        r.active = true;
        if (r.sock >= 0 && r.sst == In::kParked && !StartReading(r))
          DropIn(it, "cannot watch the connection");
      }
      return true;
    }
    const auto& offer = std::get<upgrade::Offer>(c);
    if (offer.path != upgrade::PathKind::kRing && offer.path != upgrade::PathKind::kTcp)
      return true;  // a path this build does not have: declined
    if (it != in_.end()) {
      if (it->second->seq > offer.seq) return true;  // stale (see Offer::seq): declined
      DropIn(it, nullptr);                           // the peer restarted its side
    }
    if (in_.size() >= kMaxIncomingRings) {
      PSKV_LOG_LIMITED(limiter_, "cap", "WARN",
                       "declined a direct path from " << in.peer_addr << ": already "
                                                      << kMaxIncomingRings << " in use");
      return true;
    }
    try {
      if (offer.path == upgrade::PathKind::kTcp)
        AcceptTcpOffer(in, offer, upgrade::DecodeTcpDetails(offer.details));
      else
        AcceptRingOffer(in, offer, upgrade::DecodeRingDetails(offer.details));
    } catch (const ProtocolError& e) {
      PSKV_LOG_LIMITED(limiter_, "ctl/" + in.peer_addr, "WARN",
                       "declined a path offer from " << in.peer_addr << ": " << e.what());
    }
    return true;
  }

  // Maps the offered ring if it is on this host and passes every check.
  void AcceptRingOffer(const Received& in, const upgrade::Offer& offer,
                       const upgrade::RingDetails& w) {
    if (cfg_.shm == TransportConfig::Shm::kOff || boot_id_.empty() || boot_id_ != w.boot_id)
      return;  // declined: the peer keeps using TCP
    std::string why;
    auto r = std::make_unique<In>(cfg_.max_frame);
    r->ring = Ring::Attach(w.pid, w.memfd, w.capacity, offer.nonce, &why);
    if (r->ring) r->peer_pipe = shm::OpenPeerPipe(w.pid, w.pipe, &why);
    if (!r->ring || r->peer_pipe < 0) {
      PSKV_LOG_LIMITED(limiter_, "offer/" + in.peer_addr, "WARN",
                       "declined shared memory from " << in.peer_addr << ", using TCP: " << why);
      return;
    }
    r->token = in.peer;
    r->conn = in.conn;
    r->seq = offer.seq;
    r->addr = in.peer_addr;
    r->nonce = offer.nonce;
    Shared* s = r->ring->shared();
    s->consumer_pid = pid_;
    s->consumer_pipe = rx_wr_;
    A(s->attached).store(1, std::memory_order_release);
    in_[in.peer] = std::move(r);
  }

  // Connects to where the offering peer listens (the rest happens in Events()).
  void AcceptTcpOffer(const Received& in, const upgrade::Offer& offer,
                      const upgrade::TcpDetails& w) {
    if (!cfg_.tcp_direct || cfg_.encrypt) return;  // declined: the peer keeps using ZeroMQ
    uint32_t ip = w.ip;
    if (ip == 0 && ::inet_pton(AF_INET, in.peer_addr.c_str(), &ip) != 1) return;
    std::string why;
    const int fd = direct::StartConnect(ip, w.port, &why);
    if (fd < 0) {
      PSKV_LOG_LIMITED(
          limiter_, "tcp/" + in.peer_addr, "WARN",
          "no direct TCP connection to " << in.peer_addr << " (" << why << "); using ZeroMQ");
      return;
    }
    auto r = std::make_unique<In>(cfg_.max_frame);
    r->token = in.peer;
    r->conn = in.conn;
    r->seq = offer.seq;
    r->addr = in.peer_addr;
    r->nonce = offer.nonce;
    r->sock = fd;
    r->reader = std::make_unique<direct::Reader>(cfg_.max_frame, offer.nonce);
    r->sst = In::kConnecting;
    r->since = Clock::now();
    direct::KeepAlive(fd, cfg_.keepalive_interval, cfg_.keepalive_timeout);
    if (!Watch(fd, EPOLL_CTL_ADD, EPOLLOUT)) return;  // r closes fd
    socks_[fd] = in.peer;
    in_[in.peer] = std::move(r);
  }

  bool Watch(int fd, int op, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    return ::epoll_ctl(epfd_, op, fd, &ev) == 0;
  }

  // SWITCH arrived and the ACK was read: the socket's messages are this peer's
  // now. False if it cannot be watched (then drop it: nothing would wake us).
  bool StartReading(In& r) {
    const bool watched = r.sst != In::kParked || r.parked_data_at == Clock::time_point{};
    r.sst = In::kReading;
    r.readable = true;
    return Watch(r.sock, watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, EPOLLIN);
  }

  void DropIn(std::map<uint64_t, std::unique_ptr<In>>::iterator it, const char* why) {
    if (why)
      PSKV_LOG_LIMITED(limiter_, "bad/" + it->second->addr, "WARN",
                       "dropped the direct path from " << it->second->addr << ": " << why);
    In& r = *it->second;
    if (r.ring) A(r.ring->shared()->consumer_closed).store(1, std::memory_order_seq_cst);
    if (r.sock >= 0) {
      // Explicitly: after a fork() the child holds the descriptor too, and close()
      // alone would leave it in the epoll set.
      ::epoll_ctl(epfd_, EPOLL_CTL_DEL, r.sock, nullptr);
      socks_.erase(r.sock);
    }
    in_.erase(it);
  }

  // Handles what the epoll set reports for direct sockets being set up, and
  // marks the readable ones. Recv thread.
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
      auto s = socks_.find(evs[i].data.fd);
      if (s == socks_.end()) continue;
      auto it = in_.find(s->second);
      if (it == in_.end() || it->second->sock != s->first) continue;
      In& r = *it->second;
      const char* why = nullptr;
      if (r.sst == In::kConnecting) {
        if (const int err = direct::ConnectError(r.sock)) {
          PSKV_LOG_LIMITED(limiter_, "tcp/" + r.addr, "WARN",
                           "no direct TCP connection to " << r.addr << " (" << std::strerror(err)
                                                          << "); using ZeroMQ");
          DropIn(it, nullptr);
          continue;
        }
        if (!direct::SendAll(r.sock, direct::Proof(keys_, true, r.nonce))) {
          DropIn(it, "could not send the proof");
          continue;
        }
        r.sst = In::kAck;
        Watch(r.sock, EPOLL_CTL_MOD, EPOLLIN);
      } else if (r.sst == In::kAck) {
        switch (r.reader->PumpAck(r.sock, keys_, &why)) {
          case direct::Reader::kNone:  // ACK complete
            if (r.active) {
              r.sst = In::kReading;
              r.readable = true;
            } else {
              r.sst = In::kParked;  // until SWITCH; still watched for its end
            }
            break;
          case direct::Reader::kAgain:
            break;
          case direct::Reader::kClosed:
            DropIn(it, nullptr);
            break;
          default:
            DropIn(it, why);
        }
      } else if (r.sst == In::kParked) {
        // Before SWITCH: the writer closed (drop it), or data came ahead of its
        // SWITCH (stop watching until SWITCH; PumpAll drops it if SWITCH was
        // lost with a broken ZeroMQ connection).
        char c;
        const ssize_t k = ::recv(r.sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          DropIn(it, nullptr);
        } else if (k > 0) {
          ::epoll_ctl(epfd_, EPOLL_CTL_DEL, r.sock, nullptr);
          r.parked_data_at = Clock::now();
        }
      } else if (r.sst == In::kReading) {
        r.readable = true;
      }
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
      for (auto& [tok, r] : in_)
        if (r->ring && r->active &&
            A(r->ring->shared()->head).load(std::memory_order_acquire) != r->tail) {
          spun_zmq_ = false;
          return true;
        }
      ::sched_yield();
    }
    return false;
  }

  // One complete message from any active ring or direct socket (round robin).
  // Recv thread.
  bool PumpAll(Received* out) {
    if (in_.empty()) return false;
    if (!std::exchange(events_fresh_, false)) Events();
    auto it = in_.upper_bound(last_token_);
    for (size_t n = in_.size(); n > 0 && !in_.empty(); --n) {
      if (it == in_.end()) it = in_.begin();
      auto cur = it++;
      In& r = *cur->second;
      const char* bad = nullptr;
      bool got = false;
      if (r.sock >= 0) {
        if (r.sst != In::kReading) {
          const auto now = Clock::now();
          if (r.sst != In::kParked && now - r.since > cfg_.handshake_timeout)
            DropIn(cur, "the connection was not set up in time");
          else if (r.parked_data_at != Clock::time_point{})
            SwitchOverdue(cur, now);
          continue;
        }
        if (!(r.readable || r.reader->buffered())) continue;
        switch (r.reader->Pump(r.sock, keys_, kSocketBudget, &bad)) {
          case direct::Reader::kMessage:
            got = true;
            out->frames = r.reader->Take();
            r.readable = !r.reader->drained();  // epoll says when more comes
            break;
          case direct::Reader::kAgain:
            r.readable = false;
            break;
          case direct::Reader::kNone:
            break;
          case direct::Reader::kClosed:
            DropIn(cur, nullptr);  // the writer closed and everything was read
            continue;
          case direct::Reader::kBad:
            DropIn(cur, bad);
            continue;
        }
      } else {
        if (!r.active) {
          Shared* s = r.ring->shared();
          if (!A(s->producer_closed).load(std::memory_order_seq_cst)) continue;
          // Given up by its writer. Nothing written: never switched to (it went back
          // to TCP, or its offer passed the attach deadline) — nothing will come.
          // Data written: its SWITCH is on the way over ZeroMQ, slower than the ring
          // (a writer that sends its last messages and closes at once: the
          // scheduler's final barrier release was lost this way) — wait for it,
          // bounded as for a parked socket.
          if (A(s->head).load(std::memory_order_seq_cst) == r.tail)
            DropIn(cur, nullptr);
          else if (r.parked_data_at == Clock::time_point{})
            r.parked_data_at = Clock::now();
          else
            SwitchOverdue(cur, Clock::now());
          continue;
        }
        got = PumpRing(r, out, &bad);
        if (bad) {
          DropIn(cur, bad);
          continue;
        }
        Shared* s = r.ring->shared();
        if (!got && A(s->producer_closed).load(std::memory_order_seq_cst) &&
            A(s->head).load(std::memory_order_seq_cst) == r.tail) {
          DropIn(cur, nullptr);  // the writer closed and everything was read
          continue;
        }
      }
      if (got) {
        NoteMessage(*out);
        out->peer = r.token;
        out->conn = r.conn;
        out->peer_addr = r.addr;
        last_token_ = cur->first;
        return true;
      }
    }
    return false;
  }

  // Data has waited for its SWITCH (a parked socket, a closed ring) since
  // parked_data_at: past kSwitchGrace the SWITCH was lost with a broken ZeroMQ
  // connection, and the path is dropped (true).
  bool SwitchOverdue(std::map<uint64_t, std::unique_ptr<In>>::iterator it, Clock::time_point now) {
    if (now - it->second->parked_data_at <= kSwitchGrace) return false;
    DropIn(it, "data came but its SWITCH did not (lost with a broken connection)");
    return true;
  }

  // Reads what is available; true when a message completed. Every value read
  // from shared memory is checked first (*bad says why the ring is unusable).
  bool PumpRing(In& r, Received* out, const char** bad) {
    Shared* s = r.ring->shared();
    const uint64_t cap = r.ring->capacity();
    const uint64_t head = A(s->head).load(std::memory_order_acquire);
    if (head < r.tail || head - r.tail > cap) {
      *bad = "invalid write position";
      return false;
    }
    const uint64_t start = r.tail;
    bool done = false;
    while (r.tail != head && !done) {
      auto [dst, want] = r.parser.Want();
      const uint64_t n = std::min(want, head - r.tail);
      r.ring->CopyOut(r.tail, dst, n);
      r.tail += n;
      done = r.parser.Got(n, bad);
      if (*bad) return false;
    }
    if (done) out->frames = r.parser.Take();
    if (r.tail != start) {
      A(s->tail).store(r.tail, std::memory_order_seq_cst);
      if (A(s->producer_waiting).exchange(0, std::memory_order_seq_cst)) Signal(r.peer_pipe);
    }
    return done;
  }

  // Before sleeping: asks every active ring's writer for a wake-up. True if
  // data arrived meanwhile or a socket still has some (then do not sleep).
  bool Arm() {
    bool data = false;
    for (auto& [tok, r] : in_) {
      if (r->sock >= 0) {
        data |= r->sst == In::kReading && (r->readable || r->reader->buffered());
        continue;
      }
      if (!r->active) continue;
      Shared* s = r->ring->shared();
      A(s->consumer_waiting).store(1, std::memory_order_seq_cst);
      data |= A(s->head).load(std::memory_order_seq_cst) != r->tail ||
              A(s->producer_closed).load(std::memory_order_seq_cst);
    }
    if (data) Disarm();
    return data;
  }
  void Disarm() {
    for (auto& [tok, r] : in_)
      if (r->ring && r->active)
        A(r->ring->shared()->consumer_waiting).store(0, std::memory_order_relaxed);
  }

  TransportConfig cfg_;
  const std::string boot_id_;
  const std::set<std::string> local_;
  const int pid_;
  const JobKeys keys_;
  int rx_rd_ = -1, rx_wr_ = -1;  // wakes the Recv thread (in the epoll set)
  int tx_rd_ = -1, tx_wr_ = -1;  // wakes the writer thread
  int epfd_ = -1;                // rx pipe and direct sockets; polled by ZeroMQ's poll
  std::unique_ptr<Transport> inner_;
  RateLimiter limiter_;
  std::atomic<bool> closed_{false}, stop_{false};
  std::atomic<uint64_t> offers_{0};  // numbers this node's offers (upgrade::Offer::seq)

  std::mutex lst_mu_;
  direct::Listener listener_;  // under lst_mu_
  std::atomic<uint32_t> direct_ip_{0};
  std::atomic<uint16_t> direct_port_{0};  // 0: no direct TCP offers

  std::shared_mutex peers_mu_;
  std::map<int, std::unique_ptr<Out>> outs_;
  std::thread writer_;

  std::mutex in_mu_;
  std::map<uint64_t, std::unique_ptr<In>> in_;  // by the writer's token
  std::map<int, uint64_t> socks_;               // direct socket -> token
  uint64_t last_token_ = 0;
  bool zmq_first_ = false;
  int zmq_fd_ = -1;            // ZeroMQ's receiving socket's ZMQ_FD (in the epoll set)
  bool events_fresh_ = false;  // the epoll set was just read (by the sleep)
  bool spun_zmq_ = false;
  Clock::time_point last_small_msg_{};
  const std::chrono::microseconds spin_{cfg_.spin};
};

}  // namespace

std::unique_ptr<Transport> CreateShmTransport(const TransportConfig& cfg) {
  return std::make_unique<ShmTransport>(cfg);
}

std::string DataPath(Transport& t, int peer) {
  auto* s = dynamic_cast<ShmTransport*>(&t);
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
  auto* s = dynamic_cast<ShmTransport*>(&t);
  return s ? s->DirectPort() : 0;
}

}  // namespace pskv
