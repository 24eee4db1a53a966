// SyncRound alone: completion, rank-order and arrival-order merging, refusals,
// failure (the round number stays), finished workers, stall-report back-off.
#include "kvstore/distributed/server/rounds.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace pskv {
namespace {

using namespace std::chrono_literals;
using Round = SyncRound<int>;  // a push is its payload: here, the pushing rank
using Clock = Round::Clock;

std::string Name(int id) {
  return "worker[" + std::to_string(RankOfId(id)) + "]";
}

// Pushes of ranks `ranks`, in that order; returns what Merge added, as (rank, first).
std::vector<std::pair<int, bool>> PushAll(Round& r, const std::vector<int>& ranks, SumOrder order,
                                          int workers) {
  std::vector<std::pair<int, bool>> merged;
  for (int rank : ranks) {
    r.Join(WorkerId(rank), rank, Clock::now());
    r.Merge(order, workers, [&](int push, bool first) { merged.emplace_back(push, first); });
  }
  return merged;
}

TEST(SyncRounds, CompletesWhenEveryWorkerPushedAndAdvances) {
  Round r;
  EXPECT_FALSE(r.open());
  EXPECT_EQ(r.round(), 1);
  PushAll(r, {1, 0}, SumOrder::kRank, 3);
  EXPECT_TRUE(r.open());
  EXPECT_FALSE(r.complete(3));
  EXPECT_TRUE(r.pushed(WorkerId(0)));
  EXPECT_FALSE(r.pushed(WorkerId(2)));
  PushAll(r, {2}, SumOrder::kRank, 3);
  ASSERT_TRUE(r.complete(3));
  auto pushes = r.Take();
  ASSERT_EQ(pushes.size(), 3u);  // arrival order
  EXPECT_EQ(pushes[0].push, 1);
  EXPECT_EQ(pushes[1].push, 0);
  EXPECT_EQ(pushes[2].push, 2);
  EXPECT_EQ(pushes[0].sender, WorkerId(1));
  EXPECT_FALSE(r.open());
  EXPECT_EQ(r.round(), 1);  // not applied yet
  r.Advance();
  EXPECT_EQ(r.round(), 2);
}

TEST(SyncRounds, RankOrderAddsAPushOnceAllLowerRanksAreIn) {
  Round r;
  // Arrivals 2, 0, 3, 1: 0 is added at once; 1 then releases 2 and 3.
  std::vector<std::pair<int, bool>> merged;
  auto push = [&](int rank) {
    r.Join(WorkerId(rank), rank, Clock::now());
    r.Merge(SumOrder::kRank, 4, [&](int p, bool first) { merged.emplace_back(p, first); });
  };
  push(2);
  EXPECT_TRUE(merged.empty());
  push(0);
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0], std::make_pair(0, true));
  push(3);
  EXPECT_EQ(merged.size(), 1u);
  push(1);
  const std::vector<std::pair<int, bool>> want{{0, true}, {1, false}, {2, false}, {3, false}};
  EXPECT_EQ(merged, want);
  EXPECT_TRUE(r.complete(4));
}

TEST(SyncRounds, ArrivalOrderAddsEachPushAsItComes) {
  Round r;
  const auto merged = PushAll(r, {2, 0, 1}, SumOrder::kArrival, 3);
  const std::vector<std::pair<int, bool>> want{{2, true}, {0, false}, {1, false}};
  EXPECT_EQ(merged, want);
}

TEST(SyncRounds, AFailedRoundKeepsItsNumberAndStartsTheSumOver) {
  Round r;
  PushAll(r, {0, 1}, SumOrder::kRank, 3);
  auto failed = r.Take();  // e.g. the update threw: answer these with the error
  EXPECT_EQ(failed.size(), 2u);
  EXPECT_FALSE(r.open());
  EXPECT_EQ(r.round(), 1);
  // The next attempt merges from rank 0 again, "first" included.
  const auto merged = PushAll(r, {0}, SumOrder::kRank, 3);
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0], std::make_pair(0, true));
}

TEST(SyncRounds, RefusesASecondPushAndARoundAFinishedWorkerCannotComplete) {
  Round r;
  const std::set<int> none;
  EXPECT_EQ(r.Refusal(WorkerId(0), none, "key 7", Name), "");
  PushAll(r, {0}, SumOrder::kRank, 3);
  const std::string twice = r.Refusal(WorkerId(0), none, "key 7", Name);
  EXPECT_EQ(twice, "worker[0] pushed key 7 twice in one sync round (round 1)");
  // worker[2] finished without pushing: worker[1]'s push is refused, naming it.
  const std::string done = r.Refusal(WorkerId(1), {WorkerId(2)}, "key 7", Name);
  EXPECT_NE(done.find("key 7: worker[2] finished the job without pushing round 1"),
            std::string::npos)
      << done;
  // A finished worker that pushed this round does not block it.
  EXPECT_EQ(r.Refusal(WorkerId(1), {WorkerId(0)}, "key 7", Name), "");
}

