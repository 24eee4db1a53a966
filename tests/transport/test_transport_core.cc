// What the transport core owns apart from any backend: Frame (common/frame.h),
// the backend registry (transport.h), the data-path registry (upgrade/data_path.h),
// the fault decorator's predicate, and the host facts a backend asks common/net.h for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/frame.h"
#include "common/net.h"
#include "common/stream_copy.h"
#include "protocol/message.h"
#include "pskv/error.h"
#include "transport/fault/fault_transport.h"
#include "transport/transport.h"
#include "transport/upgrade/data_path.h"

using namespace pskv;
using namespace std::chrono_literals;

namespace {

TEST(FrameOf, AViewKeepsItsOwnerAlive) {
  auto s = std::make_shared<std::string>("hello");
  std::weak_ptr<std::string> w = s;
  Frame f = Frame::Of(s->data() + 1, 3, s);
  s.reset();
  ASSERT_FALSE(w.expired());
  EXPECT_EQ(std::string(f.data, f.size), "ell");
  f = Frame{};
  EXPECT_TRUE(w.expired());
}

TEST(FrameOf, AContainerIsViewedWhole) {
  auto v = std::make_shared<std::vector<uint64_t>>(std::vector<uint64_t>{1, 2, 3});
  const void* where = v->data();
  Frame f = Frame::Of(v);
  EXPECT_EQ(f.size, 3 * sizeof(uint64_t));
  EXPECT_EQ(static_cast<const void*>(f.data), where);  // no copy
  EXPECT_FALSE(f.gathered());
  Frame s = Frame::FromString("abc");
  EXPECT_EQ(std::string(s.data, s.size), "abc");
}

TEST(FrameOf, AnArrayKeepsItsBytes) {
  auto buf = std::shared_ptr<char[]>(new char[4]{'a', 'b', 'c', 'd'});
  Frame f = Frame::Of(buf, 4);
  buf.reset();
  EXPECT_EQ(std::string(f.data, f.size), "abcd");
  Frame c = Frame::Copy("xyz", 3);
  EXPECT_EQ(std::string(c.data, c.size), "xyz");
}

// StreamCopy (the shared-memory reader's and Message::CopyVals' copy of large
// messages) copies exactly like memcpy: every alignment of source and destination,
// sizes around its 16-byte head, 64-byte blocks and the memcpy cut-off, and not a
// byte outside the destination.
TEST(StreamCopy, CopiesEveryAlignmentAndSizeExactly) {
  std::vector<char> src(5000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 13 + 1);
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{255}, size_t{256}, size_t{257},
                   size_t{319}, size_t{320}, size_t{4096}, size_t{4096 + 63}})
    for (size_t sa = 0; sa < 16; ++sa)
      for (size_t da = 0; da < 16; ++da) {
        std::vector<char> dst(n + 64, '#');
        StreamCopy(dst.data() + 16 + da, src.data() + sa, n);
        ASSERT_EQ(0, std::memcmp(dst.data() + 16 + da, src.data() + sa, n))
            << n << " bytes, source +" << sa << ", destination +" << da;
        for (size_t i = 0; i < dst.size(); ++i) {
          if (i < 16 + da || i >= 16 + da + n) {
            ASSERT_EQ(dst[i], '#') << "byte " << i << " outside the destination was written";
          }
        }
      }
}

TEST(TransportRegistry, BackendsRegisterThemselves) {
  const std::vector<std::string> kinds = TransportKinds();
  for (const char* k : {"zmq", kNodeTransport})
    EXPECT_NE(std::find(kinds.begin(), kinds.end(), k), kinds.end()) << k;
  EXPECT_TRUE(std::is_sorted(kinds.begin(), kinds.end()));
}

TEST(TransportRegistry, AnUnknownKindIsAConfigErrorNamingTheValidOnes) {
  try {
    CreateTransport("carrier-pigeon", TransportConfig{});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("carrier-pigeon"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("zmq"), std::string::npos);
  }
}

TEST(TransportRegistry, AKindRegisteredTwiceIsRefused) {
  EXPECT_THROW(RegisterTransport("zmq", [](const TransportConfig&) { return nullptr; }),
               InternalError);
}

