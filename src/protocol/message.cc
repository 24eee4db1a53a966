#include "protocol/message.h"

#include <cstring>
#include <sstream>

#include "common/stream_copy.h"
#include "protocol/payload.h"
#include "pskv/error.h"

namespace pskv {

namespace {
// Appends bytes [0, len) of `v` cut into frames of kChunkBytes (the last shorter), none
// copied; a gathered `v` gives gathered chunks, in one pass over its pieces.
void AppendChunks(const Frame& v, uint64_t len, std::vector<Frame>& out) {
  if (len == 0) return;  // Encode sent the one empty frame (a gathered one adds none)
  if (!v.gathered()) {
    for (uint64_t off = 0; off < len; off += kChunkBytes)
      out.push_back(v.Slice(off, std::min<uint64_t>(kChunkBytes, len - off)));
    return;
  }
  if (len <= kChunkBytes) {
    out.push_back(v.Slice(0, len));
    return;
  }
  std::vector<Frame::Piece> cur;
  uint64_t have = 0;  // bytes in cur
  auto flush = [&] {
    out.push_back(Frame::Gather(std::move(cur), v.owner));
    cur.clear();
    have = 0;
  };
  uint64_t left = len;
  for (const Frame::Piece& p : *v.pieces) {
    for (uint64_t at = 0; at < p.size && left > 0;) {
      const uint64_t n = std::min({p.size - at, kChunkBytes - have, left});
      cur.push_back({p.data + at, n});
      at += n;
      have += n;
      left -= n;
      if (have == kChunkBytes || left == 0) flush();
    }
    if (left == 0) break;
  }
}
}  // namespace

std::vector<Frame> Encode(const Message& m) {
  std::vector<Frame> frames;
  Header h = m.h;
  h.magic = kMagic;
  h.version = kProtocolVersion;
  h.body_len = static_cast<uint32_t>(m.body.size());
  frames.push_back(Frame::Copy(&h, sizeof h));
  if (!m.body.empty()) frames.push_back(Frame::FromString(m.body));
  if (h.num_keys > 0) {
    frames.push_back(m.keys);
    frames.push_back(m.lens);
    if (h.vals_len == 0) frames.push_back(Frame{});
    AppendChunks(m.vals, h.vals_len, frames);
  }
  return frames;
}

void Message::CopyVals(uint64_t offset, uint64_t len, char* out) const {
  // Chunk by chunk, memcpy would read every destination line before writing it
  // (each chunk is far below glibc's threshold for streaming): a large value is
  // streamed past the cache, which it does not fit anyway (common/stream_copy.h).
  const bool stream = len >= kStreamAfterBytes;
  ForEachPiece(offset, len, [&](const char* p, uint64_t n, uint64_t at) {
    if (stream)
      StreamCopy(out + at, p, n);
    else
      std::memcpy(out + at, p, n);
  });
}

const char* Message::Contiguous(uint64_t offset, uint64_t len, std::string* scratch) const {
  if (len == 0) return "";
  if (offset / kChunkBytes == (offset + len - 1) / kChunkBytes)
    return chunks[offset / kChunkBytes].data + offset % kChunkBytes;
  scratch->resize(len);
  CopyVals(offset, len, scratch->data());
  return scratch->data();
}

namespace {
[[noreturn]] void Bad(const std::string& what) {
  throw ProtocolError("malformed message: " + what);
}
}  // namespace

Message Decode(std::vector<Frame>&& frames) {
  if (frames.empty()) Bad("no frames");
  // Transports never deliver gathered frames; Encode's output decoded in one process
  // (tests, tools) may hold some.
  for (Frame& f : frames)
    if (f.gathered()) f = f.Flat();
  if (frames[0].size != kHeaderSize)
    Bad("header frame of " + std::to_string(frames[0].size) + " bytes, expected " +
        std::to_string(kHeaderSize));
  Message m;
  std::memcpy(&m.h, frames[0].data, kHeaderSize);
  const Header& h = m.h;
  if (h.magic != kMagic) Bad("bad magic (not a pskv message)");
  if (h.version != kProtocolVersion)
    throw ProtocolError("incompatible protocol version " + std::to_string(h.version) +
                        " (this node speaks " + std::to_string(kProtocolVersion) +
                        "): run the same pskv version on every node");
  if (h.control > static_cast<uint8_t>(Control::kMaxControl))
    Bad("unknown control code " + std::to_string(h.control));
  if (h.flags & ~kKnownFlags) Bad("unknown flags " + std::to_string(h.flags));
  if (h.num_keys > kMaxKeys) Bad(std::to_string(h.num_keys) + " keys exceeds the limit");
  if (h.body_len > kMaxBody)
    Bad("body of " + std::to_string(h.body_len) + " bytes exceeds the limit");
  if (h.vals_len > kMaxVals)
    Bad("values of " + std::to_string(h.vals_len) + " bytes exceed the limit");
  if (h.num_keys == 0 && h.vals_len != 0) Bad("values without keys");
  if (h.sender < 0 || h.recver < 0) Bad("negative node id");
  const uint64_t nchunks = h.vals_len == 0 ? 1 : (h.vals_len + kChunkBytes - 1) / kChunkBytes;
  const size_t want = 1 + (h.body_len > 0 ? 1 : 0) + (h.num_keys > 0 ? 2 + nchunks : 0);
  if (frames.size() != want)
    Bad(std::to_string(frames.size()) + " frames, header implies " + std::to_string(want));
  size_t i = 1;
  if (h.body_len > 0) {
    if (frames[i].size != h.body_len) Bad("body frame size differs from body_len");
    m.body.assign(frames[i].data, frames[i].size);
    ++i;
  }
  if (h.num_keys > 0) {
    const uint64_t n = h.num_keys;
    if (frames[i].size != n * 8) Bad("keys frame size differs from num_keys");
    if (frames[i + 1].size != n * 8) Bad("lens frame size differs from num_keys");
    for (uint64_t c = 0; c < nchunks; ++c) {
      const uint64_t want_size =
          h.vals_len == 0 ? 0 : std::min(kChunkBytes, h.vals_len - c * kChunkBytes);
      if (frames[i + 2 + c].size != want_size)
        Bad("value chunk " + std::to_string(c) + " has the wrong size");
    }
    m.keys = std::move(frames[i]);
    m.lens = std::move(frames[i + 1]);
    if (h.vals_len > 0)
      for (uint64_t c = 0; c < nchunks; ++c) m.chunks.push_back(std::move(frames[i + 2 + c]));
    uint64_t total = 0, prev = 0;
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t key, len;
      std::memcpy(&key, m.keys.data + 8 * k, 8);
      std::memcpy(&len, m.lens.data + 8 * k, 8);
      if (k > 0 && key <= prev) Bad("keys are not strictly ascending");
      prev = key;
      if (len > h.vals_len - total) Bad("lens add up to more than vals_len");
      total += len;
    }
    if (total != h.vals_len)
      Bad("lens add up to " + std::to_string(total) + ", vals_len is " +
          std::to_string(h.vals_len));
    // keys/lens are read through typed pointers: make sure they are aligned.
    if (reinterpret_cast<uintptr_t>(m.keys.data) % 8)
      m.keys = Frame::Copy(m.keys.data, m.keys.size);
    if (reinterpret_cast<uintptr_t>(m.lens.data) % 8)
      m.lens = Frame::Copy(m.lens.data, m.lens.size);
  }
  return m;
}

