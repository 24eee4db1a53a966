// HeldRequests (src/kvstore/distributed/server/held_requests.h): workers' requests a
// replicated server keeps for key ranges it does not lead yet, bounded per sender.
#include "kvstore/distributed/server/held_requests.h"

#include <gtest/gtest.h>

#include <vector>

#include "ps/node.h"

using namespace pskv;

namespace {

// A push of `bytes` value bytes (one key) from worker `rank`, numbered `ts`.
KVRequest Push(int rank, uint64_t ts, uint64_t bytes) {
  KVRequest r;
  r.sender = WorkerId(rank);
  r.timestamp = ts;
  r.push = true;
  r.msg.h.num_keys = 1;
  r.msg.h.vals_len = bytes;
  r.msg.keys = U64Frame({7});
  r.msg.lens = U64Frame({bytes});
  return r;
}

}  // namespace

TEST(HeldRequests, EachSenderIsBoundedAndTheRefusalSaysWhatToDo) {
  HeldRequests held(20000);
  const uint64_t each = HeldRequests::ChargeOf(Push(0, 0, 4096));
  EXPECT_EQ(each, 4096u + 16u);  // values, one key, one len
  int kept = 0, refused = 0;
  std::string why;
  for (uint64_t ts = 1; ts <= 10; ++ts) {
    std::string w = held.Hold(1, Push(0, ts, 4096), "server[0]");
    if (w.empty()) {
      ++kept;
    } else {
      ++refused;
      why = w;
    }
  }
  EXPECT_EQ(kept, 4);  // 4 x 4112 <= 20000 < 5 x 4112
  EXPECT_EQ(refused, 6);
  EXPECT_EQ(held.refused(), 6u);
  EXPECT_EQ(held.BytesOf(WorkerId(0)), 4 * each);
  EXPECT_NE(why.find("PSKV_HELD_REQUEST_BYTES=20000"), std::string::npos) << why;
  EXPECT_NE(why.find("server[0]"), std::string::npos) << why;
  // Another sender has a bound of its own.
  EXPECT_EQ(held.Hold(1, Push(1, 1, 4096), "server[0]"), "");
  EXPECT_EQ(held.Count(1), 5u);
}

TEST(HeldRequests, EveryRequestCountsAtLeastTheMinimumSoTheCountIsBoundedToo) {
  HeldRequests held(10 * HeldRequests::kMinCharge);
  int kept = 0;
  for (uint64_t ts = 1; ts <= 100; ++ts)  // pulls: no value bytes
    if (held.Hold(0, Push(0, ts, 0), "server[1]").empty()) ++kept;
  EXPECT_EQ(kept, 10);
}

TEST(HeldRequests, ReleaseGivesARangesRequestsInOrderAndFreesTheirBytes) {
  HeldRequests held(1 << 20);
  ASSERT_EQ(held.Hold(1, Push(0, 1, 100), "s"), "");
  ASSERT_EQ(held.Hold(2, Push(0, 2, 100), "s"), "");
  ASSERT_EQ(held.Hold(1, Push(1, 3, 100), "s"), "");
  ASSERT_EQ(held.Hold(1, Push(0, 4, 100), "s"), "");
  std::vector<KVRequest> one = held.Release(1);
  ASSERT_EQ(one.size(), 3u);
  EXPECT_EQ(one[0].timestamp, 1u);
  EXPECT_EQ(one[1].timestamp, 3u);
  EXPECT_EQ(one[2].timestamp, 4u);
  EXPECT_EQ(held.Count(1), 0u);
  EXPECT_EQ(held.BytesOf(WorkerId(1)), 0u);
  EXPECT_EQ(held.BytesOf(WorkerId(0)), HeldRequests::kMinCharge);  // range 2's
  EXPECT_TRUE(held.Release(1).empty());
  std::vector<KVRequest> all = held.TakeAll();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].timestamp, 2u);
  EXPECT_EQ(held.BytesOf(WorkerId(0)), 0u);
  // Released bytes can be held again.
  HeldRequests small(2 * HeldRequests::kMinCharge);
  ASSERT_EQ(small.Hold(0, Push(0, 1, 0), "s"), "");
  ASSERT_EQ(small.Hold(0, Push(0, 2, 0), "s"), "");
  EXPECT_NE(small.Hold(0, Push(0, 3, 0), "s"), "");
  small.Release(0);
  EXPECT_EQ(small.Hold(0, Push(0, 4, 0), "s"), "");
}
