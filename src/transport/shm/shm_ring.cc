#include "transport/shm/shm_ring.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/stream_copy.h"
#include "pskv/error.h"

namespace pskv::shm {

namespace {

constexpr uint64_t kRingMagic = 0x31474e49524b5350;  // "PSKRING1"

std::string Errno() {
  return std::strerror(errno);
}

std::string ProcFd(int pid, int fd) {
  return "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
}

// What /proc/self/fd/<fd> points to.
std::string LinkOf(int fd) {
  char buf[256];
  const std::string path = ProcFd(static_cast<int>(::getpid()), fd);
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Opens the file a peer named as /proc/<pid>/fd/<fd> in two steps, so that what
// it names cannot act on us before it is checked: first O_PATH (no driver open —
// a tty or a FUSE file held by some process of this user can neither block us
// nor become our controlling terminal), then `ok` checks that handle, then the
// same file is reopened for I/O through it and verified to be the same inode.
// Returns the I/O descriptor, or -1 with *why set.
template <typename Check>
int OpenPeerFile(int pid, int fd, int flags, Check ok, std::string* why) {
  const int pfd = ::open(ProcFd(pid, fd).c_str(), O_PATH | O_CLOEXEC);
  if (pfd < 0) {
    *why = "cannot open the peer's descriptor (" + Errno() +
           "): another host, container or user, or /proc is not mounted";
    return -1;
  }
  struct stat st {};
  if (::fstat(pfd, &st) != 0 || !ok(pfd, st)) {
    ::close(pfd);
    return -1;
  }
  const int f =
      ::open(ProcFd(static_cast<int>(::getpid()), pfd).c_str(), flags | O_NOCTTY | O_CLOEXEC);
  ::close(pfd);
  struct stat st2 {};
  if (f < 0 || ::fstat(f, &st2) != 0 || st2.st_ino != st.st_ino || st2.st_dev != st.st_dev) {
    if (f >= 0) ::close(f);
    *why = "the peer's descriptor changed while it was checked";
    return -1;
  }
  return f;
}

void CopyPlain(char* dst, const char* src, size_t n) {
  std::memcpy(dst, src, n);
}

bool ValidCapacity(uint64_t c) {
  return c >= kMinCapacity && c <= kMaxCapacity && (c & (c - 1)) == 0;
}

}  // namespace

std::string NonceHex(const Nonce& n) {
  char hex[2 * sizeof(Nonce) + 1];
  sodium_bin2hex(hex, sizeof hex, n.data(), n.size());
  return hex;
}

std::unique_ptr<Ring> Ring::Create(uint64_t capacity) {
  if (!ValidCapacity(capacity))
    throw ConfigError("shared-memory ring size " + std::to_string(capacity) +
                      " must be a power of two between 4 KiB and 1 GiB");
  if (sodium_init() < 0) throw IOError("libsodium could not be initialised");
  std::unique_ptr<Ring> r(new Ring);
  randombytes_buf(r->nonce_.data(), r->nonce_.size());
  const std::string name = "pskv-" + NonceHex(r->nonce_);
  r->fd_ = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (r->fd_ < 0) throw IOError("memfd_create failed: " + Errno());
  const auto size = static_cast<off_t>(kControlBytes + capacity);
  if (::ftruncate(r->fd_, size) != 0) throw IOError("ftruncate of a memfd failed: " + Errno());
  // Reserve the pages now: without this, memory running out would be a SIGBUS
  // on first touch instead of an error here.
  if (int e = ::posix_fallocate(r->fd_, 0, size); e != 0)
    throw IOError("cannot reserve " + std::to_string(size) +
                  " bytes of shared memory: " + std::strerror(e));
  if (::fcntl(r->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw IOError("cannot seal a memfd: " + Errno());
  void* p =
      ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) throw IOError("mmap of a memfd failed: " + Errno());
  r->base_ = static_cast<char*>(p);
  r->capacity_ = capacity;
  Shared* s = r->shared();
  s->capacity = capacity;
  std::memcpy(s->nonce, r->nonce_.data(), r->nonce_.size());
  std::atomic_ref<uint64_t>(s->magic).store(kRingMagic, std::memory_order_release);
  return r;
}

std::unique_ptr<Ring> Ring::Attach(int pid, int fd, uint64_t capacity, const Nonce& nonce,
                                   std::string* why) {
  if (pid <= 0 || fd < 0 || !ValidCapacity(capacity)) {
    *why = "malformed offer";
    return nullptr;
  }
  std::unique_ptr<Ring> r(new Ring);
  const uint64_t size = kControlBytes + capacity;
  r->fd_ = OpenPeerFile(
      pid, fd, O_RDWR,
      [&](int pfd, const struct stat& st) {
        // Only the memfd named by the offer's nonce: the peer cannot point us at
        // any other file of its process.
        if (LinkOf(pfd) != "/memfd:pskv-" + NonceHex(nonce) + " (deleted)") {
          *why = "the offered file is not the announced segment";
          return false;
        }
        if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
            static_cast<uint64_t>(st.st_size) != size) {
          *why = "the segment's size or owner is not as announced";
          return false;
        }
        return true;
      },
      why);
  if (r->fd_ < 0) return nullptr;
  const int seals = ::fcntl(r->fd_, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || (seals & F_SEAL_GROW) == 0) {
    *why = "the segment is not sealed (it could be truncated under us)";
    return nullptr;
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, 0);
  if (p == MAP_FAILED) {
    *why = "mmap failed: " + Errno();
    return nullptr;
  }
  r->base_ = static_cast<char*>(p);
  r->capacity_ = capacity;
  r->nonce_ = nonce;
  Shared* s = r->shared();
  if (std::atomic_ref<uint64_t>(s->magic).load(std::memory_order_acquire) != kRingMagic ||
      std::memcmp(s->nonce, nonce.data(), nonce.size()) != 0) {
    *why = "the segment's header is not a pskv ring";
    return nullptr;
  }
  return r;
}

Ring::~Ring() {
  if (base_) ::munmap(base_, kControlBytes + capacity_);
  if (fd_ >= 0) ::close(fd_);
}

void Ring::CopyIn(uint64_t pos, const char* src, uint64_t n) const {
  const uint64_t at = pos & (capacity_ - 1), first = std::min(n, capacity_ - at);
  std::memcpy(data() + at, src, first);
  if (n > first) std::memcpy(data(), src + first, n - first);
}

void Ring::CopyOut(uint64_t pos, char* dst, uint64_t n, bool stream) const {
  const uint64_t at = pos & (capacity_ - 1), first = std::min(n, capacity_ - at);
  void (*copy)(char*, const char*, size_t) = stream ? StreamCopy : CopyPlain;
  copy(dst, data() + at, first);
  if (n > first) copy(dst + first, data(), n - first);
}

int OpenPeerPipe(int pid, int fd, std::string* why) {
  if (pid <= 0 || fd < 0) {
    *why = "malformed wake-up channel";
    return -1;
  }
  // Read-write: the pipe then always has a reader (us), so writing to it after
  // its owner died fills it (EAGAIN) instead of raising SIGPIPE.
  return OpenPeerFile(
      pid, fd, O_RDWR | O_NONBLOCK,
      [&](int, const struct stat& st) {
        if (S_ISFIFO(st.st_mode) && st.st_uid == ::geteuid()) return true;
        *why = "the peer's wake-up channel is not a pipe of this user";
        return false;
      },
      why);
}

}  // namespace pskv::shm
