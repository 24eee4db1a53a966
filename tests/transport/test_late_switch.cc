// A SWITCH that ZeroMQ delivers late (a receiver flooded by strangers, or starved of
// CPU) while the path already holds data — here the writer's last messages, written
// right before it closed: the receiver waits for the SWITCH and loses nothing. Run
// over every data path (transport/upgrade/data_path.h, "Order").
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "support/transport_util.h"
#include "transport/fault/fault_transport.h"
#include "transport/transport.h"
#include "transport/upgrade/control_codec.h"
#include "transport/upgrade/upgrading_transport.h"

using namespace pskv;
using pskv::testing::RecvWithin;
using pskv::testing::Str;
using namespace std::chrono_literals;

namespace {

bool IsSwitch(const std::vector<Frame>& frames) {
  return upgrade::IsControl(frames) &&
         std::holds_alternative<upgrade::Switch>(upgrade::DecodeControl(frames[0]));
}

// An upgrading transport whose only data path is `path`; its control messages go
// through `wrap`.
std::unique_ptr<Transport> With(const std::string& path, uint64_t token,
                                const ControlWrapper& wrap = nullptr) {
  TransportConfig c;
  c.secret = "s";
  c.job = 7;
  c.token = token;
  c.shm = path == "shm" ? TransportConfig::Shm::kAuto : TransportConfig::Shm::kOff;
  c.shm_ring_bytes = 64 << 10;
  c.tcp_direct = path == "tcp";
  return CreateShmTransport(c, wrap);
}

class LateSwitch : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Paths, LateSwitch, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

TEST_P(LateSwitch, DataAheadOfASwitchLateBySecondsIsNotLost) {
  auto a = With(GetParam(), 11);
  // b's SWITCH arrives 6.5 s after it was sent: later than a receiver used to wait.
  FaultConfig fc;
  fc.delay = 1;
  fc.delay_time = 6500ms;
  fc.disturb = IsSwitch;
  auto b = With(GetParam(), 22, [&](std::unique_ptr<Transport> zmq) {
    return CreateFaultTransport(std::move(zmq), fc);
  });
  const std::string ea = a->Bind("127.0.0.1", 0);
  b->Bind("127.0.0.1", 0);
  b->Connect(1, ea, 11);
  // Over ZeroMQ until b switches (the message of the Send that switched goes into
  // the path, ahead of its SWITCH).
  int sent = 0;
  for (; sent < 500; ++sent) {
    b->Send(1, {Frame::FromString("m" + std::to_string(sent))});
    if (DataPath(*b, 1) == GetParam()) break;
    Received in;
    ASSERT_TRUE(RecvWithin(*a, &in, 5s));
    ASSERT_EQ(Str(in.frames.at(0)), "m" + std::to_string(sent));
    std::this_thread::sleep_for(10ms);  // the path is set up meanwhile
  }
  ASSERT_EQ(DataPath(*b, 1), GetParam()) << "the path was never taken into use";
  b->Send(1, {Frame::FromString("last")});
  // b closes its end of the path at once (the delayed SWITCH still goes out within
  // the linger): data and the "closed" mark wait at a for the SWITCH.
  std::thread closer([&] { b->Close(10s); });
  const auto start = std::chrono::steady_clock::now();
  Received in;
  const bool got = RecvWithin(*a, &in, 15s);
  EXPECT_TRUE(got) << "the message written ahead of the late SWITCH was lost";
  if (got) {
    EXPECT_EQ(Str(in.frames.at(0)), "m" + std::to_string(sent));
    EXPECT_GE(std::chrono::steady_clock::now() - start, 5s) << "it did not wait for the SWITCH";
    ASSERT_TRUE(RecvWithin(*a, &in, 5s));
    EXPECT_EQ(Str(in.frames.at(0)), "last");
  }
  closer.join();
  a->Close(0ms);
}

}  // namespace
