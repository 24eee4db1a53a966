// SendSchedule alone: the window, the priority order and the credit rules that the
// node's big data messages follow (ps/send_schedule.h).
#include "ps/send_schedule.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace pskv {
namespace {

constexpr uint64_t kBig = SendSchedule::kMinBytes;

Message Msg(uint64_t bytes, int priority, int tag) {
  Message m;
  m.h.vals_len = bytes;
  m.h.priority = priority;
  m.h.head = tag;
  return m;
}

// Queues (tag, bytes, priority) for peer 1 and pumps; returns the tags sent.
std::vector<int> Push(SendSchedule& s, int tag, uint64_t bytes, int priority = 0) {
  Message m = Msg(bytes, priority, tag);
  EXPECT_TRUE(s.Enqueue(1, m));
  std::vector<int> sent;
  s.Pump(1, [&](Message& q) { sent.push_back(q.h.head); });
  return sent;
}

TEST(SendSchedule, OnlyBigMessagesWithAWindowAreScheduled) {
  EXPECT_TRUE(SendSchedule(kBig).Schedules(kBig));
  EXPECT_FALSE(SendSchedule(kBig).Schedules(kBig - 1));
  EXPECT_FALSE(SendSchedule(0).Schedules(kBig * 100));
  EXPECT_FALSE(SendSchedule(-1).Schedules(kBig * 100));
}

TEST(SendSchedule, TheWindowHoldsMessagesUntilCredited) {
  SendSchedule s(2 * kBig);
  EXPECT_EQ(Push(s, 1, kBig), std::vector<int>{1});
  EXPECT_EQ(Push(s, 2, kBig), std::vector<int>{2});
  EXPECT_TRUE(Push(s, 3, kBig).empty());  // the window is full
  EXPECT_EQ(s.InFlight(1), 2 * kBig);
  EXPECT_EQ(s.Queued(1), 1u);
  ASSERT_TRUE(s.Credit(1, 1));
  EXPECT_EQ(s.InFlight(1), kBig);
  std::vector<int> sent;
  s.Pump(1, [&](Message& q) { sent.push_back(q.h.head); });
  EXPECT_EQ(sent, std::vector<int>{3});
  EXPECT_EQ(s.InFlight(1), 2 * kBig);
}

TEST(SendSchedule, OneMessageBiggerThanTheWindowStillGoes) {
  SendSchedule s(kBig);
  EXPECT_EQ(Push(s, 1, 10 * kBig), std::vector<int>{1});
  EXPECT_TRUE(Push(s, 2, kBig).empty());
  ASSERT_TRUE(s.Credit(1, 1));
  std::vector<int> sent;
  s.Pump(1, [&](Message& q) { sent.push_back(q.h.head); });
  EXPECT_EQ(sent, std::vector<int>{2});
}

TEST(SendSchedule, HigherPriorityFirstThenInOrderQueued) {
  SendSchedule s(kBig);
  EXPECT_EQ(Push(s, 1, kBig), std::vector<int>{1});  // fills the window
  for (auto [tag, prio] : {std::pair{2, 0}, {3, 5}, {4, 0}, {5, 5}, {6, -1}})
    EXPECT_TRUE(Push(s, tag, kBig, prio).empty());
  std::vector<int> order;
  for (uint64_t credit = 1; credit <= 6; ++credit) {
    ASSERT_TRUE(s.Credit(1, credit));
    s.Pump(1, [&](Message& q) { order.push_back(q.h.head); });
  }
  EXPECT_EQ(order, (std::vector<int>{3, 5, 2, 4, 6}));
}

TEST(SendSchedule, CreditsAreCumulativeAndNeverForMoreThanWasSent) {
  SendSchedule s(4 * kBig);
  for (int i = 0; i < 3; ++i) Push(s, i, kBig);
  EXPECT_FALSE(s.Credit(1, 4)) << "more than were sent";
  EXPECT_FALSE(s.Credit(2, 1)) << "a peer nothing was sent to";
  EXPECT_EQ(s.InFlight(1), 3 * kBig);
  ASSERT_TRUE(s.Credit(1, 2));
  EXPECT_EQ(s.InFlight(1), kBig);
  ASSERT_TRUE(s.Credit(1, 1)) << "stale: valid, changes nothing";
  ASSERT_TRUE(s.Credit(1, 2)) << "repeated: valid, changes nothing";
  EXPECT_EQ(s.InFlight(1), kBig);
  ASSERT_TRUE(s.Credit(1, 3));
  EXPECT_EQ(s.InFlight(1), 0u);
}

TEST(SendSchedule, AFailedSendHoldsNoWindowCredit) {
  SendSchedule s(kBig);
  Message m = Msg(kBig, 0, 1);
  ASSERT_TRUE(s.Enqueue(1, m));
  EXPECT_THROW(s.Pump(1, [](Message&) { throw std::runtime_error("peer gone"); }),
               std::runtime_error);
  EXPECT_EQ(s.InFlight(1), 0u);
  EXPECT_EQ(s.Queued(1), 0u);
  EXPECT_EQ(Push(s, 2, kBig), std::vector<int>{2});
}

TEST(SendSchedule, AFullQueueHandsTheMessageBackAndCountsItWhenSent) {
  SendSchedule s(kBig);
  Push(s, 0, kBig);  // in flight: the rest waits
  for (size_t i = 0; i < SendSchedule::kMaxQueued; ++i) {
    Message m = Msg(kBig, 0, 1);
    ASSERT_TRUE(s.Enqueue(1, m));
  }
  Message extra = Msg(kBig, 0, 99);
  EXPECT_FALSE(s.Enqueue(1, extra));
  EXPECT_EQ(extra.h.head, 99) << "a refused message stays with the caller";
  s.Sent(1, extra.h.vals_len);
  EXPECT_EQ(s.InFlight(1), 2 * kBig);
  EXPECT_TRUE(s.Credit(1, 2));
}

TEST(SendSchedule, ReceivedCountsPerSenderAndForgetStartsOver) {
  SendSchedule s(kBig);
  EXPECT_EQ(s.Received(3), 1u);
  EXPECT_EQ(s.Received(3), 2u);
  EXPECT_EQ(s.Received(4), 1u);
  Push(s, 1, kBig);
  Push(s, 2, kBig);
  s.Forget(1);
  s.Forget(3);
  EXPECT_EQ(s.InFlight(1), 0u);
  EXPECT_EQ(s.Queued(1), 0u);
  EXPECT_EQ(s.Received(3), 1u);
  EXPECT_EQ(s.Received(4), 2u);
}

TEST(SendSchedule, DroppedQueuesSendNothing) {
  SendSchedule s(kBig);
  Push(s, 1, kBig);
  Push(s, 2, kBig);
  s.DropQueues();
  int sent = 0;
  s.Pump(1, [&](Message&) { ++sent; });
  EXPECT_EQ(sent, 0);
}

}  // namespace
}  // namespace pskv
