// Wire protocol of pskv: a versioned fixed-size header plus up to four payload
// frames. Every field of a received message is validated by Decode() before
// anything else looks at it.
//
// Frames of one message, in order (absent frames are not sent):
//   [0] Header (kHeaderSize bytes)
//   [1] body   (header.body_len bytes)            if body_len > 0
//   [2] keys   (num_keys * 8 bytes, uint64)        if num_keys > 0
//   [3] lens   (num_keys * 8 bytes, uint64 bytes)  if num_keys > 0
//   [4..] vals (header.vals_len bytes in chunks of kChunkBytes, the last one
//              shorter; one empty frame if vals_len is 0)  if num_keys > 0
// Values travel in chunks so that the receiving side allocates moderate buffers,
// which the allocator recycles, instead of fresh 64 MB mappings whose pages fault
// in on every message.
// Invariants checked by Decode: magic, version, known control code and flags,
// frame count and every frame size match the header, sum(lens) == vals_len,
// keys strictly ascending, sizes below the limits below.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/frame.h"

namespace pskv {

constexpr uint32_t kMagic = 0x564b5350;  // "PSKV"
// 2: control payloads in the payload schema; 3: send scheduling (kCredit, kScheduled);
// 4: replicated rounds count their answers and push counts (distributed/wire/replication_wire.h)
constexpr uint16_t kProtocolVersion = 4;
// Limits of one message. They also bound the largest frame a node accepts at all
// (ZMQ_MAXMSGSIZE, node.cc), which is what a stranger can make a node reserve
// during a handshake: keep them near what the protocol really sends (a dist store
// sends one key's slices per request; command bodies are small payloads).
constexpr uint32_t kMaxKeys = 1u << 20;
constexpr uint32_t kMaxBody = 16u << 20;
constexpr uint64_t kMaxVals = uint64_t{1} << 40;
constexpr uint64_t kChunkBytes = uint64_t{1} << 20;

/// Node ids: scheduler 1; server rank r: 8 + 2r; worker rank r: 9 + 2r (ps-lite's).
constexpr int kSchedulerId = 1;
/// The standby scheduler (PSKV_SCHEDULER_STANDBY) in the node table; it becomes
/// kSchedulerId when it takes over.
constexpr int kStandbyId = 3;
inline int ServerId(int rank) {
  return 8 + 2 * rank;
}
inline int WorkerId(int rank) {
  return 9 + 2 * rank;
}
inline bool IsServerId(int id) {
  return id >= 8 && id % 2 == 0;
}
inline bool IsWorkerId(int id) {
  return id >= 9 && id % 2 == 1;
}
inline int RankOfId(int id) {
  return id >= 8 ? (id - 8) / 2 : 0;
}
/// Barrier groups (bit flags, ps-lite's values).
constexpr int kSchedulerGroup = 1, kServerGroup = 2, kWorkerGroup = 4;
constexpr int kAllGroup = kSchedulerGroup | kServerGroup | kWorkerGroup;
/// The workers' barrier of KVStore::EpochPartition (elastic workers): the workers'
/// group plus a flag bit that sizes nothing; a worker joins a running job only at its
/// release (docs/fault-tolerance.md, "Elastic workers").
constexpr int kEpochFlag = 8;
constexpr int kEpochGroup = kWorkerGroup | kEpochFlag;

enum class Control : uint8_t {
  kData = 0,         // a KV request/response or a command
  kRegister = 1,     // node -> scheduler: body = NodeDesc, head = RegisterHead
  kNodeTable = 2,    // scheduler -> node: body = all NodeDescs (head: kNodeTable*)
  kBarrier = 3,      // node -> scheduler: head = group, timestamp = barriers of it passed
  kBarrierDone = 4,  // scheduler -> node: head = group, timestamp = barriers released (0: one more)
  kHeartbeat = 5,
  kAck = 6,         // timestamp field = acknowledged seq
  kNodeFailed = 7,  // scheduler -> node: head = dead id, body = reason
  kRefuse = 8,      // scheduler -> would-be node: body = reason
  kLeave = 9,       // node -> scheduler: clean exit after the final barrier
  // receiver -> sender of kScheduled data messages: timestamp = how many of them
  // (from that sender) this node has received so far; releases window credit.
  kCredit = 10,
  // scheduler -> node: body = the range table (payload kind 11), after a server's
  // death was survived by its replicas (ps/range_table.h)
  kRangeTable = 11,
  // spare server -> scheduler: it installed a copy of key range `head` sent by node
  // `timestamp` (the range's primary); body = the copy's bytes, in decimal. The
  // scheduler lists it as a replica of that range (docs/fault-tolerance.md, "Back to
  // full strength")
  kRangeCopied = 12,
  // scheduler -> node, elastic workers (PSKV_ELASTIC): worker `head` left the job,
  // which goes on without it; body = why (docs/fault-tolerance.md, "Elastic workers")
  kWorkerLeft = 13,
  // standby scheduler -> node, head = kTakeoverAsk: the standby lost the scheduler;
  // did the node lose it too? (answered kRejoin with a vote). head = kTakeoverCommit:
  // every node did, this standby is the job's scheduler now; the node answers kRejoin
  // (repeated until it does) — or, if it still reaches its scheduler, refuses with a
  // vote (docs/fault-tolerance.md, "Split brain").
  kTakeover = 14,
  // node -> the scheduler that took over, head = kRejoinAfterTakeover: body = the
  // node's range table (payload kind 11; empty when not replicated), so that a table
  // the dead primary published to some nodes only is not lost (docs/fault-tolerance.md,
  // "The scheduler"). node -> a standby that asked, head = kVoteLost or kVoteAlive.
  kRejoin = 15,
  // scheduler -> node, elastic workers (PSKV_ELASTIC): worker `head` joined the running
  // job in place of one that left (a new or restarted process); body = its NodeDesc
  // (payload kind 1, one entry). Sent at an epoch barrier's release, before it: rounds
  // from then on expect its pushes. A server answers kJoinReady once it can take them.
  kWorkerJoined = 16,
  // server -> scheduler: it applied kWorkerJoined for worker `head` (the scheduler
  // holds the epoch barrier's release until every live server did)
  kJoinReady = 17,
  kMaxControl = 17,
};

/// kNodeTable's head: the table at registration; the table a worker gets that joined a
/// running job (elastic); to a node of a running job, the fresh standby scheduler that
/// registered after a takeover (body: its NodeDesc alone, id kStandbyId): the node's
/// table names it as the standby from then on (docs/fault-tolerance.md, "The scheduler").
constexpr int kNodeTableStart = 0, kNodeTableJoined = 1, kNodeTableStandby = 2;

/// kTakeover's head.
constexpr int kTakeoverCommit = 0, kTakeoverAsk = 1;
/// kRejoin's head: the rejoin after a commit, or a node's answer to kTakeoverAsk —
/// it lost the scheduler too (its connection closed, or its own failure detection
/// found it dead), or its link to the scheduler is alive.
constexpr int kRejoinAfterTakeover = 0, kVoteLost = 1, kVoteAlive = 2;

/// kRegister's head: the settings every node of a job must share (PSKV_REPLICAS,
/// PSKV_SPARE_SERVERS, PSKV_ELASTIC) and whether the registering server is a spare.
struct RegisterHead {
  int replicas = 0;  // < 256
  int spares = 0;    // < 4096
  bool spare = false;
  bool elastic = false;
  int Encode() const {
    return (replicas & 0xff) | (spares & 0xfff) << 8 | (spare ? 1 << 20 : 0) |
           (elastic ? 1 << 21 : 0);
  }
  static RegisterHead Decode(int head) {
    return {head & 0xff, (head >> 8) & 0xfff, ((head >> 20) & 1) != 0, ((head >> 21) & 1) != 0};
  }
};

enum Flags : uint8_t {
  kRequest = 1,  // request (else response)
  kPush = 2,
  kPull = 4,
  kCommand = 8,  // a command (head/body) rather than KV data
  kError = 16,   // a response carrying an error message in body
  // a big message sent under the sender's window: the receiver answers kCredit
  // as soon as it arrives (before it is handled)
  kScheduled = 32,
  kKnownFlags = 63,
};

#pragma pack(push, 1)
struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint8_t control = 0;
  uint8_t flags = 0;
  uint64_t job = 0;    // job identity; nodes of another job are refused
  int32_t sender = 0;  // node id, 0 before registration
  int32_t recver = 0;
  uint64_t seq = 0;        // per (sender, recver) sequence number, for resend/dedup
  uint64_t timestamp = 0;  // request id, echoed in responses
  int32_t head = 0;        // command id / data cmd / barrier group
  int32_t priority = 0;
  uint32_t num_keys = 0;
  uint32_t body_len = 0;
  uint64_t vals_len = 0;
};
#pragma pack(pop)
constexpr size_t kHeaderSize = sizeof(Header);
static_assert(kHeaderSize == 64, "the header is 64 bytes on the wire");

