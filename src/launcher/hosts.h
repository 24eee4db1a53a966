// Hosts of a job and where its processes go: horovodrun's `-H host1:4,host2:4`
// and host files (`host[:ssh_port] [slots=N]` per line, as Open MPI and horovodrun).
#pragma once

#include <string>
#include <vector>

namespace pskv::launcher {

struct Host {
  std::string name;
  int port = 22;  ///< ssh port
  int slots = 0;  ///< workers this host takes; 0: not given
};

/// `arg` names a readable file: a host file, one `host[:ssh_port] [slots=N]` per line
/// (`#` comments). Otherwise a list `host[:slots],host[:slots]...` (horovodrun's -H).
/// `ssh_port` applies to hosts that name none. A lone name that is no existing file
/// (`-H hosts`) is an error (a mistyped host file) unless it is an IPv4 literal or
/// "localhost"; one host is written `name:SLOTS` or `name,`. Throws InvalidArgument.
std::vector<Host> ParseHosts(const std::string& arg, int ssh_port = 22);

/// True when `arg` is a host file rather than a host list.
bool IsHostFile(const std::string& arg);

/// The host index of every server and worker. Servers are spread round-robin over
/// the hosts and do not take slots. Workers fill the hosts' slots in order (rank 0..
/// slots(h0)-1 on the first host, ...; a host without slots= takes 1) when any host
/// gives slots; otherwise they continue round-robin after the servers (MXNet's
/// order). Throws InvalidArgument when the slots are too few for the workers.
struct Placement {
  std::vector<size_t> server_host, worker_host;
};
Placement Place(const std::vector<Host>& hosts, int num_servers, int num_workers);

}  // namespace pskv::launcher
