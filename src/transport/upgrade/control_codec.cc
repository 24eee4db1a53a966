#include "transport/upgrade/control_codec.h"

#include <cstring>

#include "common/byte_io.h"
#include "pskv/error.h"

namespace pskv::upgrade {
namespace {

constexpr size_t kMaxBootId = 255;

// Reads `label`'s fields after checking that its first bytes are `kind` and a
// version this build understands; End() refuses trailing bytes.
class Reader {
 public:
  Reader(const char* p, size_t n, std::string label)
      : label_(std::move(label)), r_(p, n, label_.c_str()) {}
  void Header(uint8_t kind, uint8_t max_kind) {
    if (r_.remaining() < 2) Fail("truncated: no kind and version bytes");
    kind_ = r_.Get<uint8_t>();
    const auto version = r_.Get<uint8_t>();
    if (kind_ == 0 || kind_ > max_kind)
      Fail("unknown kind " + std::to_string(kind_) + " (understood: 1-" + std::to_string(max_kind) +
           ")");
    if (kind != 0 && kind_ != kind)
      Fail("wrong kind " + std::to_string(kind_) + " (expected " + std::to_string(kind) + ")");
    if (version != kVersion)
      Fail("version " + std::to_string(version) +
           " is not understood (understood: " + std::to_string(kVersion) + ")");
  }
  uint8_t kind() const { return kind_; }
  template <typename T>
  T Get() {
    return r_.Get<T>();
  }
  Nonce GetNonce() {
    Nonce n;
    r_.GetBytes(n.data(), n.size());
    return n;
  }
  std::string GetString(size_t max_len) { return r_.GetString(max_len); }
  void End() {
    if (r_.remaining()) Fail(std::to_string(r_.remaining()) + " trailing bytes");
  }
  [[noreturn]] void Fail(const std::string& m) { throw ProtocolError(label_ + ": " + m); }

 private:
  std::string label_;
  ByteReader r_;
  uint8_t kind_ = 0;
};

ByteWriter Begin(uint8_t kind) {
  ByteWriter w;
  w.Put<uint8_t>(kind);
  w.Put<uint8_t>(kVersion);
  return w;
}

}  // namespace

const char* PathName(PathKind p) {
  switch (p) {
    case PathKind::kRing:
      return "shared memory";
    case PathKind::kTcp:
      return "direct TCP";
  }
  return "unknown path";
}

bool IsControl(const std::vector<Frame>& frames) {
  return frames.size() == 1 && !frames[0].gathered() && frames[0].size >= sizeof kMagic &&
         std::memcmp(frames[0].data, kMagic, sizeof kMagic) == 0;
}

Frame EncodeControl(const PathControl& c) {
  ByteWriter w;
  w.PutBytes(kMagic, sizeof kMagic);
  if (const auto* o = std::get_if<Offer>(&c)) {
    if (o->details.size() > kMaxDetails)
      throw InternalError("path offer details of " + std::to_string(o->details.size()) + " bytes");
    w.Put<uint8_t>(static_cast<uint8_t>(Kind::kOffer));
    w.Put<uint8_t>(kVersion);
    w.Put<uint8_t>(static_cast<uint8_t>(o->path));
    w.Put<uint64_t>(o->seq);
    w.PutBytes(o->nonce.data(), o->nonce.size());
    w.PutString(o->details);
  } else {
    const auto& s = std::get<Switch>(c);
    w.Put<uint8_t>(static_cast<uint8_t>(Kind::kSwitch));
    w.Put<uint8_t>(kVersion);
    w.PutBytes(s.nonce.data(), s.nonce.size());
  }
  return Frame::FromString(w.Take());
}

PathControl DecodeControl(const Frame& f) {
  if (f.gathered() || f.size < sizeof kMagic || std::memcmp(f.data, kMagic, sizeof kMagic) != 0)
    throw ProtocolError("path control message: no magic");
  Reader r(f.data + sizeof kMagic, f.size - sizeof kMagic, "path control message");
  r.Header(0, static_cast<uint8_t>(Kind::kSwitch));
  if (r.kind() == static_cast<uint8_t>(Kind::kSwitch)) {
    Switch s;
    s.nonce = r.GetNonce();
    r.End();
    return s;
  }
  Offer o;
  const auto path = r.Get<uint8_t>();
  if (path == 0) r.Fail("path kind 0");
  // Unknown path kinds are decoded (a newer peer's offer) and declined by the
  // receiver: the details are the path's business.
  o.path = static_cast<PathKind>(path);
  o.seq = r.Get<uint64_t>();
  o.nonce = r.GetNonce();
  o.details = r.GetString(kMaxDetails);
  r.End();
  return o;
}

std::string EncodeRingDetails(const RingDetails& d) {
  if (d.boot_id.size() > kMaxBootId) throw InternalError("boot id too long");
  ByteWriter w = Begin(static_cast<uint8_t>(PathKind::kRing));
  w.Put<int32_t>(d.pid);
  w.Put<int32_t>(d.memfd);
  w.Put<int32_t>(d.pipe);
  w.Put<uint64_t>(d.capacity);
  w.PutString(d.boot_id);
  return w.Take();
}

RingDetails DecodeRingDetails(const std::string& s) {
  Reader r(s.data(), s.size(), "shared-memory offer");
  r.Header(static_cast<uint8_t>(PathKind::kRing), static_cast<uint8_t>(PathKind::kTcp));
  RingDetails d;
  d.pid = r.Get<int32_t>();
  d.memfd = r.Get<int32_t>();
  d.pipe = r.Get<int32_t>();
  d.capacity = r.Get<uint64_t>();
  d.boot_id = r.GetString(kMaxBootId);
  r.End();
  return d;
}

std::string EncodeTcpDetails(const TcpDetails& d) {
  ByteWriter w = Begin(static_cast<uint8_t>(PathKind::kTcp));
  w.Put<uint32_t>(d.ip);
  w.Put<uint16_t>(d.port);
  return w.Take();
}

TcpDetails DecodeTcpDetails(const std::string& s) {
  Reader r(s.data(), s.size(), "direct TCP offer");
  r.Header(static_cast<uint8_t>(PathKind::kTcp), static_cast<uint8_t>(PathKind::kTcp));
  TcpDetails d;
  d.ip = r.Get<uint32_t>();
  d.port = r.Get<uint16_t>();
  r.End();
  return d;
}

}  // namespace pskv::upgrade
