// Helpers shared by the multi-node tests.
#pragma once

#include <chrono>
#include <string>

#include "common/net.h"
#include "pskv/options.h"

namespace pskv::test {

using pskv::FreePort;

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
