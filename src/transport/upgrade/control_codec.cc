#include "transport/upgrade/control_codec.h"

#include <cstring>

#include "common/payload_reader.h"
#include "pskv/error.h"

namespace pskv::upgrade {
namespace {

Nonce GetNonce(PayloadReader& r) {
  Nonce n;
  r.GetBytes(n.data(), n.size());
  return n;
}

}  // namespace

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
  PayloadReader r(f.data + sizeof kMagic, f.size - sizeof kMagic, "path control message");
  const uint8_t kind = r.Header(0, static_cast<uint8_t>(Kind::kSwitch), kVersion);
  if (kind == static_cast<uint8_t>(Kind::kSwitch)) {
    Switch s;
    s.nonce = GetNonce(r);
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
  o.nonce = GetNonce(r);
  o.details = r.GetString(kMaxDetails);
  r.End();
  return o;
}

}  // namespace pskv::upgrade
