// Liveness and Resender alone (src/ps/liveness.h, src/ps/resender.h): every time is
// passed in, and a fake transport reports connection state, so no test waits for a
// timeout to pass.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "protocol/message.h"
#include "ps/liveness.h"
#include "ps/resender.h"

namespace pskv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A transport that only answers DownSince, from a table the test sets.
class FakeTransport : public Transport {
 public:
  std::map<int, Clock::time_point> down;
  std::string Bind(const std::string&, int) override { return {}; }
  void Connect(int, const std::string&, uint64_t) override {}
  void Disconnect(int) override {}
  void Send(int, std::vector<Frame>) override {}
  bool Recv(Received*, std::chrono::milliseconds) override { return false; }
  std::map<int, Clock::time_point> gone;
  Clock::time_point DownSince(int peer) override {
    auto it = down.find(peer);
    return it == down.end() ? Clock::time_point{} : it->second;
  }
  Clock::time_point GoneSince(int peer) override {
    auto it = gone.find(peer);
    return it == gone.end() ? Clock::time_point{} : it->second;
  }
  void Close(std::chrono::milliseconds) override {}
  std::string Name() const override { return "fake"; }
};

std::string Name(int id) {
  return "node " + std::to_string(id);
}

constexpr auto kInterval = 100ms;
constexpr auto kTimeout = 1000ms;

TEST(LivenessAlone, ASilentPeerIsDeadAfterTheTimeoutOfListening) {
  FakeTransport t;
  Liveness l(kInterval, kTimeout);
  const int peer = WorkerId(0);
  const auto before = Clock::now();
  l.Start({peer}, {});
  const auto after = Clock::now();
  EXPECT_EQ(l.Check(before + kTimeout - 10ms, t, Name).first, 0);
  auto [id, why] = l.Check(after + kTimeout + 10ms, t, Name);
  EXPECT_EQ(id, peer);
  EXPECT_NE(why.find("node " + std::to_string(peer) + " is dead: nothing heard from it"),
            std::string::npos)
      << why;
}

TEST(LivenessAlone, HearingFromAPeerRestartsItsSilence) {
  FakeTransport t;
  Liveness l(kInterval, kTimeout);
  const int a = WorkerId(0), b = WorkerId(1);  // a < b: Check looks at a first
  l.Start({a, b}, {});
  const auto started = Clock::now();
  std::this_thread::sleep_for(50ms);  // a's message comes later than the start
  l.Heard(a);
  l.Heard(ServerId(0));  // not watched: ignored
  // b has been silent for the timeout, a has not.
  EXPECT_EQ(l.Check(started + kTimeout + 10ms, t, Name).first, b);
}

TEST(LivenessAlone, TimeSpentDeafIsNotThePeersSilence) {
  FakeTransport t;
  Liveness l(kInterval, kTimeout);
  const int peer = WorkerId(0);
  l.Start({peer}, {});
  const auto t0 = Clock::now();
  l.Deaf(t0);  // a long handler: the receive thread does not listen
  EXPECT_EQ(l.Check(t0 + 10 * kTimeout, t, Name).first, 0) << "deaf time counted as silence";
  l.Listening(t0 + 10 * kTimeout);
  EXPECT_EQ(l.Check(t0 + 10 * kTimeout + kTimeout / 2, t, Name).first, 0);
  EXPECT_EQ(l.Check(t0 + 10 * kTimeout + 2 * kTimeout, t, Name).first, peer);
}

TEST(LivenessAlone, StarvationIsNotSilenceAndIsNotCountedTwice) {
  FakeTransport t;
  Liveness starved(kInterval, kTimeout);
  const int peer = WorkerId(0);
  starved.Start({peer}, {});
  const auto t0 = Clock::now();
  starved.Starved(t0 + 5 * kTimeout, 5 * kTimeout);  // the process was not scheduled
  EXPECT_EQ(starved.Check(t0 + 5 * kTimeout + kTimeout / 2, t, Name).first, 0);

  // Deaf and starved at once: 2 timeouts of lost time, not 4.
  Liveness both(kInterval, kTimeout);
  both.Start({peer}, {});
  const auto t1 = Clock::now();
  both.Deaf(t1);
  both.Starved(t1 + 2 * kTimeout, 2 * kTimeout);
  both.Listening(t1 + 2 * kTimeout);
  EXPECT_EQ(both.Check(t1 + 2 * kTimeout + kTimeout * 3 / 2, t, Name).first, peer);
}

