// The test disturbances around production code: the fault decorator's extra
// messages and its Close, and the disturbances a node's fail points ask for (FailPoints::Wire)
// (ps/test_disturbance.h), each against a recording transport.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "protocol/message.h"
#include "ps/test_disturbance.h"
#include "transport/fault/fault_transport.h"

using namespace pskv;
using namespace std::chrono_literals;

namespace {

class Recorder : public Transport {
 public:
  std::string Bind(const std::string&, int) override { return "x:1"; }
  void Connect(int, const std::string&, uint64_t) override {}
  void Disconnect(int) override {}
  void Send(int, std::vector<Frame> frames) override {
    std::lock_guard<std::mutex> lk(mu);
    sent.push_back(std::move(frames));
  }
  bool Recv(Received*, std::chrono::milliseconds) override { return false; }
  void Close(std::chrono::milliseconds) override {}
  std::string Name() const override { return "recorder"; }
  size_t count() {
    std::lock_guard<std::mutex> lk(mu);
    return sent.size();
  }
  std::mutex mu;
  std::vector<std::vector<Frame>> sent;
};

Header HeaderOf(const std::vector<Frame>& frames) {
  Header h;
  std::memcpy(&h, frames.at(0).data, sizeof h);
  return h;
}

std::vector<Frame> Encoded(Control c, uint8_t flags = 0, uint64_t seq = 0, uint64_t ts = 0) {
  Message m;
  m.h.control = static_cast<uint8_t>(c);
  m.h.flags = flags;
  m.h.seq = seq;
  m.h.timestamp = ts;
  m.body = "b";
  m.h.body_len = 1;
  return Encode(m);
}

TEST(FaultTransport, AlsoSendGoesFirst) {
  auto rec = std::make_unique<Recorder>();
  Recorder* r = rec.get();
  FaultConfig fc;
  fc.also_send = [](const std::vector<Frame>& f) -> std::optional<std::vector<Frame>> {
    if (f.size() != 1) return std::nullopt;
    return std::vector<Frame>{Frame::FromString("before " + std::string(f[0].data, f[0].size))};
  };
  auto t = CreateFaultTransport(std::move(rec), fc);
  t->Send(1, {Frame::FromString("x")});
  t->Send(1, {Frame::FromString("y"), Frame::FromString("z")});
  ASSERT_EQ(r->count(), 3u);
  EXPECT_EQ(std::string(r->sent[0][0].data, r->sent[0][0].size), "before x");
  EXPECT_EQ(std::string(r->sent[1][0].data, r->sent[1][0].size), "x");
  EXPECT_EQ(r->sent[2].size(), 2u);
  t->Close(0ms);
}

TEST(FaultTransport, CloseSendsWhatFallsDueWithinTheLinger) {
  for (auto [linger, expect] : {std::pair{0ms, size_t{0}}, std::pair{2000ms, size_t{1}}}) {
    auto rec = std::make_unique<Recorder>();
    Recorder* r = rec.get();
    FaultConfig fc;
    fc.delay = 1;
    fc.delay_time = 300ms;
    fc.disturb = [](const std::vector<Frame>&) { return true; };
    auto t = CreateFaultTransport(std::move(rec), fc);
    t->Send(1, {Frame::FromString("late")});
    EXPECT_EQ(r->count(), 0u);
    t->Close(linger);
    EXPECT_EQ(r->count(), expect) << "linger " << linger.count() << " ms";
  }
}

TEST(TestDisturbance, NoHooksNoWrapper) {
  auto rec = std::make_unique<Recorder>();
  Transport* raw = rec.get();
  EXPECT_EQ(DisturbForTests(std::move(rec), WireDisturbance{}).get(), raw);
}

// A duplicate reply is a message of its own: no resend number (the receiver would
// drop it as a repeat) and outside the window (it would credit one too many).
TEST(TestDisturbance, ADuplicateReplyIsAMessageOfItsOwn) {
  WireDisturbance h;
  h.duplicate_replies = true;
  const auto reply = Encoded(Control::kData, kPull | kScheduled, 9, 42);
  const auto extra = ExtraMessageForTests(h, reply);
  ASSERT_TRUE(extra.has_value());
  ASSERT_EQ(extra->size(), reply.size());
  const Header d = HeaderOf(*extra);
  EXPECT_EQ(d.seq, 0u);
  EXPECT_EQ(d.flags, kPull);
  EXPECT_EQ(d.timestamp, 42u);
  EXPECT_EQ(std::string((*extra)[1].data, (*extra)[1].size), "b");
  EXPECT_EQ(HeaderOf(reply).seq, 9u) << "the original is untouched";
  // Requests, commands, errors and control messages are not duplicated.
  EXPECT_FALSE(ExtraMessageForTests(h, Encoded(Control::kData, kRequest | kPush)));
  EXPECT_FALSE(ExtraMessageForTests(h, Encoded(Control::kData, kCommand)));
  EXPECT_FALSE(ExtraMessageForTests(h, Encoded(Control::kData, kError)));
  EXPECT_FALSE(ExtraMessageForTests(h, Encoded(Control::kCredit, 0, 0, 3)));
  EXPECT_FALSE(ExtraMessageForTests(WireDisturbance{}, reply));
}

TEST(TestDisturbance, ABogusCreditIsForFarMore) {
  WireDisturbance h;
  h.bogus_credits = true;
  const auto extra = ExtraMessageForTests(h, Encoded(Control::kCredit, 0, 5, 3));
  ASSERT_TRUE(extra.has_value());
  EXPECT_EQ(HeaderOf(*extra).timestamp, 3 + (uint64_t{1} << 40));
  EXPECT_EQ(HeaderOf(*extra).seq, 0u);
  EXPECT_FALSE(ExtraMessageForTests(h, Encoded(Control::kData, kPull)));
}

// Through the wrapper: the extra message goes first, the original follows unchanged.
TEST(TestDisturbance, TheWrapperSendsTheExtraFirst) {
  auto rec = std::make_unique<Recorder>();
  Recorder* r = rec.get();
  WireDisturbance h;
  h.bogus_credits = true;
  auto t = DisturbForTests(std::move(rec), h);
  t->Send(1, Encoded(Control::kCredit, 0, 0, 7));
  t->Send(1, Encoded(Control::kHeartbeat));
  ASSERT_EQ(r->count(), 3u);
  EXPECT_EQ(HeaderOf(r->sent[0]).timestamp, 7 + (uint64_t{1} << 40));
  EXPECT_EQ(HeaderOf(r->sent[1]).timestamp, 7u);
  EXPECT_EQ(HeaderOf(r->sent[2]).control, static_cast<uint8_t>(Control::kHeartbeat));
  t->Close(0ms);
}

}  // namespace
