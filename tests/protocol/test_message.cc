// The protocol decoder: every malformed input is a ProtocolError, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
  // kChunkBytes * 9 + 5: a value large enough to be copied out with streaming stores
  // (common/stream_copy.h).
  for (uint64_t len :
       {uint64_t{0}, uint64_t{12}, kChunkBytes, kChunkBytes * 3 + 5, kChunkBytes * 9 + 5}) {
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
      // A range that starts mid-chunk, into a destination that is not aligned, and
      // the bytes around it untouched.
      std::string odd(len + 4, '\x5a');
      d.CopyVals(1, len - 2, odd.data() + 3);
      EXPECT_EQ(0, std::memcmp(odd.data() + 3, m.vals.data + 1, len - 2));
      EXPECT_EQ(odd.substr(0, 3), "\x5a\x5a\x5a");
      EXPECT_EQ(odd.substr(len + 1), "\x5a\x5a\x5a");
    }
  }
}

// Gathered values (transport.h): Encode cuts them into 1 MiB chunks of pieces without
// copying (each chunk frame gathered, exactly kChunkBytes but the last), slices of a
// gathered frame hold exactly the bytes of the range, and the decoded message holds
// the pieces' bytes in order.
TEST(Message, GatheredValuesAreChunkedAndSlicedWithoutCopying) {
  auto src = std::make_shared<std::string>(std::string(3 << 20, '\0'));
  for (size_t i = 0; i < src->size(); ++i) (*src)[i] = static_cast<char>(i * 11 + i / 4093);
  std::vector<Frame::Piece> pieces;
  std::string flat;
  size_t at = 0;
  for (size_t k = 0; flat.size() < kChunkBytes * 2 + 777; ++k) {
    const size_t n = k % 5 == 0 ? 0 : (k * 4099) % 70000;  // empty, small and > 64 KiB
    at = (at + k * 8191) % (src->size() - n);
    pieces.push_back({src->data() + at, n});
    flat.append(src->data() + at, n);
  }
  const Frame g = Frame::Gather(pieces, src);
  ASSERT_TRUE(g.gathered());
  ASSERT_EQ(g.size, flat.size());
  std::string copy(g.size, '\0');
  g.CopyTo(copy.data());
  EXPECT_TRUE(copy == flat);
  // Slices: within a piece, across pieces, the whole, empty, at the end.
  for (auto [off, n] : std::vector<std::pair<size_t, size_t>>{{0, 1},
                                                              {3, 70000},
                                                              {12345, kChunkBytes},
                                                              {0, flat.size()},
                                                              {flat.size(), 0},
                                                              {flat.size() - 9, 9},
                                                              {kChunkBytes - 1, 2}}) {
    const Frame s = g.Slice(off, n);
    ASSERT_EQ(s.size, n);
    EXPECT_EQ(s.owner, src);
    size_t parts = 0;
    s.ForEachPart([&](const char*, size_t k) { parts += k; });
    ASSERT_EQ(parts, n) << "the pieces of slice " << off << "+" << n << " hold other bytes";
    const Frame f = s.Flat();
    EXPECT_TRUE(std::string(f.data, f.size) == flat.substr(off, n)) << off << "+" << n;
  }
  EXPECT_THROW(g.Slice(flat.size() - 1, 2), InternalError);
  // Encoded: chunks of pieces pointing into `src` (no copy), then decoded intact.
  Message m = Sample(flat.size());
  m.vals = g;
  std::vector<Frame> frames = Encode(m);
  ASSERT_EQ(frames.size(), 1u + 1 + 2 + 3);  // header, body, keys, lens, 3 chunks
  for (size_t c = 0; c < 3; ++c) {
    const Frame& f = frames[4 + c];
    EXPECT_TRUE(f.gathered());
    EXPECT_EQ(f.size, c < 2 ? kChunkBytes : flat.size() - 2 * kChunkBytes);
    size_t parts = 0;
    f.ForEachPart([&](const char* p, size_t k) {
      EXPECT_TRUE(p >= src->data() && p < src->data() + src->size()) << "a copy was made";
      parts += k;
    });
    EXPECT_EQ(parts, f.size) << "chunk " << c;
  }
  Message d = Decode(std::move(frames));
  std::string out(flat.size(), '\0');
  d.CopyVals(0, out.size(), out.data());
  EXPECT_TRUE(out == flat);
  // Keys of zero length only: gathered empty pieces encode as the one empty frame
  // (before: one frame too many, refused by Decode — a request never answered).
  Message z = Sample(0);
  z.vals = Frame::Gather({{src->data(), 0}, {src->data() + 5, 0}}, src);
  std::vector<Frame> zf = Encode(z);
  EXPECT_EQ(zf.size(), 1u + 1 + 2 + 1);
  EXPECT_NO_THROW(Decode(std::move(zf)));
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
  H(h).control = static_cast<uint8_t>(Control::kMaxControl) + 1;
  EXPECT_THROW(Decode(std::move(h)), ProtocolError);
}
