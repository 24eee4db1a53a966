// DataPathSuite: the contract of a data path (transport/upgrade/data_path.h), run
// over every path through the upgrading transport with only that path enabled.
// A new path (RDMA, CMA, GPU IPC) is done when it passes this suite and
// TransportSuite (test_transport.cc).
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "support/transport_util.h"
#include "transport/transport.h"
#include "transport/upgrade/upgrading_transport.h"

using namespace pskv;
using pskv::testing::RecvWithin;
using pskv::testing::Str;
using namespace std::chrono_literals;

namespace {

// A transport whose only data path is `path` ("shm" with a small ring, so that
// messages wrap and stream; "tcp"); `on` false: it declines that path.
std::unique_ptr<Transport> With(const std::string& path, uint64_t token, bool on = true) {
  TransportConfig c;
  c.secret = "s";
  c.job = 7;
  c.token = token;
  c.shm = path == "shm" && on ? TransportConfig::Shm::kAuto : TransportConfig::Shm::kOff;
  c.shm_ring_bytes = 64 << 10;
  c.tcp_direct = path == "tcp" && on;
  c.shm_attach_deadline = 1s;
  return CreateTransport(kNodeTransport, c);
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 31 + static_cast<size_t>(seed));
  return s;
}

class DataPathSuite : public ::testing::TestWithParam<std::string> {
 protected:
  // Sends numbered messages from b to a until b uses the path (bounded);
  // returns how many were sent, after checking each arrived in order.
  int UntilSwitched(Transport& a, Transport& b) {
    int sent = 0;
    for (int i = 0; i < 500 && DataPath(b, 1) != GetParam(); ++i) {
      b.Send(1, {Frame::FromString("m" + std::to_string(sent++))});
      Received in;
      EXPECT_TRUE(RecvWithin(a, &in, 5s));
      EXPECT_EQ(Str(in.frames.at(0)), "m" + std::to_string(sent - 1));
      std::this_thread::sleep_for(10ms);  // the path is set up meanwhile (bounded: 5 s)
    }
    return sent;
  }
};

INSTANTIATE_TEST_SUITE_P(Paths, DataPathSuite, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

TEST_P(DataPathSuite, TheSwitchKeepsTheOrderAndEverySizeArrives) {
  auto a = With(GetParam(), 11), b = With(GetParam(), 22);
  const std::string ep = a->Bind("127.0.0.1", 0);
  b->Bind("127.0.0.1", 0);
  b->Connect(1, ep, 11);
  int sent = UntilSwitched(*a, *b);
  ASSERT_EQ(DataPath(*b, 1), GetParam()) << "the path was never taken into use";
  const std::vector<size_t> sizes = {0, 1, 4096, (64 << 10) + 13, 3 << 20};
  for (size_t k = 0; k < sizes.size(); ++k)
    b->Send(1, {Frame::FromString("m" + std::to_string(sent++)),
                Frame::FromString(Pattern(sizes[k], static_cast<int>(k)))});
  for (int i = 0; i < 200; ++i) b->Send(1, {Frame::FromString("m" + std::to_string(sent++))});
  for (int expected = static_cast<int>(sent - sizes.size() - 200); expected < sent; ++expected) {
    Received in;
    ASSERT_TRUE(RecvWithin(*a, &in, 10s)) << "message " << expected;
    EXPECT_EQ(in.peer, 22u);
    ASSERT_EQ(Str(in.frames.at(0)), "m" + std::to_string(expected));
    if (in.frames.size() == 2) {
      const size_t k =
          static_cast<size_t>(expected - (sent - 200 - static_cast<int>(sizes.size())));
      ASSERT_LT(k, sizes.size());
      EXPECT_TRUE(Str(in.frames[1]) == Pattern(sizes[k], static_cast<int>(k)));
    }
  }
  a->Close(0ms);
  b->Close(0ms);
}

// Bytes and the "closed" mark of a path can be seen before the SWITCH, which
// travels over the control connection: a message written right before Close
// must still arrive.
TEST_P(DataPathSuite, AMessageWrittenRightBeforeCloseIsNotLost) {
  for (int round = 0; round < 5; ++round) {
    auto a = With(GetParam(), 11), b = With(GetParam(), 22);
    const std::string ea = a->Bind("127.0.0.1", 0);
    b->Bind("127.0.0.1", 0);
    b->Connect(1, ea, 11);
    UntilSwitched(*a, *b);
    ASSERT_EQ(DataPath(*b, 1), GetParam());
    b->Send(1, {Frame::FromString("last")});
    b->Close(1000ms);
    Received in;
    ASSERT_TRUE(RecvWithin(*a, &in, 5s)) << "round " << round;
    EXPECT_EQ(Str(in.frames.at(0)), "last");
    a->Close(0ms);
  }
}

// A receiver that declines the path: the sender stays on the control
// connection, and nothing of the negotiation reaches the receiver's caller.
TEST_P(DataPathSuite, ADecliningReceiverKeepsTheControlConnection) {
  auto a = With(GetParam(), 11, false), b = With(GetParam(), 22);
  const std::string ep = a->Bind("127.0.0.1", 0);
  b->Bind("127.0.0.1", 0);
  b->Connect(1, ep, 11);
  for (int i = 0; i < 50; ++i) {
    b->Send(1, {Frame::FromString("m" + std::to_string(i))});
    Received in;
    ASSERT_TRUE(RecvWithin(*a, &in, 5s));
    ASSERT_EQ(Str(in.frames.at(0)), "m" + std::to_string(i));
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_EQ(DataPath(*b, 1), "zmq");
  a->Close(0ms);
  b->Close(0ms);
}

// A receiver that goes away: the sender neither blocks nor hangs, and gives the
// path up (its control connection reports the peer down).
TEST_P(DataPathSuite, AReceiverThatGoesAwayDoesNotHangTheSender) {
  auto a = With(GetParam(), 11), b = With(GetParam(), 22);
  const std::string ep = a->Bind("127.0.0.1", 0);
  b->Bind("127.0.0.1", 0);
  b->Connect(1, ep, 11);
  UntilSwitched(*a, *b);
  ASSERT_EQ(DataPath(*b, 1), GetParam());
  a->Close(0ms);
  a.reset();
  const auto start = std::chrono::steady_clock::now();
  const std::string big(1 << 20, 'x');
  for (int i = 0; i < 64; ++i) b->Send(1, {Frame::FromString(big)});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "Send waited for a gone receiver";
  const auto close_start = std::chrono::steady_clock::now();
  b->Close(200ms);
  EXPECT_LT(std::chrono::steady_clock::now() - close_start, 5s);
}

}  // namespace
