// IncomingPaths (transport/upgrade/incoming_paths.h) against a scripted path: data
// that came ahead of its SWITCH waits for it for as long as the writer is not cut
// off, and is read once the SWITCH comes.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/rate_limit.h"
#include "transport/upgrade/control_codec.h"
#include "transport/upgrade/data_path.h"
#include "transport/upgrade/incoming_paths.h"

using namespace pskv;
using namespace pskv::upgrade;

namespace {

// What the test makes the one path say, and what the paths did to it.
struct Script {
  bool data = false;  // data waits (ahead of its SWITCH)
  bool active = false, closed = false;
  int reads = 0;
};

class ScriptedIn : public InPath {
 public:
  explicit ScriptedIn(Script* s) : s_(s) {}
  Status Activate(const char**) override {
    s_->active = true;
    return Status::kOk;
  }
  Status Check(Clock::time_point, const char**) override {
    return s_->data ? Status::kDataWaiting : Status::kOk;
  }
  Read Pump(std::vector<Frame>* frames, const char**) override {
    if (!s_->data) return Read::kNothing;
    s_->data = false;
    ++s_->reads;
    frames->assign(1, Frame::FromString("data"));
    return Read::kMessage;
  }
  bool Arm() override { return s_->data; }
  void Close() override { s_->closed = true; }

 private:
  Script* s_;
};

class ScriptedPath : public DataPath {
 public:
  explicit ScriptedPath(Script* s) : s_(s) {}
  PathKind kind() const override { return PathKind::kTcp; }
  bool Wants(const std::string&, uint64_t) const override { return false; }
  std::unique_ptr<OutPath> Offer(Nonce*, std::string*, std::string*) override { return nullptr; }
  std::unique_ptr<InPath> Accept(const upgrade::Offer&, const std::string&, std::string*) override {
    return std::make_unique<ScriptedIn>(s_);
  }

 private:
  Script* s_;
};

Received Control(const PathControl& c) {
  Received r;
  r.frames = {EncodeControl(c)};
  r.peer = 22;
  r.conn = 1;
  r.peer_addr = "127.0.0.1";
  return r;
}

TEST(IncomingPaths, DataAheadOfItsSwitchWaitsUntilTheWriterIsCutOff) {
  for (bool switch_comes : {true, false}) {
    Script s;
    std::vector<std::unique_ptr<DataPath>> kinds;
    kinds.push_back(std::make_unique<ScriptedPath>(&s));
    RateLimiter limiter;
    bool cut_off = false;
    IncomingPaths in(kinds, limiter, [&](uint64_t token) { return token == 22 && cut_off; });
    upgrade::Offer offer;
    offer.path = PathKind::kTcp;
    offer.seq = 1;
    offer.nonce[0] = 7;
    ASSERT_TRUE(in.HandleControl(Control(offer)));
    ASSERT_EQ(in.size(), 1u);
    s.data = true;
    Received got;
    for (int i = 0; i < 1000; ++i) ASSERT_FALSE(in.Pump(&got));  // however long: it waits
    EXPECT_EQ(in.size(), 1u);
    EXPECT_FALSE(s.closed) << "a path holding data was dropped while its writer is reachable";
    if (switch_comes) {
      ASSERT_TRUE(in.HandleControl(Control(Switch{offer.nonce})));
      EXPECT_TRUE(s.active);
      ASSERT_TRUE(in.Pump(&got));
      EXPECT_EQ(got.peer, 22u);
      EXPECT_EQ(std::string(got.frames.at(0).data, got.frames.at(0).size), "data");
    } else {
      cut_off = true;  // the SWITCH was lost with the connection: it never comes
      EXPECT_FALSE(in.Pump(&got));
      EXPECT_TRUE(s.closed);
      EXPECT_EQ(in.size(), 0u);
    }
  }
}

}  // namespace
