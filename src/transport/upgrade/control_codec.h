// The control messages of the path upgrade (how a pair of nodes moves its data
// from the authenticated control connection to a direct data path: docs/transport.md).
// They travel over the control connection as one frame:
//
//   8 bytes kMagic, u8 kind, u8 version, fields (common/byte_io.h: fixed-width
//   little-endian integers, strings as u32 length + bytes)
//
// kind OFFER (v1): u8 path, u64 seq, 16-byte nonce, string details (at most
//   kMaxDetails bytes): "I offer you a data path of this kind; here is how to
//   reach it". `details` is the path's own payload, versioned the same way
//   (u8 path, u8 version, fields) and encoded by the path itself, next to its
//   DataPath (shm::RingDetails in shm/ring_path.h, direct::TcpDetails in
//   tcp/socket_path.h).
// kind SWITCH (v1): 16-byte nonce: "from now on my messages to you go through
//   the path of that offer" — everything sent over the control connection before
//   it is older than anything on the path.
//
// Decoders check every length against the bytes remaining before reserving,
// refuse trailing bytes, and throw ProtocolError naming the message and the
// problem (an unknown kind or version says which are understood). A frame that
// does not start with kMagic is not a control message (IsControl): a protocol
// message's first frame starts with the protocol's magic and version
// (protocol/message.h), which never equal kMagic.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/frame.h"

namespace pskv::upgrade {

constexpr char kMagic[8] = {'P', 'S', 'K', 'V', 'P', 'A', 'T', 'H'};
constexpr uint8_t kVersion = 1;
/// Bytes of an offer's path details, at most.
constexpr size_t kMaxDetails = 1024;

using Nonce = std::array<uint8_t, 16>;

enum class Kind : uint8_t { kOffer = 1, kSwitch = 2 };

/// The data paths a node can offer. A new path takes the next number (its name
/// and the rest are its own: RegisterDataPath, data_path.h).
enum class PathKind : uint8_t { kRing = 1, kTcp = 2 };

struct Offer {
  PathKind path = PathKind::kRing;
  /// Offers of one node are numbered in the order made: an offer that arrives
  /// after a later one of the same node (over another, slower control
  /// connection) is stale and must not replace the later one's path.
  uint64_t seq = 0;
  Nonce nonce{};        ///< names the offer (and, for a ring, its memfd)
  std::string details;  ///< the path's own payload (see above)
};

struct Switch {
  Nonce nonce{};
};

using PathControl = std::variant<Offer, Switch>;

/// True if `frames` is a control message of this codec (one frame starting with
/// kMagic); it may still be malformed (DecodeControl says so).
bool IsControl(const std::vector<Frame>& frames);

Frame EncodeControl(const PathControl& c);
/// ProtocolError if the frame is not a well-formed control message of a kind and
/// version this build understands.
PathControl DecodeControl(const Frame& f);

}  // namespace pskv::upgrade
