// The KV store's control payloads: the bodies and replies of the commands workers
// send servers (kvstore/dist_protocol.h, named after each command), written with the
// schema of protocol/payload.h (`u8 kind, u8 version`, ByteWriter fields; decoders
// refuse what does not fit, ProtocolError naming the payload) and in the kind-number
// space that header describes: these are kinds 2-9 and 12, at payload::kVersion.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "protocol/payload.h"
#include "pskv/embedding.h"
#include "pskv/kvstore.h"
#include "pskv/optimizer.h"

namespace pskv::payload {

/// The KV store's kinds (protocol/payload.h's Kind holds the others).
enum class KvKind : uint8_t {
  kOptimizer = 2,          ///< kSetOptimizer: OptimizerConfig
  kCompression = 3,        ///< kSetCompression: CompressionConfig
  kInitReport = 4,         ///< kReportInit: InitReport
  kCheckInit = 5,          ///< kCheckInit: wire ids
  kRoundStatus = 6,        ///< kRoundStatus reply: RoundStatus
  kStatesSize = 7,         ///< kStatesSize reply: u64 bytes
  kMode = 8,               ///< kSetMode: sync flag
  kHasOptimizer = 9,       ///< kHasOptimizer reply: flag
  kRangeStatesSizes = 12,  ///< kStatesSize reply of a replicated server: RangeStatesSizes
  kEmbeddingTable = 13,    ///< kEmbeddingCreate's value: EmbeddingConfig
};
/// The highest kind number of either layer.
constexpr uint8_t kMaxKind = 13;

/// Name of a KV kind ("optimizer config", ...), for error messages.
const char* KindName(KvKind k);

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

/// Every field of the config (Validate() is the receiver's business): the rows of
/// kvstore/optimizer_fields.h in order, then (only if any) the rule parameters:
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

/// kStatesSize reply of a server with replicated key ranges (PSKV_REPLICAS >= 1):
/// (range, bytes of its states snapshot) for each range the server is primary of.
using RangeStatesSizes = std::vector<std::pair<int32_t, uint64_t>>;
std::string EncodeRangeStatesSizes(const RangeStatesSizes& sizes);
RangeStatesSizes DecodeRangeStatesSizes(const std::string& body);

/// kEmbeddingCreate's value (dist_protocol.h): a dynamic embedding table's whole
/// configuration; the optimizer as a nested optimizer-config payload (a string).
/// Decoding checks only the encoding (enum values, sizes); embedding::Table checks
/// the values.
std::string EncodeEmbeddingTable(const EmbeddingConfig& c);
EmbeddingConfig DecodeEmbeddingTable(const std::string& body);

/// Decodes `body` with the decoder its kind byte names (a KV kind or a node-level
/// one), discarding the result (the fuzz target's entry point). Throws ProtocolError
/// like the decoders.
void DecodeAny(const std::string& body);

}  // namespace pskv::payload
