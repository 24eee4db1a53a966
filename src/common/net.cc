#include "common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pskv/error.h"

namespace pskv {

namespace {
std::string Find(const std::string* want_name, bool skip_loopback) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    if (want_name && *want_name != a->ifa_name) continue;
    if (skip_loopback && (a->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    out = buf;
    break;
  }
  freeifaddrs(list);
  return out;
}
}  // namespace

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

int FreePort(const std::string& host) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) throw IOError("socket() failed while looking for a free port");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(s);
  if (!ok) throw IOError("cannot find a free port on " + host);
  return ntohs(a.sin_port);
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0;
}

}  // namespace pskv