TEST(TransportRegistry, ANewKindIsCreatedByName) {
  static int created = 0;
  const auto kinds = TransportKinds();
  if (std::find(kinds.begin(), kinds.end(), "test-only") == kinds.end())
    RegisterTransport("test-only", [](const TransportConfig& c) {
      ++created;
      return CreateTransport("zmq", c);
    });
  const int before = created;
  TransportConfig c;
  c.token = 5;
  auto t = CreateTransport("test-only", c);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(created, before + 1);
  EXPECT_EQ(t->Name(), CreateTransport("zmq", c)->Name());
  t->Close(0ms);
}

TEST(DataPathRegistry, PathsRegisterThemselvesUnderTheirNames) {
  EXPECT_STREQ(upgrade::DataPathName(upgrade::PathKind::kRing), "shm");
  EXPECT_STREQ(upgrade::DataPathName(upgrade::PathKind::kTcp), "tcp");
  EXPECT_STREQ(upgrade::DataPathName(static_cast<upgrade::PathKind>(200)), "zmq");
  EXPECT_STREQ(upgrade::PathName(upgrade::PathKind::kRing), "shared memory");
  EXPECT_STREQ(upgrade::PathName(upgrade::PathKind::kTcp), "direct TCP");
  EXPECT_STREQ(upgrade::PathName(static_cast<upgrade::PathKind>(200)), "unknown path");
}

TEST(DataPathRegistry, AKindRegisteredTwiceIsRefused) {
  EXPECT_THROW(upgrade::RegisterDataPath(upgrade::PathKind::kTcp, "tcp2", "tcp two", 99,
                                         [](const upgrade::PathHost&) { return nullptr; }),
               InternalError);
}

// A transport that records what reaches it.
class Recorder final : public Transport {
 public:
  std::string Bind(const std::string&, int) override { return "x:1"; }
  void Connect(int, const std::string&, uint64_t) override {}
  void Disconnect(int) override {}
  void Send(int, std::vector<Frame> frames) override { sent.push_back(std::move(frames)); }
  bool Recv(Received*, std::chrono::milliseconds) override { return false; }
  void Close(std::chrono::milliseconds) override {}
  std::string Name() const override { return "recorder"; }
  std::vector<std::vector<Frame>> sent;
};

std::vector<Frame> Encoded(Control c) {
  Message m;
  m.h.control = static_cast<uint8_t>(c);
  return Encode(m);
}

TEST(FaultTransport, DisturbsOnlyWhatItsPredicateSelects) {
  auto rec = std::make_unique<Recorder>();
  Recorder* r = rec.get();
  FaultConfig fc;
  fc.drop = 1;  // every disturbable message is dropped
  fc.disturb = CoveredByResend;
  auto t = CreateFaultTransport(std::move(rec), fc);
  t->Send(1, Encoded(Control::kData));
  t->Send(1, Encoded(Control::kRegister));
  t->Send(1, {Frame::FromString("not a protocol message")});
  ASSERT_EQ(r->sent.size(), 2u);
  EXPECT_EQ(r->sent[1][0].size, 22u);
  t->Close(0ms);
}

TEST(FaultTransport, WithoutAPredicateNothingIsDisturbed) {
  auto rec = std::make_unique<Recorder>();
  Recorder* r = rec.get();
  FaultConfig fc;
  fc.drop = 1;
  auto t = CreateFaultTransport(std::move(rec), fc);
  t->Send(1, Encoded(Control::kData));
  EXPECT_EQ(r->sent.size(), 1u);
  t->Close(0ms);
}

TEST(CoveredByResend, DataBarriersAndAcksOnly) {
  EXPECT_TRUE(CoveredByResend(Encoded(Control::kData)));
  EXPECT_TRUE(CoveredByResend(Encoded(Control::kBarrier)));
  EXPECT_TRUE(CoveredByResend(Encoded(Control::kBarrierDone)));
  EXPECT_TRUE(CoveredByResend(Encoded(Control::kAck)));
  EXPECT_FALSE(CoveredByResend(Encoded(Control::kRegister)));
  EXPECT_FALSE(CoveredByResend(Encoded(Control::kHeartbeat)));
  EXPECT_FALSE(CoveredByResend({}));
  EXPECT_FALSE(CoveredByResend({Frame::FromString("short")}));
}

TEST(Net, LocalAddressesIncludeLoopbackAndTheDefault) {
  const auto addrs = LocalIPv4Addresses();
  EXPECT_TRUE(addrs.count("127.0.0.1"));
  EXPECT_TRUE(addrs.count(DefaultAddress()));
}

}  // namespace
