// The one schema of pskv's control payloads (message bodies that are not KV data):
// every payload is `u8 kind, u8 version` followed by its fields written with
// ByteWriter (fixed-width little-endian integers and doubles, u8 booleans, strings
// as u32 length + bytes, lists as u32 count + elements). Decoders read with
// common/payload_reader.h: they check every count against the bytes remaining before
// reserving anything, refuse trailing bytes, and throw ProtocolError naming the
// payload and the problem; an unknown kind or version is a ProtocolError saying which
// versions are understood.
//
// This layer knows the schema and the node-level kinds (node lists, barrier states,
// the range table). The KV store's kinds (optimizer, compression, init reports, round
// status, states sizes, ...) are the store's, in kvstore/distributed/wire/kv_payload.h,
// written with this schema. The kind numbers are one space shared by both: the
// node-level kinds are 1, 10 and 11, the KV store's 2-9 and 12; a new kind of either
// takes the next free number (13), and kv_payload.cc checks that none is taken twice.
//
// Every kind is at version kVersion (one number for all kinds of both layers); a
// decoder refuses any other. Adding a field therefore changes kVersion for every kind.
// One extension point keeps v1's bytes: the optimizer config may end with the update
// rule's own parameters, written only when there are any (EncodeOptimizer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/payload_reader.h"
#include "protocol/message.h"

namespace pskv::payload {

/// The node-level kinds (the numbers in between are the KV store's).
enum class Kind : uint8_t {
  kNodeList = 1,       ///< registration / node table: NodeDesc list
  kBarrierState = 10,  ///< kBarrierState: entering (1) or leaving (0) Barrier()
  kRangeTable = 11,    ///< kRangeTable, kNodeTable's follower: RangeTableData
};
/// The version every encoder writes (each kind is at version 1 so far).
constexpr uint8_t kVersion = 1;

/// Name of a node-level kind ("node list", ...), for error messages; null for
/// any other number.
const char* KindName(Kind k);

std::string EncodeNodeList(const std::vector<NodeDesc>& nodes);
std::vector<NodeDesc> DecodeNodeList(const std::string& body);

std::string EncodeBarrierState(bool enter);
bool DecodeBarrierState(const std::string& body);  ///< true = entering

/// The range table (ps/range_table.h): its version and, per key range (server
/// rank i's share of the ps key space), the node id of its primary and of its
/// replicas in promotion order.
struct RangeHolders {
  int32_t primary = 0;
  std::vector<int32_t> replicas;
  std::vector<int32_t> joining;  // spares being sent a copy (not replicas yet)
};
struct RangeTableData {
  uint64_t version = 0;
  std::vector<RangeHolders> ranges;
  std::vector<int32_t> spares;  // spare servers that hold nothing yet
};
std::string EncodeRangeTable(const RangeTableData& t);
RangeTableData DecodeRangeTable(const std::string& body);

/// If the first byte of `body` is a node-level kind: decodes `body` with that kind's
/// decoder, discards the result and returns true (ProtocolError like the decoders).
/// Any other first byte (or none): false. The KV layer's DecodeAny
/// (kvstore/distributed/wire/kv_payload.h) covers every kind.
bool DecodeNodeLevel(const std::string& body);

/// For the codecs of either layer: a writer with the kind and version (kVersion)
/// bytes written, and a reader of a payload of one kind that checks those bytes
/// (its errors start "<name> payload: ").
ByteWriter Begin(uint8_t kind);
class Reader : public PayloadReader {
 public:
  Reader(const std::string& body, uint8_t kind, const char* name);
};

}  // namespace pskv::payload
