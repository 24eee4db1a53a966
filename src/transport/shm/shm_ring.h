// A single-producer single-consumer byte ring in a sealed memfd shared by two
// processes of one host: the data path of the shared-memory transport.
//
// Lifetime and trust:
//  * the producer creates the memfd (MFD_ALLOW_SEALING), sizes it, reserves its
//    pages (fallocate, so a full memory limit is an error now, not a SIGBUS
//    later) and seals its size (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): the
//    peer can never truncate the mapping under the other side's feet;
//  * the memfd has no name in any file system. The consumer reaches it only
//    through /proc/<producer pid>/fd/<fd> — which the kernel allows to processes
//    of the same user only — after the producer told it where, over the
//    authenticated ZeroMQ connection; the consumer then checks that the file is
//    the memfd named by a 128-bit random nonce from the same message, sealed and
//    of the announced size, so a peer cannot make it map anything else;
//  * everything the other side writes into the shared page (head, tail, flags)
//    is hostile: each value read from shared memory is range-checked before use,
//    and each side keeps its own position privately (never read back).
//
// Layout: one 4 KiB control page (Shared) then `capacity` bytes of data
// (a power of two). Positions are monotonically increasing byte counts; the
// data for position p lives at p % capacity. head is written by the producer
// only, tail by the consumer only, both published with release stores.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace pskv::shm {

using Nonce = std::array<uint8_t, 16>;

constexpr uint64_t kControlBytes = 4096;
constexpr uint64_t kMinCapacity = 4096;
constexpr uint64_t kMaxCapacity = uint64_t{1} << 30;

// The control page. Fields accessed by both processes go through std::atomic_ref.
struct Shared {
  uint64_t magic;
  uint64_t capacity;
  uint8_t nonce[16];
  alignas(64) uint64_t head;  // producer: bytes written
  uint32_t producer_waiting;  // producer waits for space (consumer signals)
  uint32_t producer_closed;   // producer will write no more
  alignas(64) uint64_t tail;  // consumer: bytes consumed
  uint32_t consumer_waiting;  // consumer waits for data (producer signals)
  uint32_t consumer_closed;   // consumer stopped reading (bad data, closing)
  uint32_t attached;          // consumer mapped the ring; fields below are set
  int32_t consumer_pid;       // where the producer finds the consumer's wake pipe
  int32_t consumer_pipe;
};
static_assert(sizeof(Shared) <= kControlBytes);

class Ring {
 public:
  /// Producer side: a new sealed memfd ring of `capacity` bytes (a power of two
  /// within [kMinCapacity, kMaxCapacity]). Throws IOError when the system cannot
  /// provide one (the caller then keeps using TCP).
  static std::unique_ptr<Ring> Create(uint64_t capacity);
  /// Consumer side: maps the producer's memfd after checking it (see the top of
  /// the file). Returns null and sets *why when the check fails.
  static std::unique_ptr<Ring> Attach(int pid, int fd, uint64_t capacity, const Nonce& nonce,
                                      std::string* why);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  int fd() const { return fd_; }
  uint64_t capacity() const { return capacity_; }
  const Nonce& nonce() const { return nonce_; }
  Shared* shared() const { return reinterpret_cast<Shared*>(base_); }
  char* data() const { return base_ + kControlBytes; }

  /// Copies n bytes to/from ring position `pos` (wrapping around the end).
  /// `stream`: write `dst` past the caches (StreamCopy, common/stream_copy.h), for
  /// a message too large to be read from the cache after it arrived.
  void CopyIn(uint64_t pos, const char* src, uint64_t n) const;
  void CopyOut(uint64_t pos, char* dst, uint64_t n, bool stream = false) const;

 private:
  Ring() = default;
  int fd_ = -1;
  char* base_ = nullptr;
  uint64_t capacity_ = 0;
  Nonce nonce_{};
};

/// Opens /proc/<pid>/fd/<fd> (non-blocking) and checks that it is a pipe of this
/// user (a wake-up channel); -1 and *why on failure.
int OpenPeerPipe(int pid, int fd, std::string* why);

/// Lowercase hex of the nonce (the memfd's name is "pskv-<hex>").
std::string NonceHex(const Nonce& n);

}  // namespace pskv::shm