/// A message. To send, fill `vals` (one logical buffer; Encode cuts it into
/// chunks without copying). A received message has its values in `chunks`
/// (views into the receive buffers, kept alive by their owners: no copy is made).
struct Message {
  Header h;
  std::string body;
  Frame keys, lens;
  Frame vals;                 // outgoing values
  std::vector<Frame> chunks;  // received values, in order

  const uint64_t* key_ptr() const { return reinterpret_cast<const uint64_t*>(keys.data); }
  const uint64_t* len_ptr() const { return reinterpret_cast<const uint64_t*>(lens.data); }
  uint32_t num_keys() const { return h.num_keys; }

  /// Calls fn(ptr, bytes, offset_from_start) for the pieces of received value
  /// bytes [offset, offset + len), in order.
  template <typename F>
  void ForEachPiece(uint64_t offset, uint64_t len, F&& fn) const {
    uint64_t done = 0;
    while (done < len) {
      const uint64_t at = offset + done;
      const Frame& c = chunks[at / kChunkBytes];
      const uint64_t in = at % kChunkBytes;
      const uint64_t n = std::min<uint64_t>(len - done, c.size - in);
      fn(c.data + in, n, done);
      done += n;
    }
  }
  /// Copies received value bytes [offset, offset + len) to out.
  void CopyVals(uint64_t offset, uint64_t len, char* out) const;
  /// Received value bytes [offset, offset + len) contiguously: a pointer into a
  /// chunk when they lie in one, else a copy in *scratch.
  const char* Contiguous(uint64_t offset, uint64_t len, std::string* scratch) const;
};

