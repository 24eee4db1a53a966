// Small networking helpers.
#pragma once

#include <set>
#include <string>

namespace pskv {

/// IPv4 address of interface `name` ("eth0"); ConfigError naming DMLC_INTERFACE if
/// it has none.
std::string InterfaceAddress(const std::string& name);
/// The first non-loopback IPv4 address, or "127.0.0.1" if there is none.
std::string DefaultAddress();
/// Every IPv4 address of this host's interfaces (loopback included), dotted.
std::set<std::string> LocalIPv4Addresses();
/// True if `host` is a dotted IPv4 literal.
bool IsIPv4Literal(const std::string& host);
/// True for 127.0.0.0/8 and "localhost".
bool IsLoopback(const std::string& host);

/// A TCP port on `host` (an IPv4 literal; otherwise all interfaces) that was free
/// a moment ago (bound and closed again): a random one below the kernel's ephemeral
/// range, so no outgoing connection takes it before the caller binds it; bind to port
/// 0 only when that range leaves no room below it.
int FreePort(const std::string& host = "127.0.0.1");

}  // namespace pskv
