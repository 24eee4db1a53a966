#include "common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <utility>

#include "pskv/error.h"

namespace pskv {

namespace {
// Calls fn(interface name, flags, dotted address) for every IPv4 address of every
// interface, in the kernel's order, until fn returns false.
template <typename F>
void ForEachIPv4(F&& fn) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    if (!inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf,
                   sizeof buf))
      continue;
    if (!fn(a->ifa_name, a->ifa_flags, std::string(buf))) break;
  }
  freeifaddrs(list);
}

std::string Find(const std::string* want_name, bool skip_loopback) {
  std::string out;
  ForEachIPv4([&](const char* name, unsigned flags, std::string addr) {
    if (want_name && *want_name != name) return true;
    if (skip_loopback && (flags & IFF_LOOPBACK)) return true;
    out = std::move(addr);
    return false;
  });
  return out;
}
}  // namespace

std::set<std::string> LocalIPv4Addresses() {
  std::set<std::string> out;
  ForEachIPv4([&](const char*, unsigned, std::string addr) {
    out.insert(std::move(addr));
    return true;
  });
  return out;
}

std::string InterfaceAddress(const std::string& name) {
  std::string a = Find(&name, false);
  if (a.empty())
    throw ConfigError("DMLC_INTERFACE='" + name + "' has no IPv4 address (see `ip addr`)");
  return a;
}

std::string DefaultAddress() {
  std::string a = Find(nullptr, true);
  return a.empty() ? "127.0.0.1" : a;
}

bool IsIPv4Literal(const std::string& host) {
  in_addr a;
  return inet_pton(AF_INET, host.c_str(), &a) == 1;
}

namespace {
// The kernel's range for the local ports of outgoing connections (and of bind to 0).
std::pair<int, int> EphemeralRange() {
  std::pair<int, int> r{32768, 60999};
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (f >> lo >> hi && lo > 0 && hi >= lo) r = {lo, hi};
  return r;
}

// Binds a fresh socket to host:port (0: any port) and returns the port bound, or 0.
int TryBind(const std::string& host, int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) throw IOError("socket() failed while looking for a free port");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(s);
  return ok ? ntohs(a.sin_port) : 0;
}
}  // namespace

int FreePort(const std::string& host) {
  // A port below the ephemeral range: between this check and the caller's bind, no
  // outgoing connection of any process on the host can take it (a port from bind(0)
  // is an ephemeral one, and a busy host hands it to the next connect()).
  constexpr int kLowest = 10000;
  const int below = EphemeralRange().first;
  if (below - kLowest >= 1024) {
    std::minstd_rand rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(kLowest, below - 1);
    for (int attempt = 0; attempt < 64; ++attempt)
      if (int p = TryBind(host, pick(rng))) return p;
  }
  if (int p = TryBind(host, 0)) return p;
  throw IOError("cannot find a free port on " + host);
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0;
}

}  // namespace pskv
