// The shared-memory data path (upgrade/data_path.h): a sealed memfd ring per
// direction (shm_ring.h) between peers on one host. docs/transport.md, "Shared
// memory", describes the set-up, the checks and the wake-ups.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport/upgrade/data_path.h"

namespace pskv::shm {

/// A ring's offer details (upgrade::Offer::details; upgrade/control_codec.h): where
/// the sender's memfd is and how to wake it. u8 path (kRing), u8 version, fields.
struct RingDetails {
  int32_t pid = 0;
  int32_t memfd = -1;
  int32_t pipe = -1;      ///< the sender's wake-up pipe
  uint64_t capacity = 0;  ///< data bytes of the ring
  std::string boot_id;    ///< the sender's host (at most 255 bytes)
};
std::string EncodeRingDetails(const RingDetails& d);
/// ProtocolError if `s` is not a well-formed ring offer of a version this build reads.
RingDetails DecodeRingDetails(const std::string& s);

/// The ring path of a transport: offered per cfg.shm (to peers whose endpoint
/// is an address of this host, to all, or to none), accepted from peers with this
/// host's boot id and namespaces.
std::unique_ptr<upgrade::DataPath> CreateRingPath(const upgrade::PathHost& host);

}  // namespace pskv::shm
