// Raw loopback TCP for the benchmarks' ceilings: a connected pair of sockets, and
// a single-threaded echo (one round trip = N bytes out, N bytes back).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "pskv/error.h"

namespace pskv::bench {

/// A connected TCP pair on 127.0.0.1 (TCP_NODELAY; non-blocking if asked).
inline void LoopbackPair(int* client, int* server, bool nonblocking) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  ::listen(ls, 1);
  *client = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(*client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(ls);
    throw IOError("tcp ceiling: connect failed");
  }
  *server = ::accept(ls, nullptr, nullptr);
  ::close(ls);
  for (int fd : {*client, *server}) {
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (nonblocking) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
}

inline void WriteAll(int fd, const char* p, size_t n) {
  while (n) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) throw IOError("tcp ceiling: send failed");
    p += k;
    n -= static_cast<size_t>(k);
  }
}
inline void ReadAll(int fd, char* p, size_t n) {
  while (n) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) throw IOError("tcp ceiling: recv failed");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

/// A blocking single-threaded TCP echo on 127.0.0.1.
class TcpPair {
 public:
  explicit TcpPair(size_t max_bytes) : cbuf_(max_bytes, 1), sbuf_(max_bytes, 2) {
    LoopbackPair(&client_, &server_, false);
    echo_ = std::thread([this] {
      try {
        for (;;) {
          uint64_t n;
          ReadAll(server_, reinterpret_cast<char*>(&n), 8);
          if (n == 0 || n > sbuf_.size()) return;
          ReadAll(server_, sbuf_.data(), n);
          WriteAll(server_, sbuf_.data(), n);
        }
      } catch (const std::exception&) {
      }
    });
  }
  ~TcpPair() {
    try {
      uint64_t zero = 0;
      WriteAll(client_, reinterpret_cast<char*>(&zero), 8);
    } catch (const std::exception&) {
      ::shutdown(client_, SHUT_RDWR);
    }
    echo_.join();
    ::close(client_);
    ::close(server_);
  }
  TcpPair(const TcpPair&) = delete;
  TcpPair& operator=(const TcpPair&) = delete;
  /// N bytes out, N bytes back.
  void RoundTrip(size_t n) {
    uint64_t len = n;
    WriteAll(client_, reinterpret_cast<char*>(&len), 8);
    WriteAll(client_, cbuf_.data(), n);
    ReadAll(client_, cbuf_.data(), n);
  }

 private:
  std::vector<char> cbuf_, sbuf_;
  int client_ = -1, server_ = -1;
  std::thread echo_;
};

}  // namespace pskv::bench
