#include "transport/shm/ring_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <set>
#include <vector>

#include "common/net.h"
#include "common/payload_reader.h"
#include "common/stream_copy.h"
#include "pskv/error.h"
#include "transport/shm/shm_ring.h"
#include "transport/upgrade/control_codec.h"

namespace pskv::shm {
namespace {

using upgrade::Clock;
using upgrade::InPath;
using upgrade::OutPath;
using upgrade::Signal;

template <class T>
std::atomic_ref<T> A(T& x) {
  return std::atomic_ref<T>(x);
}

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

// How many bytes each side copies before it publishes them (the writer its
// head, the reader its tail). Publishing only once the ring is full or empty
// made the two sides take turns: the reader waited for a full ring, the writer
// for an empty one, and a large message cost the sum of both copies instead of
// the longer one (docs/performance.md, "Shared memory and true ceilings").
uint64_t Step(uint64_t cap) {
  return std::min<uint64_t>(cap / 4, uint64_t{1} << 20);
}

// Rings whose offer was given up before the peer attached. The offer names the
// memfd by its descriptor number in this process; closed at once, the number is
// soon another file's (the next ring's, offered to the same node: the scheduler
// replaces each node's registration connection), and the peer, reading the
// offer late, found "not the announced segment" and warned. Kept open until the
// peer attached (it then has its own descriptor) or the attach deadline passed,
// a late reader finds the ring it was offered, closed, and drops it quietly.
// Bounded: at most kMax rings (the oldest goes first; its late reader warns, as
// before), each until its offer's attach deadline.
class Retired {
 public:
  static constexpr size_t kMax = 4;
  void Add(std::shared_ptr<Ring> ring, Clock::time_point until) {
    if (Clock::now() >= until) return;  // the peer declined: nothing will come
    std::shared_ptr<Ring> gone;         // freed after the lock
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) return;
    if (rings_.size() >= kMax) {
      gone = std::move(rings_.front().second);
      rings_.erase(rings_.begin());
    }
    rings_.push_back({until, std::move(ring)});
  }
  // Frees the rings attached to or past their deadline (all of them: closing).
  void Prune(bool closing) {
    std::vector<std::shared_ptr<Ring>> gone;  // freed after the lock
    std::lock_guard<std::mutex> g(mu_);
    closed_ |= closing;
    const auto now = Clock::now();
    for (size_t i = 0; i < rings_.size();) {
      auto& [until, ring] = rings_[i];
      if (closed_ || now >= until || A(ring->shared()->attached).load(std::memory_order_acquire)) {
        gone.push_back(std::move(ring));
        rings_.erase(rings_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

 private:
  std::mutex mu_;
  bool closed_ = false;
  std::vector<std::pair<Clock::time_point, std::shared_ptr<Ring>>> rings_;
};

class RingOut final : public OutPath {
 public:
  RingOut(std::unique_ptr<Ring> ring, int tx_wake, std::shared_ptr<Retired> retired,
          Clock::duration attach_deadline)
      : ring_(std::move(ring)),
        tx_wake_(tx_wake),
        retired_(std::move(retired)),
        attach_deadline_(attach_deadline) {}
  ~RingOut() override { Close(false); }

  Taken Accepted(std::string* why) override {
    Shared* s = ring_->shared();
    if (!A(s->attached).load(std::memory_order_acquire)) return Taken::kWaiting;
    peer_pipe_ = OpenPeerPipe(s->consumer_pid, s->consumer_pipe, why);
    return peer_pipe_ < 0 ? Taken::kRefused : Taken::kTaken;
  }

  bool ReaderGone(std::string* why) override {
    if (!A(ring_->shared()->consumer_closed).load(std::memory_order_acquire)) return false;
    *why = "it stopped reading shared memory";
    return true;
  }

  // Copies queued bytes into the ring as far as it has space, at most one ring's
  // worth per call.
  Written Write(std::deque<framing::OutMsg>& q, bool from_writer, uint64_t* written,
                std::string* why) override {
    Shared* s = ring_->shared();
    const uint64_t cap = ring_->capacity();
    *written = 0;
    for (;;) {
      const uint64_t tail = A(s->tail).load(std::memory_order_seq_cst);
      if (tail > head_ || head_ - tail > cap) {  // the reader is not a pskv node
        *why = "a shared-memory reader wrote an invalid position";
        return Written::kInvalid;
      }
      uint64_t space = cap - (head_ - tail);
      uint64_t published = head_;
      const uint64_t step = Step(cap);
      while (space && !q.empty() && *written < cap) {
        framing::OutMsg& m = q.front();
        auto [p, len] = m.Piece(m.piece);
        const uint64_t n = std::min({len - m.offset, space, cap - *written, step});
        if (n) ring_->CopyIn(head_, p + m.offset, n);
        head_ += n;
        space -= n;
        *written += n;
        m.offset += n;
        if (m.offset == len) {
          m.offset = 0;
          if (++m.piece == m.pieces()) q.pop_front();  // releases the owners
        }
        // Published every step, not once the ring is full: the reader copies
        // out while we copy in (see Step).
        if (head_ - published >= step) published = Publish();
      }
      if (head_ != published) Publish();
      if (q.empty()) return Written::kOk;
      if (*written >= cap) {  // enough for one turn: the writer thread goes on
        Signal(tx_wake_);
        return Written::kOk;
      }
      // Full: ask the reader for a wake-up (into the writer thread's pipe), then
      // look once more (it may have freed space before seeing the request).
      A(s->producer_waiting).store(1, std::memory_order_seq_cst);
      if (A(s->tail).load(std::memory_order_seq_cst) == tail) return Written::kOk;
    }
  }

  // Makes the bytes written so far visible, and wakes the reader if it sleeps.
  uint64_t Publish() {
    Shared* s = ring_->shared();
    A(s->head).store(head_, std::memory_order_seq_cst);
    if (A(s->consumer_waiting).exchange(0, std::memory_order_seq_cst)) Signal(peer_pipe_);
    return head_;
  }

  void Close(bool switched) override {
    if (closed_) return;
    closed_ = true;
    A(ring_->shared()->producer_closed).store(1, std::memory_order_seq_cst);
    if (switched) Signal(peer_pipe_);
    if (peer_pipe_ >= 0) ::close(peer_pipe_);
    peer_pipe_ = -1;
    if (!A(ring_->shared()->attached).load(std::memory_order_acquire))
      retired_->Add(ring_, offered_ + attach_deadline_);
  }

 private:
  std::shared_ptr<Ring> ring_;
  const int tx_wake_;
  int peer_pipe_ = -1;  // the reader's wake-up pipe
  uint64_t head_ = 0;   // private copy of the ring's head
  bool closed_ = false;
  const std::shared_ptr<Retired> retired_;
  const Clock::duration attach_deadline_;
  const Clock::time_point offered_ = Clock::now();
};

class RingIn final : public InPath {
 public:
  RingIn(std::unique_ptr<Ring> ring, int peer_pipe, uint64_t max_frame)
      : ring_(std::move(ring)), peer_pipe_(peer_pipe), parser_(max_frame) {}
  ~RingIn() override {
    Close();
    if (peer_pipe_ >= 0) ::close(peer_pipe_);
  }

  Status Activate(const char**) override {
    active_ = true;
    return Status::kOk;
  }

  // Given up by its writer before SWITCH. Nothing written: never switched to
  // (it went back to the control connection, or its offer passed the attach
  // deadline) — nothing will come. Data written: its SWITCH is on the way over
  // the control connection, slower than the ring (a writer that sends its last
  // messages and closes at once) — the negotiator waits for it, bounded.
  Status Check(Clock::time_point, const char**) override {
    Shared* s = ring_->shared();
    if (!A(s->producer_closed).load(std::memory_order_seq_cst)) return Status::kOk;
    return A(s->head).load(std::memory_order_seq_cst) == tail_ ? Status::kDrop
                                                               : Status::kDataWaiting;
  }

  // Reads what is available. Every value read from shared memory is checked
  // first.
  Read Pump(std::vector<Frame>* frames, const char** why) override {
    Shared* s = ring_->shared();
    const uint64_t cap = ring_->capacity();
    const uint64_t first_head = A(s->head).load(std::memory_order_acquire);
    if (first_head < tail_ || first_head - tail_ > cap) {
      *why = "invalid write position";
      return Read::kBad;
    }
    const uint64_t start = tail_, step = Step(cap);
    uint64_t published = tail_;
    bool done = false;
    for (uint64_t head = first_head; !done;) {
      while (tail_ != head && !done) {
        auto [dst, want] = parser_.Want();
        const uint64_t n = std::min({want, head - tail_, step});
        // A large message's bytes are streamed past the cache: they are read only
        // once all of it arrived, when its first bytes are long gone from it.
        ring_->CopyOut(tail_, dst, n, parser_.MessageBytes() >= kStreamAfterBytes);
        tail_ += n;
        done = parser_.Got(n, why);
        if (*why) return Read::kBad;
        // Space is given back every step, so the writer copies in while we
        // copy out (see Step).
        if (tail_ - published >= step) published = Release();
      }
      if (done || tail_ - start >= cap) break;  // at most one ring's worth per call
      // The writer may have added more meanwhile: go on without a round
      // through the receive loop.
      const uint64_t more = A(s->head).load(std::memory_order_acquire);
      if (more < tail_ || more - tail_ > cap) {
        *why = "invalid write position";
        return Read::kBad;
      }
      if (more == head) break;
      head = more;
    }
    if (done) *frames = parser_.Take();
    if (tail_ != published) Release();
    if (done) return Read::kMessage;
    if (A(s->producer_closed).load(std::memory_order_seq_cst) &&
        A(s->head).load(std::memory_order_seq_cst) == tail_)
      return Read::kClosed;  // the writer closed and everything was read
    return Read::kNothing;
  }

  // Gives the bytes read so far back to the writer, and wakes it if it waits.
  uint64_t Release() {
    Shared* s = ring_->shared();
    A(s->tail).store(tail_, std::memory_order_seq_cst);
    if (A(s->producer_waiting).exchange(0, std::memory_order_seq_cst)) Signal(peer_pipe_);
    return tail_;
  }

  bool Arm() override {
    if (!active_) return false;
    Shared* s = ring_->shared();
    A(s->consumer_waiting).store(1, std::memory_order_seq_cst);
    return A(s->head).load(std::memory_order_seq_cst) != tail_ ||
           A(s->producer_closed).load(std::memory_order_seq_cst);
  }
  void Disarm() override {
    if (active_) A(ring_->shared()->consumer_waiting).store(0, std::memory_order_relaxed);
  }
  bool Ready() const override {
    return active_ && A(ring_->shared()->head).load(std::memory_order_acquire) != tail_;
  }
  void Close() override { A(ring_->shared()->consumer_closed).store(1, std::memory_order_seq_cst); }

 private:
  std::unique_ptr<Ring> ring_;
  int peer_pipe_;      // the writer's wake-up pipe
  uint64_t tail_ = 0;  // private copy of the ring's tail
  framing::Parser parser_;
  bool active_ = false;
};

class RingPath final : public upgrade::DataPath {
 public:
  explicit RingPath(const upgrade::PathHost& host)
      : host_(host), boot_id_(ReadBootId()), local_(LocalIPv4Addresses()) {}

  upgrade::PathKind kind() const override { return upgrade::PathKind::kRing; }

  bool Wants(const std::string& endpoint, uint64_t) const override {
    const auto mode = host_.cfg->shm;
    if (boot_id_.empty() || mode == TransportConfig::Shm::kOff) return false;
    if (mode == TransportConfig::Shm::kOn) return true;
    const std::string h = endpoint.substr(0, endpoint.rfind(':'));
    return IsLoopback(h) || local_.count(h) > 0;
  }

  std::unique_ptr<OutPath> Offer(upgrade::Nonce* nonce, std::string* details,
                                 std::string* why) override {
    retired_->Prune(false);
    std::unique_ptr<Ring> ring;
    try {
      ring = Ring::Create(host_.cfg->shm_ring_bytes);
    } catch (const Error& e) {
      *why = std::string("shared memory unavailable: ") + e.what();
      return nullptr;
    }
    *nonce = ring->nonce();
    *details =
        EncodeRingDetails({host_.pid, ring->fd(), host_.tx_wake, ring->capacity(), boot_id_});
    return std::make_unique<RingOut>(std::move(ring), host_.tx_wake, retired_,
                                     host_.cfg->shm_attach_deadline);
  }

  void Service(const Adopt&) override { retired_->Prune(false); }
  void Close() override { retired_->Prune(true); }

  std::unique_ptr<InPath> Accept(const upgrade::Offer& offer, const std::string& from,
                                 std::string* why) override {
    const RingDetails d = DecodeRingDetails(offer.details);
    if (host_.cfg->shm == TransportConfig::Shm::kOff || boot_id_.empty() || boot_id_ != d.boot_id)
      return nullptr;  // declined quietly: the peer keeps using the control connection
    auto ring = Ring::Attach(d.pid, d.memfd, d.capacity, offer.nonce, why);
    if (!ring) return nullptr;
    const int pipe = OpenPeerPipe(d.pid, d.pipe, why);
    if (pipe < 0) return nullptr;
    Shared* s = ring->shared();
    s->consumer_pid = host_.pid;
    s->consumer_pipe = host_.rx_wake;
    A(s->attached).store(1, std::memory_order_release);
    return std::make_unique<RingIn>(std::move(ring), pipe, host_.cfg->max_frame);
  }

 private:
  const upgrade::PathHost host_;
  const std::string boot_id_;
  const std::set<std::string> local_;
  const std::shared_ptr<Retired> retired_ = std::make_shared<Retired>();
};

}  // namespace

namespace {
constexpr size_t kMaxBootId = 255;
constexpr auto kKind = static_cast<uint8_t>(upgrade::PathKind::kRing);
}  // namespace

std::string EncodeRingDetails(const RingDetails& d) {
  if (d.boot_id.size() > kMaxBootId) throw InternalError("boot id too long");
  ByteWriter w = BeginPayload(kKind, upgrade::kVersion);
  w.Put<int32_t>(d.pid);
  w.Put<int32_t>(d.memfd);
  w.Put<int32_t>(d.pipe);
  w.Put<uint64_t>(d.capacity);
  w.PutString(d.boot_id);
  return w.Take();
}

RingDetails DecodeRingDetails(const std::string& s) {
  PayloadReader r(s.data(), s.size(), "shared-memory offer");
  r.Header(kKind, 0, upgrade::kVersion);
  RingDetails d;
  d.pid = r.Get<int32_t>();
  d.memfd = r.Get<int32_t>();
  d.pipe = r.Get<int32_t>();
  d.capacity = r.Get<uint64_t>();
  d.boot_id = r.GetString(kMaxBootId);
  r.End();
  return d;
}

std::unique_ptr<upgrade::DataPath> CreateRingPath(const upgrade::PathHost& host) {
  return std::make_unique<RingPath>(host);
}

namespace {
// First choice: a peer on this host gets the ring.
const bool registered =
    upgrade::RegisterDataPath(upgrade::PathKind::kRing, "shm", "shared memory", 0, CreateRingPath);
}  // namespace

}  // namespace pskv::shm