TEST(LivenessAlone, ALostConnectionCountsAfterTimeoutPlusInterval) {
  FakeTransport t;
  Liveness l(kInterval, kTimeout);
  const int peer = ServerId(0);
  l.Start({}, {peer});
  const auto down = Clock::now();
  EXPECT_EQ(l.Check(down + 10 * kTimeout, t, Name).first, 0);  // connected
  t.down[peer] = down;
  EXPECT_EQ(l.Check(down + kTimeout + kInterval - 1ms, t, Name).first, 0);
  auto [id, why] = l.Check(down + kTimeout + kInterval + 1ms, t, Name);
  EXPECT_EQ(id, peer);
  EXPECT_NE(why.find("cannot reach node " + std::to_string(peer) + ": no connection for"),
            std::string::npos)
      << why;
}

// A peer whose port refused a new connection after its connection closed is dead at
// once where Start trusts that (the scheduler); elsewhere it is a lost connection.
TEST(LivenessAlone, AGonePeerIsDeadAtOnceWhereTrusted) {
  FakeTransport t;
  const int peer = ServerId(1);
  const auto now = Clock::now();
  t.down[peer] = now;
  t.gone[peer] = now;
  Liveness sched(kInterval, kTimeout);
  sched.Start({peer}, {peer}, /*trust_gone=*/true);
  auto [id, why] = sched.Check(now, t, Name);
  EXPECT_EQ(id, peer);
  EXPECT_NE(why.find("node " + std::to_string(peer) +
                     " is dead: its connection closed and a new one was refused"),
            std::string::npos)
      << why;
  Liveness node(kInterval, kTimeout);
  node.Start({}, {peer});
  EXPECT_EQ(node.Check(now + kTimeout, t, Name).first, 0);
  EXPECT_EQ(node.Check(now + kTimeout + kInterval + 1ms, t, Name).first, peer);
  sched.Forget(peer);
  EXPECT_EQ(sched.Check(now, t, Name).first, 0);
}

TEST(LivenessAlone, OffWithoutATimeoutAndAfterStop) {
  FakeTransport t;
  const int peer = WorkerId(0);
  Liveness off(kInterval, 0ms);
  off.Start({peer}, {});
  EXPECT_EQ(off.Check(Clock::now() + 1h, t, Name).first, 0);
  Liveness stopped(kInterval, kTimeout);
  stopped.Start({peer}, {});
  stopped.Stop();
  EXPECT_EQ(stopped.Check(Clock::now() + 1h, t, Name).first, 0);
}

std::vector<Frame> Bytes(std::vector<char>& buf) {
  Frame f;
  f.data = buf.data();
  f.size = buf.size();
  return {f};
}

TEST(ResenderAlone, SequenceNumbersArePerPeerFromOne) {
  Resender r(100ms, 1s);
  EXPECT_EQ(r.NextSeq(1), 1u);
  EXPECT_EQ(r.NextSeq(1), 2u);
  EXPECT_EQ(r.NextSeq(2), 1u);
}

TEST(ResenderAlone, KeepsAPrivateCopyUntilAcknowledged) {
  Resender r(100ms, 1s);
  std::vector<char> buf(16, 'a');
  const auto before = Clock::now();
  r.Track(5, 1, Bytes(buf));
  const auto after = Clock::now();
  std::memset(buf.data(), 'b', buf.size());  // the caller reuses its array
  EXPECT_EQ(r.Pending(), 1u);
  EXPECT_TRUE(r.Due(before + 100ms - 1ms).empty());
  auto due = r.Due(after + 100ms + 1ms);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].first, 5);
  ASSERT_EQ(due[0].second.size(), 1u);
  EXPECT_EQ(std::string(due[0].second[0].data, due[0].second[0].size), std::string(16, 'a'));
  EXPECT_FALSE(r.WaitAllAcked(1ms));
  r.Ack(5, 2);  // not a tracked message: ignored
  EXPECT_EQ(r.Pending(), 1u);
  r.Ack(5, 1);
  EXPECT_EQ(r.Pending(), 0u);
  EXPECT_TRUE(r.WaitAllAcked(0ms));
}

