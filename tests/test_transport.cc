// The transport contract (transport/transport.h), one suite run against every
// backend: zmq, and zmq wrapped by the fault transport with no faults. A new
// backend (shared memory, ...) is done when this suite passes for it.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "common/net.h"
#include "transport/fault/fault_transport.h"
#include "transport/transport.h"

using namespace pskv;
using namespace std::chrono_literals;

namespace {

TransportConfig Config(uint64_t token, const std::string& secret = "s") {
  TransportConfig c;
  c.secret = secret;
  c.job = 99;
  c.token = token;
  return c;
}

std::unique_ptr<Transport> Make(const std::string& kind, const TransportConfig& c) {
  if (kind == "fault(zmq)") return CreateFaultTransport(CreateTransport("zmq", c), FaultConfig{});
  return CreateTransport(kind, c);
}

// Receives one message within `limit` (bounded polling).
bool RecvWithin(Transport& t, Received* in, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end)
    if (t.Recv(in, 50ms)) return true;
  return false;
}

std::string Str(const Frame& f) {
  return std::string(f.data, f.size);
}

class TransportSuite : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Backends, TransportSuite, ::testing::Values("zmq", "fault(zmq)"),
                         [](const auto& info) {
                           return info.param == "zmq" ? std::string("zmq") : "fault_zmq";
                         });

TEST_P(TransportSuite, DeliversInOrderWithTheSendersProvenIdentity) {
  auto a = Make(GetParam(), Config(11)), b = Make(GetParam(), Config(22));
  const std::string ep = a->Bind("127.0.0.1", 0);
  b->Bind("127.0.0.1", 0);
  b->Connect(1, ep, 11);
  for (int i = 0; i < 200; ++i)
    b->Send(1, {Frame::FromString("m" + std::to_string(i)), Frame::FromString("x")});
  for (int i = 0; i < 200; ++i) {
    Received in;
    ASSERT_TRUE(RecvWithin(*a, &in, 5s)) << "message " << i;
    EXPECT_EQ(in.peer, 22u);  // the token b proved at the handshake
    ASSERT_EQ(in.frames.size(), 2u);
    EXPECT_EQ(Str(in.frames[0]), "m" + std::to_string(i));
  }
  // Up (the monitor learns of the handshake asynchronously: bounded wait).
  for (int i = 0; i < 100 && b->DownSince(1) != std::chrono::steady_clock::time_point{}; ++i)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(b->DownSince(1), std::chrono::steady_clock::time_point{});
  a->Close(0ms);
  b->Close(0ms);
}

TEST_P(TransportSuite, LargeFramesArriveIntact) {
  auto a = Make(GetParam(), Config(11)), b = Make(GetParam(), Config(22));
  const std::string ep = a->Bind("127.0.0.1", 0);
  b->Connect(1, ep, 11);
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  b->Send(1, {Frame::FromString("h"), Frame::FromString(big)});
  Received in;
  ASSERT_TRUE(RecvWithin(*a, &in, 10s));
  ASSERT_EQ(in.frames.size(), 2u);
  EXPECT_TRUE(Str(in.frames[1]) == big);
}

TEST_P(TransportSuite, AnotherSecretIsRefusedAndTheRefusalIsReported) {
  auto a = Make(GetParam(), Config(11, "right")), b = Make(GetParam(), Config(22, "wrong"));
  const std::string ep = a->Bind("127.0.0.1", 0);
  b->Connect(1, ep, 11);
  b->Send(1, {Frame::FromString("forged")});
  Received in;
  EXPECT_FALSE(RecvWithin(*a, &in, 1500ms)) << "a message passed a failed handshake";
  EXPECT_NE(b->RefusedBy(1).find("secret"), std::string::npos) << b->RefusedBy(1);
  EXPECT_NE(b->DownSince(1), std::chrono::steady_clock::time_point{});
}

TEST_P(TransportSuite, OversizedFrameIsNeverDelivered) {
  TransportConfig ca = Config(11);
  ca.max_frame = 1 << 20;
  auto a = Make(GetParam(), ca), b = Make(GetParam(), Config(22));
  const std::string ep = a->Bind("127.0.0.1", 0);
  b->Connect(1, ep, 11);
  b->Send(1, {Frame::FromString(std::string((1 << 20) + 1, 'x'))});
  Received in;
  EXPECT_FALSE(RecvWithin(*a, &in, 1000ms));
}

int OpenFds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

// Reconnecting a peer to new endpoints and disconnecting it, again and again,
// releases every socket of the old connections, their monitors included (each
// ZeroMQ socket holds a file descriptor), and a replaced connection's late events
// do not mark the new one down.
TEST_P(TransportSuite, ReconnectsAndDisconnectsReleaseEverything) {
  auto a = Make(GetParam(), Config(11)), c = Make(GetParam(), Config(33)),
       b = Make(GetParam(), Config(22));
  const std::string ea = a->Bind("127.0.0.1", 0), ec = c->Bind("127.0.0.1", 0);
  b->Connect(1, ea, 11);
  b->Send(1, {Frame::FromString("warm-up")});
  Received in;
  ASSERT_TRUE(RecvWithin(*a, &in, 5s));
  std::this_thread::sleep_for(300ms);
  const int before = OpenFds();
  for (int i = 0; i < 100; ++i) {
    b->Connect(1, i % 2 ? ea : ec, i % 2 ? 11 : 33);
    if (i % 10 == 9) b->Disconnect(1);
  }
  b->Connect(1, ea, 11);
  b->Send(1, {Frame::FromString("after")});
  ASSERT_TRUE(RecvWithin(*a, &in, 5s));
  EXPECT_EQ(Str(in.frames[0]), "after");
  // Bounded wait for the guard thread to close retired monitors and for
  // lingering sockets to go.
  int now = OpenFds();
  for (int i = 0; i < 60 && now > before + 8; ++i) {
    std::this_thread::sleep_for(50ms);
    now = OpenFds();
  }
  EXPECT_LE(now, before + 8) << "sockets of replaced connections were kept";
  for (int i = 0; i < 100 && b->DownSince(1) != std::chrono::steady_clock::time_point{}; ++i)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(b->DownSince(1), std::chrono::steady_clock::time_point{});
}

// A peer that stops answering (here: SIGSTOP, the kernel still holds its TCP
// connection open — as with a hung host) is reported down by the keep-alive,
// and up again when it answers again.
TEST_P(TransportSuite, KeepaliveReportsAPeerThatStoppedAnswering) {
  const int port = FreePort();
  pid_t child = ::fork();
  if (child == 0) {
    auto a = Make(GetParam(), Config(11));
    a->Bind("127.0.0.1", port);
    Received in;
    for (int i = 0; i < 600; ++i) a->Recv(&in, 100ms);  // bounded: 60 s
    _exit(0);
  }
  TransportConfig cb = Config(22);
  cb.keepalive_interval = 200ms;
  cb.keepalive_timeout = 600ms;
  auto b = Make(GetParam(), cb);
  b->Connect(1, "127.0.0.1:" + std::to_string(port), 11);
  const auto up = [&] { return b->DownSince(1) == std::chrono::steady_clock::time_point{}; };
  auto wait_for = [&](bool want, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (up() == want) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  };
  EXPECT_TRUE(wait_for(true, 5s)) << "never connected";
  ::kill(child, SIGSTOP);
  EXPECT_TRUE(wait_for(false, 5s)) << "a stopped peer was not noticed";
  ::kill(child, SIGCONT);
  EXPECT_TRUE(wait_for(true, 10s)) << "the connection did not come back";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

}  // namespace
