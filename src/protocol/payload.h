// The one schema of pskv's control payloads (message bodies that are not KV data):
// every payload is `u8 kind, u8 version` followed by its fields written with
// ByteWriter (fixed-width little-endian integers and doubles, u8 booleans, strings
// as u32 length + bytes, lists as u32 count + elements). Decoders check every count
// against the bytes remaining before reserving anything, refuse trailing bytes, and
// throw ProtocolError naming the payload and the problem; an unknown kind or version
// is a ProtocolError saying which versions are understood.
//
// Every kind is at version kVersion (one number for all kinds); a decoder
// refuses any other. Adding a field therefore changes kVersion for every kind. One
// extension point keeps v1's bytes: the optimizer config may end with the update
// rule's own parameters, written only when there are any (EncodeOptimizer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "protocol/message.h"
#include "pskv/kvstore.h"
#include "pskv/optimizer.h"

namespace pskv::payload {

enum class Kind : uint8_t {
  kNodeList = 1,           ///< registration / node table: NodeDesc list
  kOptimizer = 2,          ///< kSetOptimizer: OptimizerConfig
  kCompression = 3,        ///< kSetCompression: CompressionConfig
  kInitReport = 4,         ///< kReportInit: InitReport
  kCheckInit = 5,          ///< kCheckInit: wire ids
  kRoundStatus = 6,        ///< kRoundStatus reply: RoundStatus
  kStatesSize = 7,         ///< kStatesSize reply: u64 bytes
  kMode = 8,               ///< kSetMode: sync flag
  kHasOptimizer = 9,       ///< kHasOptimizer reply: flag
  kBarrierState = 10,      ///< kBarrierState: entering (1) or leaving (0) Barrier()
  kRangeTable = 11,        ///< kRangeTable, kNodeTable's follower: RangeTableData
  kRangeStatesSizes = 12,  ///< kStatesSize reply of a replicated server: RangeStatesSizes
  kMaxKind = 12,
};
/// The version every encoder writes (each kind is at version 1 so far).
constexpr uint8_t kVersion = 1;

/// Name of a kind ("node list", ...), for error messages.
const char* KindName(Kind k);

/// kReportInit: the keys of an Init call as a worker saw them, and (rank 0) the
/// keys it could not initialise.
struct InitEntry {
  int64_t id = 0;  ///< wire key
  std::string name, dtype, shape;
};
struct InitFailure {
  int64_t id = 0;
  std::string message;
};
struct InitReport {
  std::vector<InitEntry> entries;
  std::vector<InitFailure> failures;
};

/// kRoundStatus reply: rounds that wait for a worker in Barrier() while the asking
/// worker waits for them (key = wire key), and lines describing open rounds.
struct Deadlock {
  int64_t key = 0;
  std::string message;
};
struct RoundStatus {
  std::vector<Deadlock> deadlocks;
  std::vector<std::string> lines;
};

std::string EncodeNodeList(const std::vector<NodeDesc>& nodes);
std::vector<NodeDesc> DecodeNodeList(const std::string& body);

/// Every field of the config (Validate() is the receiver's business): the rows of
/// protocol/optimizer_fields.h in order, then (only if any) the rule parameters:
/// u32 count, (string name, double) each.
std::string EncodeOptimizer(const OptimizerConfig& cfg);
OptimizerConfig DecodeOptimizer(const std::string& body);

std::string EncodeCompression(const CompressionConfig& c);
CompressionConfig DecodeCompression(const std::string& body);

std::string EncodeInitReport(const InitReport& r);
InitReport DecodeInitReport(const std::string& body);

std::string EncodeCheckInit(const std::vector<int64_t>& ids);
std::vector<int64_t> DecodeCheckInit(const std::string& body);

std::string EncodeRoundStatus(const RoundStatus& s);
RoundStatus DecodeRoundStatus(const std::string& body);

std::string EncodeStatesSize(uint64_t bytes);
uint64_t DecodeStatesSize(const std::string& body);

std::string EncodeMode(bool sync);
bool DecodeMode(const std::string& body);  ///< true = sync

std::string EncodeHasOptimizer(bool has);
bool DecodeHasOptimizer(const std::string& body);

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

/// kStatesSize reply of a server with replicated key ranges (PSKV_REPLICAS >= 1):
/// (range, bytes of its states snapshot) for each range the server is primary of.
using RangeStatesSizes = std::vector<std::pair<int32_t, uint64_t>>;
std::string EncodeRangeStatesSizes(const RangeStatesSizes& sizes);
RangeStatesSizes DecodeRangeStatesSizes(const std::string& body);

std::string EncodeBarrierState(bool enter);
bool DecodeBarrierState(const std::string& body);  ///< true = entering

/// Decodes `body` with the decoder its kind byte names, discarding the result (the
/// fuzz target's entry point). Throws ProtocolError like the decoders.
void DecodeAny(const std::string& body);

}  // namespace pskv::payload
