#include "transport/shm/shm_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
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
#include "transport/shm/shm_ring.h"
#include "transport/zmq/zmq_transport.h"

// Threads of this backend (the protocol is in shm_transport.h):
//  * senders (any thread) write into a peer's ring under that peer's Out::mu,
//    as much as fits; what does not fit waits in Out::pending, whose frames keep
//    their owners (no copy until the bytes go into the ring);
//  * the writer thread moves pending bytes into rings when their readers free
//    space; it sleeps on this process's tx pipe, which readers write to;
//  * the Recv caller owns the incoming rings (in_, under in_mu_ only so that
//    Close from another thread is safe) and the inner transport's Recv; it
//    sleeps in ZeroMQ's poll, which also watches the rx pipe that writers use.
// Lock order: peers_mu_, then an Out's mu, then the inner transport's locks.
// in_mu_ is never held with the others.

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

// Control messages travel over ZeroMQ as one frame of this exact size (not the
// protocol header's 64 bytes), starting with kCtlMagic.
constexpr char kCtlMagic[8] = {'P', 'S', 'K', 'V', 'S', 'H', 'M', '1'};
enum : uint32_t { kOffer = 1, kSwitch = 2 };
struct CtlWire {
  char magic[8];
  uint32_t type;
  int32_t pid;
  int32_t memfd;
  int32_t pipe;
  uint64_t capacity;
  uint8_t nonce[16];
  char boot_id[64];
  uint8_t reserved[16];
};
static_assert(sizeof(CtlWire) == 128);

// In a ring, a message is: u32 kMsgMagic, u32 frame count, then per frame a u64
// size and the bytes.
constexpr uint32_t kMsgMagic = 0x4d4b5350;  // "PSKM"
constexpr uint32_t kMaxFramesPerMessage = 1 << 16;
constexpr size_t kMaxIncomingRings = 128;
const char kEmpty[1] = {0};

std::string ReadBootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return s.size() < sizeof(CtlWire::boot_id) ? s : std::string();
}

std::set<std::string> LocalAddresses() {
  std::set<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    auto* a = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf)) out.insert(buf);
  }
  ::freeifaddrs(ifs);
  return out;
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

// A message waiting to be written into a ring: pieces are the 8-byte message
// prefix, then per frame its 8-byte size and its bytes.
struct OutMsg {
  std::vector<Frame> frames;
  std::vector<uint64_t> words;  // [0] prefix, [1 + i] size of frame i
  size_t piece = 0;
  uint64_t offset = 0;  // within the current piece

  size_t pieces() const { return 1 + 2 * frames.size(); }
  std::pair<const char*, uint64_t> Piece(size_t p) const {
    if (p == 0 || p % 2 == 1) return {reinterpret_cast<const char*>(&words[(p + 1) / 2]), 8};
    const Frame& f = frames[p / 2 - 1];
    return {f.data, f.size};
  }
};

// The producer side of one peer.
struct Out {
  std::mutex mu;
  enum State { kPlain, kOffered, kActive, kDown, kOff } state = kPlain;
  std::string endpoint;
  uint64_t token = 0;  // the identity the peer proves (Connect)
  std::unique_ptr<Ring> ring;
  int peer_pipe = -1;  // the reader's wake-up pipe
  uint64_t head = 0;   // private copy of the ring's head
  bool seen_up = false;
  Clock::time_point retry_after{};    // kDown: no new offer before then
  Clock::time_point offered_up_at{};  // kOffered: when the connection was first seen up
  std::deque<OutMsg> pending;
};

