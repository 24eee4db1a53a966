#include "launcher/hosts.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "common/net.h"
#include "pskv/error.h"

namespace pskv::launcher {

namespace {

int ToInt(const std::string& what, const std::string& v, int lo, int hi) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < lo || x > hi)
    throw InvalidArgument(what + ": '" + v + "' is not a whole number in [" + std::to_string(lo) +
                          ", " + std::to_string(hi) + "]");
  return static_cast<int>(x);
}

}  // namespace

bool IsHostFile(const std::string& arg) {
  struct stat st {};
  return ::stat(arg.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<Host> ParseHosts(const std::string& arg, int ssh_port) {
  std::vector<Host> hosts;
  if (IsHostFile(arg)) {
    std::ifstream f(arg);
    if (!f) throw InvalidArgument("cannot read host file '" + arg + "'");
    std::string line;
    for (int lineno = 1; std::getline(f, line); ++lineno) {
      auto hash = line.find('#');
      if (hash != std::string::npos) line.resize(hash);
      std::istringstream is(line);
      std::string word;
      if (!(is >> word)) continue;
      const std::string where = "host file " + arg + " line " + std::to_string(lineno);
      Host h;
      h.port = ssh_port;
      auto colon = word.rfind(':');
      h.name = word.substr(0, colon);
      if (colon != std::string::npos)
        h.port = ToInt(where + ": ssh port", word.substr(colon + 1), 1, 65535);
      for (std::string attr; is >> attr;) {
        if (attr.rfind("slots=", 0) == 0)
          h.slots = ToInt(where + ": slots", attr.substr(6), 1, 100000);
        else if (attr.rfind("max_slots=", 0) == 0)
          continue;  // Open MPI's; the launcher places by slots only
        else
          throw InvalidArgument(where + ": unknown attribute '" + attr +
                                "' (expected `host[:ssh_port] [slots=N]`)");
      }
      if (h.name.empty()) throw InvalidArgument(where + ": no host name");
      hosts.push_back(h);
    }
    if (hosts.empty()) throw InvalidArgument("host file '" + arg + "' lists no hosts");
    return hosts;
  }
  // horovodrun's list: host[:slots],...
  std::stringstream ss(arg);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    Host h;
    h.port = ssh_port;
    auto colon = item.rfind(':');
    h.name = item.substr(0, colon);
    if (colon != std::string::npos)
      h.slots = ToInt("-H " + arg + ": slots of " + h.name, item.substr(colon + 1), 1, 100000);
    if (h.name.empty()) throw InvalidArgument("-H " + arg + ": empty host name");
    hosts.push_back(h);
  }
  if (hosts.empty())
    throw InvalidArgument("-H '" + arg +
                          "' is neither a host file nor a list like host1:4,host2:4");
  // A lone name without slots and without a comma is what a host file's name looks
  // like (`-H hosts`): when no such file exists, the user most likely mistyped the
  // file's path, and running the whole job on one machine called "hosts" would be
  // a silent surprise. Only names that cannot be file names by mistake are taken
  // as one host: an IPv4 literal and "localhost". Any other single host is written
  // with its slots (`-H node1:4`) or as a list (`-H node1,`).
  if (hosts.size() == 1 && hosts[0].slots == 0 && arg.find(',') == std::string::npos) {
    const std::string& name = hosts[0].name;
    if (arg.find('/') != std::string::npos || (!IsIPv4Literal(name) && name != "localhost"))
      throw InvalidArgument("-H '" + arg + "': no such host file" +
                            (arg.find('/') != std::string::npos
                                 ? std::string(" (check the path)")
                                 : "; to run on one host of that name write -H " + name +
                                       ":SLOTS (e.g. " + name + ":1) or -H " + name + ","));
  }
  return hosts;
}

Placement Place(const std::vector<Host>& hosts, int num_servers, int num_workers) {
  Placement p;
  if (hosts.empty()) throw InvalidArgument("no hosts to place the job on");
  const size_t H = hosts.size();
  for (int s = 0; s < num_servers; ++s) p.server_host.push_back(static_cast<size_t>(s) % H);
  bool any_slots = false;
  for (auto& h : hosts) any_slots |= h.slots > 0;
  if (!any_slots) {
    for (int w = 0; w < num_workers; ++w)
      p.worker_host.push_back(static_cast<size_t>(num_servers + w) % H);
    return p;
  }
  long total = 0;
  std::string list;
  for (auto& h : hosts) {
    total += h.slots > 0 ? h.slots : 1;
    list += (list.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots > 0 ? h.slots : 1);
  }
  if (num_workers > total)
    throw InvalidArgument(std::to_string(num_workers) + " workers but the hosts have " +
                          std::to_string(total) + " slots (" + list +
                          "): give more hosts or slots, or fewer workers (-n)");
  for (size_t h = 0; h < H && static_cast<int>(p.worker_host.size()) < num_workers; ++h) {
    const int slots = hosts[h].slots > 0 ? hosts[h].slots : 1;
    for (int k = 0; k < slots && static_cast<int>(p.worker_host.size()) < num_workers; ++k)
      p.worker_host.push_back(h);
  }
  return p;
}

}  // namespace pskv::launcher
