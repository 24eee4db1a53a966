// The scheduler's barrier bookkeeping (ps/scheduler.h, BarrierBook) alone: a barrier
// completes when every member arrived, once per member however often it arrives; a
// departure no longer counts and can complete a barrier the others wait at. The
// scheduler over real nodes is tested in test_ps.cc and test_departed.cc.
#include <gtest/gtest.h>

#include "protocol/message.h"
#include "ps/scheduler.h"

using namespace pskv;

TEST(BarrierBook, CompletesWhenEveryMemberArrived) {
  BarrierBook book;
  const int workers = 3;
  EXPECT_FALSE(book.Arrive(kWorkerGroup, WorkerId(0), workers));
  EXPECT_FALSE(book.Arrive(kWorkerGroup, WorkerId(1), workers));
  EXPECT_TRUE(book.HasArrived(kWorkerGroup, WorkerId(1)));
  EXPECT_FALSE(book.HasArrived(kWorkerGroup, WorkerId(2)));
  EXPECT_TRUE(book.Arrive(kWorkerGroup, WorkerId(2), workers));
  // Released: the next barrier of the group starts from no arrivals.
  book.Clear(kWorkerGroup);
  EXPECT_FALSE(book.HasArrived(kWorkerGroup, WorkerId(0)));
  EXPECT_FALSE(book.Arrive(kWorkerGroup, WorkerId(0), workers));
}

TEST(BarrierBook, ADuplicatedArrivalCountsOnce) {
  BarrierBook book;
  EXPECT_FALSE(book.Arrive(kServerGroup, ServerId(0), 2));
  EXPECT_FALSE(book.Arrive(kServerGroup, ServerId(0), 2));  // resent, or duplicated
  EXPECT_TRUE(book.Arrive(kServerGroup, ServerId(1), 2));
}

TEST(BarrierBook, GroupsAreCountedApart) {
  BarrierBook book;
  EXPECT_FALSE(book.Arrive(kWorkerGroup, WorkerId(0), 2));
  EXPECT_FALSE(book.Arrive(kAllGroup, WorkerId(1), 2));
  EXPECT_FALSE(book.HasArrived(kWorkerGroup, WorkerId(1)));
  EXPECT_TRUE(book.Arrive(kWorkerGroup, WorkerId(1), 2));
}

TEST(BarrierBook, ADepartureCompletesABarrier) {
  BarrierBook book;
  // Servers 0 and 1 wait at the server barrier; server 2 never comes, it died.
  EXPECT_FALSE(book.Arrive(kServerGroup, ServerId(0), 3));
  EXPECT_FALSE(book.Arrive(kServerGroup, ServerId(1), 3));
  EXPECT_FALSE(book.Arrive(kAllGroup, ServerId(2), 4));
  auto size = [](int servers) {
    return [servers](int group) { return group == kServerGroup ? servers : servers + 1; };
  };
  EXPECT_TRUE(book.Completed(size(3)).empty());
  book.Depart(ServerId(2));
  EXPECT_FALSE(book.HasArrived(kAllGroup, ServerId(2)));  // its arrival no longer counts
  // The group is one smaller now: the server barrier is complete; the barrier of all
  // nodes, where no one waits any more, is not listed.
  EXPECT_EQ(book.Completed(size(2)), std::vector<int>{kServerGroup});
}

TEST(BarrierBook, ADepartedWaiterLeavesTheOthersWaiting) {
  BarrierBook book;
  EXPECT_FALSE(book.Arrive(kWorkerGroup, WorkerId(0), 3));
  EXPECT_FALSE(book.Arrive(kWorkerGroup, WorkerId(1), 3));
  book.Depart(WorkerId(1));
  // One arrival of two members left: still waiting.
  EXPECT_TRUE(book.Completed([](int) { return 2; }).empty());
  EXPECT_TRUE(book.Arrive(kWorkerGroup, WorkerId(2), 2));
}

// What a scheduler that took over releases when a node proves the dead scheduler's
// release happened (scheduler_standby.cc): every distinct node counted at the old
// barrier, once, and none of another group.
TEST(BarrierBook, ArrivedListsEachArrivalOnce) {
  BarrierBook book;
  book.Arrive(kWorkerGroup, WorkerId(1), 3);
  book.Arrive(kWorkerGroup, WorkerId(0), 3);
  book.Arrive(kWorkerGroup, WorkerId(1), 3);  // resent after the takeover
  book.Arrive(kServerGroup, ServerId(0), 2);
  EXPECT_EQ(book.Arrived(kWorkerGroup), (std::vector<int>{WorkerId(0), WorkerId(1)}));
  EXPECT_TRUE(book.Arrived(kAllGroup).empty());
  book.Clear(kWorkerGroup);
  EXPECT_TRUE(book.Arrived(kWorkerGroup).empty());
}