/// Builds the frames of a message. `keys`/`vals`/`lens` are sent without copying
/// (their owners are kept until the transport has sent them).
std::vector<Frame> Encode(const Message& m);
/// Validates and decodes; throws ProtocolError describing the first problem.
Message Decode(std::vector<Frame>&& frames);

/// "data", "register", ... for log lines.
const char* ControlName(Control c);
/// True for an encoded message whose loss, duplication or delay the protocol's
/// resend layer covers (data, barrier and ack messages; registration has its own
/// retry): what a fault-injecting transport may disturb (FaultConfig::disturb).
bool CoveredByResend(const std::vector<Frame>& frames);
/// Human-readable one-line summary for PS_VERBOSE=2.
std::string Describe(const Header& h);

/// Job identity hash of a job id string (FNV-1a 64).
uint64_t JobHash(const std::string& job_id);

/// Description of a node in registration and node-table messages.
struct NodeDesc {
  int id = 0;
  int role = 0;  // Role as int
  int rank = 0;
  std::string host;
  int port = 0;
  uint64_t token = 0;  // random per process: lets a node find itself in the table
  int64_t rank_hint = -1;
  /// A registering worker's WorkerLayoutSettings (common/env_table.h): the scheduler
  /// refuses a job whose workers differ. Empty for other nodes.
  std::string layout;
};
std::string EncodeNodes(const std::vector<NodeDesc>& nodes);
std::vector<NodeDesc> DecodeNodes(const std::string& body);

}  // namespace pskv