TEST(SyncRounds, NeedsPushFromNamesTheRoundsAFinishingWorkerBreaks) {
  Round r;
  EXPECT_FALSE(r.NeedsPushFrom(WorkerId(1)));  // no open round
  PushAll(r, {0}, SumOrder::kRank, 2);
  EXPECT_TRUE(r.NeedsPushFrom(WorkerId(1)));
  EXPECT_FALSE(r.NeedsPushFrom(WorkerId(0)));
}

TEST(SyncRounds, StallReportsBackOffAndStartOverWithTheNextRound) {
  Round r;
  const auto t0 = Clock::now();
  EXPECT_FALSE(r.ReportDue(t0 + 1h, 100ms));  // no open round
  r.Join(WorkerId(0), 0, t0);
  EXPECT_EQ(r.opened(), t0);
  EXPECT_FALSE(r.ReportDue(t0 + 99ms, 100ms));
  EXPECT_TRUE(r.ReportDue(t0 + 100ms, 100ms));
  EXPECT_FALSE(r.ReportDue(t0 + 150ms, 100ms));
  EXPECT_TRUE(r.ReportDue(t0 + 200ms, 100ms));
  EXPECT_FALSE(r.ReportDue(t0 + 399ms, 100ms));
  EXPECT_TRUE(r.ReportDue(t0 + 400ms, 100ms));
  r.Take();
  r.Advance();
  const auto t1 = t0 + 1s;
  r.Join(WorkerId(0), 0, t1);
  EXPECT_TRUE(r.ReportDue(t1 + 100ms, 100ms));  // from the first interval again
}

TEST(SyncRounds, RankOrderSortsATakenRound) {
  Round r;
  PushAll(r, {2, 0, 1}, SumOrder::kArrival, 3);
  const auto pushes = r.Take();
  const auto sorted = Round::RankOrder(pushes);
  ASSERT_EQ(sorted.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*sorted[static_cast<size_t>(i)], i);
}

TEST(SyncRounds, RecycleGivesTheSpentCapacityToTheNextRound) {
  Round r;
  PushAll(r, {0, 1, 2, 3}, SumOrder::kRank, 4);
  auto spent = r.Take();
  const size_t cap = spent.capacity();
  r.Recycle(std::move(spent));
  PushAll(r, {0}, SumOrder::kRank, 4);
  EXPECT_GE(r.pushes().capacity(), cap);
}

}  // namespace
}  // namespace pskv

namespace pskv {
namespace {

// Elastic workers: rank order passes over a rank that left without pushing (once the
// caller says so), and the first push summed starts the sum even when rank 0 left.
TEST(SyncRounds, RankOrderSkipsRanksThatLeft) {
  SyncRound<int> r;
  std::vector<std::pair<int, bool>> merged;
  std::set<int> left;
  auto merge = [&](int push, bool first) { merged.emplace_back(push, first); };
  auto skip = [&](int rank) { return left.count(rank) > 0; };
  r.Join(WorkerId(2), 2, SyncRound<int>::Clock::now());
  r.Merge(SumOrder::kRank, 3, merge, skip);
  r.Join(WorkerId(1), 1, SyncRound<int>::Clock::now());
  r.Merge(SumOrder::kRank, 3, merge, skip);
  EXPECT_TRUE(merged.empty());  // waits for rank 0
  left.insert(0);               // rank 0 left the job without pushing
  r.Merge(SumOrder::kRank, 3, merge, skip);
  EXPECT_EQ(merged, (std::vector<std::pair<int, bool>>{{1, true}, {2, false}}));
  // A rank that left after pushing is summed at its place.
  auto spent = r.Take();
  r.Advance();
  merged.clear();
  left = {};
  r.Join(WorkerId(1), 1, SyncRound<int>::Clock::now());
  r.Merge(SumOrder::kRank, 3, merge, skip);
  r.Join(WorkerId(0), 0, SyncRound<int>::Clock::now());
  left.insert(1);
  r.Merge(SumOrder::kRank, 3, merge, skip);
  EXPECT_EQ(merged, (std::vector<std::pair<int, bool>>{{0, true}, {1, false}}));
}

}  // namespace
}  // namespace pskv
