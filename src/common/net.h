// Small networking helpers.
#pragma once

#include <string>

namespace pskv {

/// IPv4 address of interface `name` ("eth0"); ConfigError naming DMLC_INTERFACE if
/// it has none.
std::string InterfaceAddress(const std::string& name);
/// The first non-loopback IPv4 address, or "127.0.0.1" if there is none.
std::string DefaultAddress();
/// True if `host` is a dotted IPv4 literal.
bool IsIPv4Literal(const std::string& host);
/// True for 127.0.0.0/8 and "localhost".
bool IsLoopback(const std::string& host);

}  // namespace pskv