bool CoveredByResend(const std::vector<Frame>& frames) {
  if (frames.empty() || frames[0].size != kHeaderSize || frames[0].gathered()) return false;
  Header h;
  std::memcpy(&h, frames[0].data, sizeof h);
  const auto c = static_cast<Control>(h.control);
  return c == Control::kData || c == Control::kBarrier || c == Control::kBarrierDone ||
         c == Control::kAck;
}

const char* ControlName(Control c) {
  static const char* kNames[] = {
      "data",         "register",    "node_table", "barrier", "barrier_done",  "heartbeat",
      "ack",          "node_failed", "refuse",     "leave",   "credit",        "range_table",
      "range_copied", "worker_left", "takeover",   "rejoin",  "worker_joined", "join_ready"};
  const auto i = static_cast<size_t>(c);
  return i < sizeof kNames / sizeof kNames[0] ? kNames[i] : "unknown";
}

std::string Describe(const Header& h) {
  std::ostringstream os;
  os << ControlName(static_cast<Control>(h.control)) << " " << h.sender << "->" << h.recver
     << " seq=" << h.seq << " ts=" << h.timestamp << " head=" << h.head;
  if (h.flags & kRequest) os << " request";
  if (h.flags & kPush) os << " push";
  if (h.flags & kPull) os << " pull";
  if (h.flags & kCommand) os << " command";
  if (h.flags & kError) os << " error";
  if (h.num_keys) os << " keys=" << h.num_keys << " bytes=" << h.vals_len;
  return os.str();
}

uint64_t JobHash(const std::string& job_id) {
  uint64_t x = 1469598103934665603ull;
  for (unsigned char c : job_id) {
    x ^= c;
    x *= 1099511628211ull;
  }
  return x;
}

std::string EncodeNodes(const std::vector<NodeDesc>& nodes) {
  return payload::EncodeNodeList(nodes);
}

std::vector<NodeDesc> DecodeNodes(const std::string& body) {
  return payload::DecodeNodeList(body);
}

}  // namespace pskv