// The consumer side of one ring, with its incremental message parser.
struct In {
  uint64_t token = 0;
  std::string addr;
  std::unique_ptr<Ring> ring;
  int peer_pipe = -1;  // the writer's wake-up pipe
  bool active = false;
  uint64_t tail = 0;  // private copy of the ring's tail
  enum { kPrefix, kSize, kBody } st = kPrefix;
  char word[8];
  uint32_t have = 0, nframes = 0;
  std::vector<Frame> frames;
  std::shared_ptr<char[]> buf;
  uint64_t size = 0, got = 0;
  ~In() {
    if (peer_pipe >= 0) ::close(peer_pipe);
  }
};

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const TransportConfig& cfg)
      : cfg_(cfg), boot_id_(ReadBootId()), local_(LocalAddresses()), pid_(::getpid()) {
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
      inner_ = CreateZmqTransport(cfg, rx_rd_);
    } catch (...) {
      for (int fd : {rx_rd_, rx_wr_, tx_rd_, tx_wr_}) ::close(fd);
      throw;
    }
    writer_ = std::thread([this] { WriterLoop(); });
  }
  ~ShmTransport() override { Close(0ms); }

  std::string Bind(const std::string& host, int port) override { return inner_->Bind(host, port); }

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
    if (WantShm(endpoint)) {
      std::lock_guard<std::mutex> g(o->mu);
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
    OutMsg m;
    m.words.resize(1 + frames.size());
    m.words[0] = kMsgMagic | (static_cast<uint64_t>(frames.size()) << 32);
    for (size_t i = 0; i < frames.size(); ++i) m.words[1 + i] = frames[i].size;
    m.frames = std::move(frames);
    o.pending.push_back(std::move(m));
    if (o.pending.size() == 1) WriteSome(o);
    // Still waiting (it is the last one queued): frames without an owner are only
    // valid during this call, so they are copied now.
    if (!o.pending.empty())
      for (Frame& f : o.pending.back().frames)
        if (!f.owner) f = Frame::Copy(f.data, f.size);
  }

  bool Recv(Received* in, std::chrono::milliseconds timeout) override {
    in->frames.clear();
    in->peer = 0;
    in->peer_addr.clear();
    const auto deadline = Clock::now() + timeout;
    std::lock_guard<std::mutex> lk(in_mu_);
    if (in_.empty()) {  // TCP only: no ring to look at
      while (inner_->Recv(in, std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::max(deadline - Clock::now(), Clock::duration(0))))) {
        Drain(rx_rd_);
        if (!HandleControl(*in)) return true;
        if (!in_.empty()) break;  // a ring was just attached: look at it too
        if (Clock::now() >= deadline) return false;
      }
      if (in_.empty()) {
        Drain(rx_rd_);
        return false;
      }
      in->frames.clear();
    }
    // Alternate which source is looked at first, so neither starves the other.
    zmq_first_ = !zmq_first_;
    for (int pass = 0;; ++pass) {
      bool got = false;
      if (zmq_first_ || pass > 0) got = inner_->Recv(in, 0ms);
      if (!got && PumpAll(in)) return true;
      if (!got && !zmq_first_ && pass == 0) got = inner_->Recv(in, 0ms);
      if (!got) {
        // Nothing anywhere: ask the writers for a wake-up, then sleep in ZeroMQ's
        // poll (which also watches the rx pipe).
        const bool data = Arm();
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        if (left.count() <= 0 && pass > 0) {
          Disarm();
          return false;
        }
        if (data) continue;
        got = inner_->Recv(in, std::max(left, 0ms));
        Disarm();
        Drain(rx_rd_);
        if (!got) {
          if (Clock::now() >= deadline) return PumpAll(in);
          continue;
        }
      }
      if (HandleControl(*in)) continue;
      // A message from a peer whose ring is active: the peer gave the ring up.
      auto r = in_.find(in->peer);
      if (r != in_.end() && r->second->active) DropIn(r, nullptr);
      return true;
    }
  }

  std::string RefusedBy(int peer) override { return inner_->RefusedBy(peer); }
  Clock::time_point DownSince(int peer) override { return inner_->DownSince(peer); }

  void Close(std::chrono::milliseconds linger) override {
    if (closed_.exchange(true)) return;
    // Give pending messages up to `linger` to go into their rings.
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
      std::unique_lock<std::shared_mutex> lk(peers_mu_);
      for (auto& [id, o] : outs_) {
        std::lock_guard<std::mutex> g(o->mu);
        Teardown(*o);
      }
      outs_.clear();
    }
    {
      std::lock_guard<std::mutex> lk(in_mu_);
      for (auto& [tok, r] : in_) A(r->ring->shared()->consumer_closed).store(1);
      in_.clear();
    }
    inner_->Close(linger);
    for (int* fd : {&rx_rd_, &rx_wr_, &tx_rd_, &tx_wr_}) {
      ::close(*fd);
      *fd = -1;
    }
  }

  std::string Name() const override { return "shm+" + inner_->Name(); }

  bool Active(int peer) {
    std::shared_lock<std::shared_mutex> lk(peers_mu_);
    auto it = outs_.find(peer);
    if (it == outs_.end()) return false;
    std::lock_guard<std::mutex> g(it->second->mu);
    return it->second->state == Out::kActive;
  }

 private:
  bool WantShm(const std::string& endpoint) const {
    if (boot_id_.empty() || cfg_.shm == TransportConfig::Shm::kOff) return false;
    if (cfg_.shm == TransportConfig::Shm::kOn) return true;
    const std::string host = endpoint.substr(0, endpoint.rfind(':'));
    return IsLoopback(host) || local_.count(host) > 0;
  }

  // ---------------------------------------------------------------- producer

  // Creates a ring for `peer` and offers it over ZeroMQ. Under o.mu.
  void Offer(int peer, Out& o, bool up) {
    try {
      o.ring = Ring::Create(cfg_.shm_ring_bytes);
    } catch (const Error& e) {
      PSKV_LOG_LIMITED(limiter_, "create", "WARN",
                       "shared memory unavailable, using TCP: " << e.what());
      o.state = Out::kOff;
      return;
    }
    CtlWire w{};
    std::memcpy(w.magic, kCtlMagic, sizeof w.magic);
    w.type = kOffer;
    w.pid = pid_;
    w.memfd = o.ring->fd();
    w.pipe = tx_wr_;
    w.capacity = o.ring->capacity();
    std::memcpy(w.nonce, o.ring->nonce().data(), sizeof w.nonce);
    std::memcpy(w.boot_id, boot_id_.data(), boot_id_.size());
    o.head = 0;
    o.seen_up = up;
    o.offered_up_at = up ? Clock::now() : Clock::time_point{};
    o.state = Out::kOffered;
    if (!SendControl(peer, o, w)) o.state = Out::kDown;  // offered again once it is up
  }

  // Sends an OFFER or SWITCH over ZeroMQ. A failure (the connection is being
  // replaced or was refused) gives the ring up; false then. Under o.mu.
  bool SendControl(int peer, Out& o, const CtlWire& w) {
    try {
      inner_->Send(peer, {Frame::Copy(&w, sizeof w)});
      return true;
    } catch (const Error&) {
      Teardown(o);
      o.retry_after = Clock::now() + 1s;
      return false;
    }
  }

  // Gives the ring up: the reader drains what was written, then drops it.
  void Teardown(Out& o) {
    if (o.ring) {
      A(o.ring->shared()->producer_closed).store(1, std::memory_order_seq_cst);
      if (o.state == Out::kActive) Signal(o.peer_pipe);
    }
    o.ring.reset();
    if (o.peer_pipe >= 0) ::close(o.peer_pipe);
    o.peer_pipe = -1;
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
    Shared* s = o.ring->shared();
    if (o.state == Out::kOffered) {
      const auto now = Clock::now();
      if (o.offered_up_at == Clock::time_point{}) o.offered_up_at = now;
      o.seen_up = true;
      if (!A(s->attached).load(std::memory_order_acquire)) {
        // A peer that declines (another host, PSKV_SHM=0) says nothing: past the
        // deadline, give the ring's memory back and stay on TCP with this peer.
        if (now - o.offered_up_at > cfg_.shm_attach_deadline) {
          Teardown(o);
          o.state = Out::kOff;
        }
        return;
      }
      std::string why;
      o.peer_pipe = shm::OpenPeerPipe(s->consumer_pid, s->consumer_pipe, &why);
      if (o.peer_pipe < 0) {
        PSKV_LOG_LIMITED(limiter_, "attach", "WARN",
                         "shared memory with node " << peer << " not used: " << why);
        Teardown(o);
        o.state = Out::kOff;
        return;
      }
      CtlWire w{};
      std::memcpy(w.magic, kCtlMagic, sizeof w.magic);
      w.type = kSwitch;
      std::memcpy(w.nonce, o.ring->nonce().data(), sizeof w.nonce);
      if (!SendControl(peer, o, w)) {
        o.state = Out::kDown;
        o.seen_up = false;
        return;
      }
      o.state = Out::kActive;
      PSKV_DEBUG("messages to node " << peer << " now go through shared memory");
      return;
    }
    if (A(s->consumer_closed).load(std::memory_order_acquire)) {
      PSKV_LOG_LIMITED(limiter_, "closed", "WARN",
                       "node " << peer << " stopped reading shared memory; using TCP");
      Teardown(o);
      o.state = Out::kOff;
    }
  }

  // Copies pending bytes into the ring as far as it has space, at most one ring's
  // worth per call so that o.mu (and the Send callers and heartbeats waiting for
  // it) is never held for long; the writer thread carries on. Returns the bytes
  // written. Under o.mu.
  uint64_t WriteSome(Out& o) {
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
    while (!stop_) {
      bool progress = false;
      {
        std::shared_lock<std::shared_mutex> lk(peers_mu_);
        for (auto& [id, o] : outs_) {
          std::lock_guard<std::mutex> g(o->mu);
          if (o->state == Out::kActive && !o->pending.empty()) progress |= WriteSome(*o) > 0;
        }
      }
      if (progress) continue;  // the locks were released in between; more may fit now
      pollfd p{tx_rd_, POLLIN, 0};
      ::poll(&p, 1, 100);  // bounded: also notices stop_
      Drain(tx_rd_);
    }
  }

  // ---------------------------------------------------------------- consumer

  // An OFFER or SWITCH from the authenticated peer in->peer. Recv thread.
  bool HandleControl(const Received& in) {
    if (in.frames.size() != 1 || in.frames[0].size != sizeof(CtlWire) ||
        std::memcmp(in.frames[0].data, kCtlMagic, sizeof kCtlMagic) != 0)
      return false;
    CtlWire w;
    std::memcpy(&w, in.frames[0].data, sizeof w);
    shm::Nonce nonce;
    std::memcpy(nonce.data(), w.nonce, nonce.size());
    auto it = in_.find(in.peer);
    if (w.type == kSwitch) {
      if (it != in_.end() && it->second->ring->nonce() == nonce) it->second->active = true;
      return true;
    }
    if (w.type != kOffer) return true;
    if (it != in_.end()) DropIn(it, nullptr);  // the peer restarted its side
    w.boot_id[sizeof w.boot_id - 1] = 0;
    if (cfg_.shm == TransportConfig::Shm::kOff || boot_id_.empty() || boot_id_ != w.boot_id)
      return true;  // declined: the peer keeps using TCP
    if (in_.size() >= kMaxIncomingRings) {
      PSKV_LOG_LIMITED(limiter_, "cap", "WARN",
                       "declined shared memory from " << in.peer_addr << ": already "
                                                      << kMaxIncomingRings << " rings");
      return true;
    }
    std::string why;
    auto r = std::make_unique<In>();
    r->ring = Ring::Attach(w.pid, w.memfd, w.capacity, nonce, &why);
    if (r->ring) r->peer_pipe = shm::OpenPeerPipe(w.pid, w.pipe, &why);
    if (!r->ring || r->peer_pipe < 0) {
      PSKV_LOG_LIMITED(limiter_, "offer/" + in.peer_addr, "WARN",
                       "declined shared memory from " << in.peer_addr << ", using TCP: " << why);
      return true;
    }
    r->token = in.peer;
    r->addr = in.peer_addr;
    Shared* s = r->ring->shared();
    s->consumer_pid = pid_;
    s->consumer_pipe = rx_wr_;
    A(s->attached).store(1, std::memory_order_release);
    in_[in.peer] = std::move(r);
    return true;
  }

  void DropIn(std::map<uint64_t, std::unique_ptr<In>>::iterator it, const char* why) {
    if (why)
      PSKV_LOG_LIMITED(limiter_, "bad/" + it->second->addr, "WARN",
                       "dropped the shared memory from " << it->second->addr << ": " << why);
    A(it->second->ring->shared()->consumer_closed).store(1, std::memory_order_seq_cst);
    in_.erase(it);
  }

  // One complete message from any active ring (round robin). Recv thread.
  bool PumpAll(Received* out) {
    if (in_.empty()) return false;
    auto it = in_.upper_bound(last_token_);
    for (size_t n = in_.size(); n > 0; --n) {
      if (it == in_.end()) it = in_.begin();
      auto cur = it++;
      In& r = *cur->second;
      if (!r.active) {
        // Attached, never switched to, and given up by its writer (it went back to
        // TCP, or its offer passed the attach deadline): nothing will come.
        if (A(r.ring->shared()->producer_closed).load(std::memory_order_seq_cst))
          DropIn(cur, nullptr);
        continue;
      }
      const char* bad = nullptr;
      const bool got = Pump(r, out, &bad);
      if (bad) {
        DropIn(cur, bad);
        continue;
      }
      if (got) {
        last_token_ = cur->first;
        return true;
      }
      Shared* s = r.ring->shared();
      if (A(s->producer_closed).load(std::memory_order_seq_cst) &&
          A(s->head).load(std::memory_order_seq_cst) == r.tail)
        DropIn(cur, nullptr);  // the writer closed and everything was read
    }
    return false;
  }

  // Reads what is available; true when a message completed. Every value read
  // from shared memory is checked first (*bad says why the ring is unusable).
  bool Pump(In& r, Received* out, const char** bad) {
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
      const uint64_t avail = head - r.tail;
      if (r.st != In::kBody) {
        const uint64_t n = std::min<uint64_t>(8 - r.have, avail);
        r.ring->CopyOut(r.tail, r.word + r.have, n);
        r.tail += n;
        r.have += static_cast<uint32_t>(n);
        if (r.have < 8) continue;
        r.have = 0;
        uint64_t v;
        std::memcpy(&v, r.word, 8);
        if (r.st == In::kPrefix) {
          r.nframes = static_cast<uint32_t>(v >> 32);
          if (static_cast<uint32_t>(v) != kMsgMagic || r.nframes == 0 ||
              r.nframes > kMaxFramesPerMessage) {
            *bad = "malformed message";
            return false;
          }
          r.frames.clear();
          r.st = In::kSize;
          continue;
        }
        if (v > cfg_.max_frame) {
          *bad = "frame larger than the limit";
          return false;
        }
        r.size = v;
        r.got = 0;
        r.buf = v ? std::shared_ptr<char[]>(new char[v]) : nullptr;
        r.st = In::kBody;
      } else {
        const uint64_t n = std::min(r.size - r.got, avail);
        r.ring->CopyOut(r.tail, r.buf.get() + r.got, n);
        r.tail += n;
        r.got += n;
      }
      if (r.st == In::kBody && r.got == r.size) {
        Frame f;
        f.data = r.size ? r.buf.get() : kEmpty;
        f.size = r.size;
        f.owner = std::shared_ptr<const void>(r.buf, r.buf.get());
        r.buf.reset();
        r.frames.push_back(std::move(f));
        r.st = In::kSize;
        if (r.frames.size() == r.nframes) {
          out->frames = std::move(r.frames);
          r.frames = {};
          out->peer = r.token;
          out->peer_addr = r.addr;
          r.st = In::kPrefix;
          done = true;
        }
      }
    }
    if (r.tail != start) {
      A(s->tail).store(r.tail, std::memory_order_seq_cst);
      if (A(s->producer_waiting).exchange(0, std::memory_order_seq_cst)) Signal(r.peer_pipe);
    }
    return done;
  }

  // Before sleeping: asks every active ring's writer for a wake-up. True if
  // data arrived meanwhile (then do not sleep).
  bool Arm() {
    bool data = false;
    for (auto& [tok, r] : in_) {
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
      if (r->active) A(r->ring->shared()->consumer_waiting).store(0, std::memory_order_relaxed);
  }

  TransportConfig cfg_;
  const std::string boot_id_;
  const std::set<std::string> local_;
  const int pid_;
  int rx_rd_ = -1, rx_wr_ = -1;  // wakes the Recv thread (polled by ZeroMQ's poll)
  int tx_rd_ = -1, tx_wr_ = -1;  // wakes the writer thread
  std::unique_ptr<Transport> inner_;
  RateLimiter limiter_;
  std::atomic<bool> closed_{false}, stop_{false};

  std::shared_mutex peers_mu_;
  std::map<int, std::unique_ptr<Out>> outs_;
  std::thread writer_;

  std::mutex in_mu_;
  std::map<uint64_t, std::unique_ptr<In>> in_;  // by the writer's token
  uint64_t last_token_ = 0;
  bool zmq_first_ = false;
};

}  // namespace

std::unique_ptr<Transport> CreateShmTransport(const TransportConfig& cfg) {
  return std::make_unique<ShmTransport>(cfg);
}

bool SendsThroughShm(Transport& t, int peer) {
  auto* s = dynamic_cast<ShmTransport*>(&t);
  return s && s->Active(peer);
}

}  // namespace pskv
