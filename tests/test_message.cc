// The protocol decoder: every malformed input is a ProtocolError, never a crash.
#include <gtest/gtest.h>

#include <cstring>

#include "protocol/message.h"
#include "pskv/error.h"

using namespace pskv;

namespace {
Message Sample(uint64_t vals_len = 12) {
  Message m;
  m.h.control = static_cast<uint8_t>(Control::kData);
  m.h.flags = kRequest | kPush;
  m.h.num_keys = 2;
  m.h.vals_len = vals_len;
  std::vector<uint64_t> keys = {3, 9}, lens = {vals_len / 2, vals_len - vals_len / 2};
  m.keys = Frame::Copy(keys.data(), 16);
  m.lens = Frame::Copy(lens.data(), 16);
  std::string v(vals_len, 'x');
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>(i * 7);
  m.vals = Frame::FromString(v);
  m.body = "hello";
  return m;
}
Header& H(std::vector<Frame>& f) {
  f[0] = Frame::Copy(f[0].data, f[0].size);  // writable copy
  return *reinterpret_cast<Header*>(const_cast<char*>(f[0].data));
}
}  // namespace

TEST(Message, RoundTripsIncludingChunkedValues) {
  for (uint64_t len : {uint64_t{0}, uint64_t{12}, kChunkBytes, kChunkBytes * 3 + 5}) {
    Message m = Sample(len);
    auto frames = Encode(m);
    Message d = Decode(std::move(frames));
    EXPECT_EQ(d.body, "hello");
    ASSERT_EQ(d.num_keys(), 2u);
    EXPECT_EQ(d.key_ptr()[1], 9u);
    std::string out(len, '\0');
    d.CopyVals(0, len, out.data());
    EXPECT_EQ(0, std::memcmp(out.data(), m.vals.data, len));
    if (len > 2) {
      std::string scratch;
      const char* p = d.Contiguous(1, len - 2, &scratch);
      EXPECT_EQ(0, std::memcmp(p, m.vals.data + 1, len - 2));
    }
  }
}

TEST(Message, RejectsEveryInconsistency) {
  auto bad = [](auto mutate) {
    auto f = Encode(Sample());
    mutate(f);
    EXPECT_THROW(Decode(std::move(f)), ProtocolError);
  };
  bad([](auto& f) { f.clear(); });
  bad([](auto& f) { f[0].size = 10; });
  bad([](auto& f) { H(f).magic = 1; });
  bad([](auto& f) { H(f).version = 99; });
  bad([](auto& f) { H(f).control = 200; });
  bad([](auto& f) { H(f).flags = 0xff; });
  bad([](auto& f) { H(f).num_keys = 3; });
  bad([](auto& f) { H(f).num_keys = kMaxKeys + 1; });
  bad([](auto& f) { H(f).vals_len = 13; });
  bad([](auto& f) { H(f).body_len = 4; });
  bad([](auto& f) { H(f).sender = -5; });
  bad([](auto& f) { f.pop_back(); });
  bad([](auto& f) { f.push_back(Frame::FromString("extra")); });
  bad([](auto& f) {  // keys not ascending
    uint64_t k[2] = {9, 3};
    f[2] = Frame::Copy(k, 16);
  });
  bad([](auto& f) {  // lens do not add up
    uint64_t l[2] = {6, 7};
    f[3] = Frame::Copy(l, 16);
  });
  bad([](auto& f) {  // overflowing lens
    uint64_t l[2] = {UINT64_MAX, 13};
    f[3] = Frame::Copy(l, 16);
  });
}

TEST(Message, VersionMismatchSaysSo) {
  auto f = Encode(Sample());
  H(f).version = kProtocolVersion + 1;
  try {
    Decode(std::move(f));
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("incompatible protocol version"), std::string::npos);
  }
}

TEST(Message, NodeListsAreValidated) {
  NodeDesc d;
  d.host = "127.0.0.1";
  d.port = 1234;
  d.token = 77;
  auto body = EncodeNodes({d, d});
  auto back = DecodeNodes(body);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].token, 77u);
  EXPECT_THROW(DecodeNodes(body.substr(0, body.size() - 1)), ProtocolError);
  EXPECT_THROW(DecodeNodes(body + "x"), ProtocolError);
  std::string huge = body;  // the count follows the payload's kind and version bytes
  huge[3] = '\xff';
  huge[4] = '\xff';
  huge[5] = '\xff';
  EXPECT_THROW(DecodeNodes(huge), ProtocolError);
}

// Send scheduling (protocol version 3): the kScheduled flag and kCredit control are
// understood; the next flag bit and control code are not.
TEST(Message, SchedulingFlagAndCreditControl) {
  auto f = Encode(Sample());
  H(f).flags = kRequest | kPush | kScheduled;
  EXPECT_EQ(Decode(std::move(f)).h.flags & kScheduled, kScheduled);
  Message c;
  c.h.control = static_cast<uint8_t>(Control::kCredit);
  c.h.timestamp = 7;
  auto cf = Encode(c);
  EXPECT_EQ(Decode(std::move(cf)).h.timestamp, 7u);
  EXPECT_STREQ(ControlName(Control::kCredit), "credit");
  auto g = Encode(Sample());
  H(g).flags = kRequest | 64;
  EXPECT_THROW(Decode(std::move(g)), ProtocolError);
  auto h = Encode(c);
  H(h).control = static_cast<uint8_t>(Control::kCredit) + 1;
  EXPECT_THROW(Decode(std::move(h)), ProtocolError);
}
