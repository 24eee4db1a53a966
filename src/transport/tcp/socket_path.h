// The direct TCP data path (upgrade/data_path.h): one plain TCP connection per
// direction between peers that share no memory, written by the sending thread and
// read by the Recv thread (direct_tcp.h has the handshake; docs/transport.md,
// "Direct TCP").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport/upgrade/data_path.h"

namespace pskv::direct {

/// A direct TCP offer's details (upgrade::Offer::details; upgrade/control_codec.h):
/// where the sender listens. u8 path (kTcp), u8 version, fields.
struct TcpDetails {
  uint32_t ip = 0;  ///< IPv4, network order; 0: the address the offer came from
  uint16_t port = 0;
};
std::string EncodeTcpDetails(const TcpDetails& d);
/// ProtocolError if `s` is not a well-formed TCP offer of a version this build reads.
TcpDetails DecodeTcpDetails(const std::string& s);

/// The socket path of a transport: listens at Bind (not with cfg.encrypt, nor on
/// the scheduler, nor without cfg.tcp_direct), offered to every peer but the
/// scheduler.
std::unique_ptr<upgrade::DataPath> CreateSocketPath(const upgrade::PathHost& host);

}  // namespace pskv::direct
