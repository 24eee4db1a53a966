// Helpers shared by the multi-node tests.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "pskv/options.h"

namespace pskv::test {

/// A TCP port on 127.0.0.1 that was free a moment ago.
inline int FreePort() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

/// Options of one node of a job on 127.0.0.1 with short test timeouts.
inline Options NodeOptions(Role role, int port, int servers, int workers) {
  using namespace std::chrono_literals;
  Options o;
  o.role = role;
  o.role_set = true;
  o.root_uri = "127.0.0.1";
  o.root_port = port;
  o.num_servers = servers;
  o.num_workers = workers;
  o.heartbeat_interval = 200ms;
  o.heartbeat_timeout = 2000ms;
  o.register_timeout = 20s;
  o.op_timeout = 60s;
  return o;
}

}  // namespace pskv::test
