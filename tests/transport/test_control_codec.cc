// The path upgrade's control codec (transport/upgrade/control_codec.h) and the
// paths' offer details (shm/ring_path.h, tcp/socket_path.h): round trips, and every
// malformed input refused with a ProtocolError before anything is reserved.
#include <gtest/gtest.h>

#include <string>

#include "protocol/message.h"
#include "pskv/error.h"
#include "transport/shm/ring_path.h"
#include "transport/tcp/socket_path.h"
#include "transport/upgrade/control_codec.h"

using namespace pskv;
using namespace pskv::upgrade;
using pskv::direct::DecodeTcpDetails;
using pskv::direct::EncodeTcpDetails;
using pskv::direct::TcpDetails;
using pskv::shm::DecodeRingDetails;
using pskv::shm::EncodeRingDetails;
using pskv::shm::RingDetails;

namespace {

std::string Raw(const Frame& f) {
  return std::string(f.data, f.size);
}
Frame Of(const std::string& s) {
  return Frame::FromString(s);
}

Offer RingOffer() {
  Offer o;
  o.path = PathKind::kRing;
  o.seq = 0x0102030405060708;
  for (size_t i = 0; i < o.nonce.size(); ++i) o.nonce[i] = static_cast<uint8_t>(i * 7);
  o.details = EncodeRingDetails({1234, 5, 6, uint64_t{8} << 20, "boot/1/2"});
  return o;
}

TEST(ControlCodec, OfferRoundTrip) {
  const Offer o = RingOffer();
  const Frame f = EncodeControl(o);
  ASSERT_TRUE(IsControl({f}));
  const PathControl c = DecodeControl(f);
  ASSERT_TRUE(std::holds_alternative<Offer>(c));
  const Offer& d = std::get<Offer>(c);
  EXPECT_EQ(d.path, PathKind::kRing);
  EXPECT_EQ(d.seq, o.seq);
  EXPECT_EQ(d.nonce, o.nonce);
  const RingDetails r = DecodeRingDetails(d.details);
  EXPECT_EQ(r.pid, 1234);
  EXPECT_EQ(r.memfd, 5);
  EXPECT_EQ(r.pipe, 6);
  EXPECT_EQ(r.capacity, uint64_t{8} << 20);
  EXPECT_EQ(r.boot_id, "boot/1/2");
}

TEST(ControlCodec, SwitchAndTcpRoundTrip) {
  Switch s;
  s.nonce.fill(9);
  const PathControl c = DecodeControl(EncodeControl(s));
  ASSERT_TRUE(std::holds_alternative<Switch>(c));
  EXPECT_EQ(std::get<Switch>(c).nonce, s.nonce);
  const TcpDetails t = DecodeTcpDetails(EncodeTcpDetails({0x0100007f, 4321}));
  EXPECT_EQ(t.ip, 0x0100007fu);
  EXPECT_EQ(t.port, 4321);
}

TEST(ControlCodec, ProtocolMessagesAreNotControlMessages) {
  Message m;
  m.h.control = static_cast<uint8_t>(pskv::Control::kHeartbeat);
  EXPECT_FALSE(IsControl(Encode(m)));
  Message d;
  d.body =
      std::string(upgrade::kMagic, sizeof upgrade::kMagic);  // even with the magic in a later frame
  EXPECT_FALSE(IsControl(Encode(d)));
  EXPECT_FALSE(IsControl({Of("PSKV")}));
  EXPECT_FALSE(IsControl({EncodeControl(Switch{}), Of("x")}));  // one frame only
}

TEST(ControlCodec, EveryTruncationIsRejected) {
  for (const std::string& full : {Raw(EncodeControl(RingOffer())), Raw(EncodeControl(Switch{}))})
    for (size_t n = 0; n < full.size(); ++n)
      EXPECT_THROW(DecodeControl(Of(full.substr(0, n))), ProtocolError) << n;
  const std::string ring = RingOffer().details;
  for (size_t n = 0; n < ring.size(); ++n)
    EXPECT_THROW(DecodeRingDetails(ring.substr(0, n)), ProtocolError) << n;
  const std::string tcp = EncodeTcpDetails({1, 2});
  for (size_t n = 0; n < tcp.size(); ++n)
    EXPECT_THROW(DecodeTcpDetails(tcp.substr(0, n)), ProtocolError) << n;
}

TEST(ControlCodec, TrailingBytesAreRejected) {
  EXPECT_THROW(DecodeControl(Of(Raw(EncodeControl(RingOffer())) + "x")), ProtocolError);
  EXPECT_THROW(DecodeControl(Of(Raw(EncodeControl(Switch{})) + "x")), ProtocolError);
  EXPECT_THROW(DecodeRingDetails(RingOffer().details + "x"), ProtocolError);
  EXPECT_THROW(DecodeTcpDetails(EncodeTcpDetails({}) + "x"), ProtocolError);
}

TEST(ControlCodec, UnknownKindOrVersionSaysWhatIsUnderstood) {
  std::string s = Raw(EncodeControl(Switch{}));
  s[8] = 9;  // kind
  try {
    DecodeControl(Of(s));
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown kind 9"), std::string::npos) << e.what();
  }
  s = Raw(EncodeControl(Switch{}));
  s[9] = 2;  // version
  try {
    DecodeControl(Of(s));
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("understood: 1"), std::string::npos) << e.what();
  }
  std::string d = EncodeTcpDetails({});
  d[1] = 7;
  EXPECT_THROW(DecodeTcpDetails(d), ProtocolError);
  // One path's details are not another's.
  EXPECT_THROW(DecodeTcpDetails(RingOffer().details), ProtocolError);
  EXPECT_THROW(DecodeRingDetails(EncodeTcpDetails({})), ProtocolError);
}

TEST(ControlCodec, AnUnknownPathIsDecodedForTheReceiverToDecline) {
  Offer o = RingOffer();
  o.path = static_cast<PathKind>(77);
  o.details = "whatever a newer build puts here";
  const PathControl c = DecodeControl(EncodeControl(o));
  EXPECT_EQ(static_cast<int>(std::get<Offer>(c).path), 77);
  std::string s = Raw(EncodeControl(o));
  s[10] = 0;  // path kind 0 is never valid
  EXPECT_THROW(DecodeControl(Of(s)), ProtocolError);
}

TEST(ControlCodec, OversizedLengthsAreRejectedBeforeAllocating) {
  // An offer whose details claim 4 GiB: refused from the length alone.
  std::string s = Raw(EncodeControl(RingOffer()));
  const size_t len_at = 8 + 2 + 1 + 8 + 16;
  s[len_at] = s[len_at + 1] = s[len_at + 2] = s[len_at + 3] = '\xff';
  EXPECT_THROW(DecodeControl(Of(s)), ProtocolError);
  // A boot id longer than any host's.
  RingDetails r;
  r.boot_id = std::string(255, 'b');
  std::string d = EncodeRingDetails(r);
  EXPECT_EQ(DecodeRingDetails(d).boot_id, r.boot_id);
  d[2 + 12 + 8] = '\x00';
  d[2 + 12 + 8 + 1] = '\x01';  // 256 bytes
  EXPECT_THROW(DecodeRingDetails(d), ProtocolError);
  Offer big = RingOffer();
  big.details.assign(kMaxDetails + 1, 'x');
  EXPECT_THROW(EncodeControl(big), InternalError);
}

}  // namespace