TEST(ResenderAlone, RetransmissionsBackOffUpToTheCap) {
  Resender r(100ms, 300ms);
  std::vector<char> buf(8, 'x');
  r.Track(1, 1, Bytes(buf));
  auto t = Clock::now() + 100ms + 1ms;
  ASSERT_EQ(r.Due(t).size(), 1u);  // first resend; next after 200 ms
  EXPECT_TRUE(r.Due(t + 199ms).empty());
  t += 200ms;
  ASSERT_EQ(r.Due(t).size(), 1u);  // next after 400 ms, capped to 300 ms
  EXPECT_TRUE(r.Due(t + 299ms).empty());
  EXPECT_EQ(r.Due(t + 300ms).size(), 1u);
}

TEST(ResenderAlone, ABigQueuedMessageIsNotResentBeforeItCanHaveLeft) {
  Resender r(100ms, 10s);
  std::vector<char> big(50'000'000), small(8);  // 0.5 s at the 100 MB/s floor
  r.Track(1, 1, Bytes(big));
  r.Track(1, 2, Bytes(small));  // queued behind it: also 0.5 s later
  const auto t = Clock::now();
  EXPECT_TRUE(r.Due(t + 100ms + 400ms).empty());
  EXPECT_EQ(r.Due(t + 100ms + 600ms).size(), 2u);
}

TEST(ResenderAlone, ForgetDropsWhatWasKeptForADeadPeer) {
  Resender r(100ms, 1s);
  std::vector<char> buf(8);
  r.Track(1, 1, Bytes(buf));
  r.Track(2, 1, Bytes(buf));
  r.Forget(1);
  EXPECT_EQ(r.Pending(), 1u);
  auto due = r.Due(Clock::now() + 1h);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].first, 2);
  r.Forget(2);
  EXPECT_TRUE(r.WaitAllAcked(0ms));
}

TEST(ResenderAlone, ArrivalsAreDeliveredInSequenceOrder) {
  Resender r(100ms, 1s);
  using A = Resender::Arrival;
  EXPECT_EQ(r.Accept(7, 1), A::kNext);
  EXPECT_EQ(r.Accept(7, 3), A::kHold);  // 2 was lost
  EXPECT_EQ(r.Accept(7, 4), A::kHold);
  EXPECT_EQ(r.Accept(7, 3), A::kDuplicate);
  EXPECT_EQ(r.Accept(7, 1), A::kDuplicate);
  EXPECT_EQ(r.TakeNext(7), 0u);  // the gap is still open
  EXPECT_EQ(r.Accept(7, 2), A::kNext);
  EXPECT_EQ(r.TakeNext(7), 3u);
  EXPECT_EQ(r.TakeNext(7), 4u);
  EXPECT_EQ(r.TakeNext(7), 0u);
  EXPECT_EQ(r.Accept(7, 4), A::kDuplicate);
  EXPECT_EQ(r.Accept(8, 1), A::kNext);  // senders are independent
}

TEST(ResenderAlone, HoldsAtMostkMaxHeldPerSender) {
  Resender r(100ms, 1s);
  using A = Resender::Arrival;
  for (uint64_t s = 2; s < 2 + Resender::kMaxHeld; ++s) ASSERT_EQ(r.Accept(1, s), A::kHold) << s;
  const uint64_t over = 2 + Resender::kMaxHeld;
  EXPECT_EQ(r.Accept(1, over), A::kFull);
  EXPECT_EQ(r.Accept(1, over), A::kFull);  // not recorded: it will be resent
  EXPECT_EQ(r.Accept(1, 1), A::kNext);
  for (uint64_t s = 2; s < over; ++s) ASSERT_EQ(r.TakeNext(1), s);
  EXPECT_EQ(r.Accept(1, over), A::kNext);
}

}  // namespace
}  // namespace pskv
