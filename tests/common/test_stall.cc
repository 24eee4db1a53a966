// The wait/stall-report policy (common/stall.h), on a fake clock.
#include "common/stall.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <vector>

namespace pskv {
namespace {

using namespace std::chrono_literals;
using TP = StallSchedule::Clock::time_point;

TP At(std::chrono::milliseconds ms) {
  return TP{} + ms;
}

TEST(StallSchedule, ReportsAfterTheFirstIntervalThenEachTimeTheWaitDoubles) {
  StallSchedule s(At(1000ms), 100ms);
  EXPECT_FALSE(s.Due(At(1099ms)));
  EXPECT_TRUE(s.Due(At(1100ms)));
  EXPECT_FALSE(s.Due(At(1100ms)));  // once per point
  EXPECT_FALSE(s.Due(At(1199ms)));
  EXPECT_TRUE(s.Due(At(1200ms)));  // waited 200
  EXPECT_FALSE(s.Due(At(1399ms)));
  EXPECT_TRUE(s.Due(At(1400ms)));  // waited 400
  EXPECT_EQ(s.next(), At(1800ms));
  EXPECT_EQ(s.Waited(At(1400ms)), 400ms);
}

TEST(StallSchedule, ALateCheckBacksOffFromWhenItRan) {
  StallSchedule s(At(0ms), 100ms);
  EXPECT_TRUE(s.Due(At(1000ms)));  // an inspector that ran late
  EXPECT_EQ(s.next(), At(2000ms));
}

TEST(StallSchedule, ZeroDisablesReports) {
  StallSchedule s(At(0ms), 0ms);
  EXPECT_FALSE(s.enabled());
  EXPECT_FALSE(s.Due(At(std::chrono::hours(1000))));
  EXPECT_FALSE(StallSchedule().Due(At(1s)));
}

// A fake clock and condition: waiting advances time to the requested point, or to
// `ready_at` if the condition becomes true sooner.
struct Fake {
  TP now = At(0ms);
  TP ready_at = TP::max();
  std::vector<TP> waits;  // the points each wait was asked to wait until
  auto Now() {
    return [this] { return now; };
  }
  auto WaitUntil() {
    return [this](TP until) {
      waits.push_back(until);
      if (ready_at <= until) {
        now = std::max(now, ready_at);
        return true;
      }
      now = until;
      return false;
    };
  }
};

TEST(WaitReporting, ReportsStallsWithBackOffAndGivesUpAtTheDeadline) {
  Fake f;
  std::vector<std::chrono::milliseconds> reports;
  const bool done = WaitReporting(
      WaitPlan{1000ms, 100ms}, f.WaitUntil(), [&](auto waited) { reports.push_back(waited); },
      f.Now());
  EXPECT_FALSE(done);
  EXPECT_EQ(reports, (std::vector<std::chrono::milliseconds>{100ms, 200ms, 400ms, 800ms}));
  EXPECT_EQ(f.now, At(1000ms));
}

TEST(WaitReporting, ReturnsAsSoonAsTheConditionHolds) {
  Fake f;
  f.ready_at = At(250ms);
  int reports = 0;
  EXPECT_TRUE(WaitReporting(
      WaitPlan{1000ms, 100ms}, f.WaitUntil(), [&](auto) { ++reports; }, f.Now()));
  EXPECT_EQ(reports, 2);  // at 100 and 200 ms
  EXPECT_EQ(f.now, At(250ms));
}

TEST(WaitReporting, WithoutADeadlineWaitsUntilTheCondition) {
  Fake f;
  f.ready_at = At(std::chrono::hours(10));
  int reports = 0;
  EXPECT_TRUE(WaitReporting(
      WaitPlan{WaitPlan::kForever, 1h}, f.WaitUntil(), [&](auto) { ++reports; }, f.Now()));
  EXPECT_EQ(reports, 4);  // at 1, 2, 4 and 8 h; the condition held at 10 h
}

TEST(WaitReporting, ZeroTimeoutGivesUpWithoutWaiting) {
  Fake f;
  f.ready_at = At(0ms);
  EXPECT_FALSE(WaitReporting(
      WaitPlan{0ms, 100ms}, f.WaitUntil(), [](auto) {}, f.Now()));
  EXPECT_TRUE(f.waits.empty());
}

TEST(WaitReporting, PollBoundsEachSliceAndNoStallMeansNoReport) {
  Fake f;
  f.ready_at = At(350ms);
  int reports = 0;
  EXPECT_TRUE(WaitReporting(
      WaitPlan{1000ms, 0ms, 100ms}, f.WaitUntil(), [&](auto) { ++reports; }, f.Now()));
  EXPECT_EQ(reports, 0);
  EXPECT_EQ(f.waits, (std::vector<TP>{At(100ms), At(200ms), At(300ms), At(400ms)}));
}

TEST(WaitReporting, AReportMayEndTheWait) {
  Fake f;
  EXPECT_THROW(WaitReporting(
                   WaitPlan{1000ms, 100ms}, f.WaitUntil(),
                   [](auto) { throw std::runtime_error("deadlock"); }, f.Now()),
               std::runtime_error);
  EXPECT_EQ(f.now, At(100ms));
}

TEST(ReportList, NamesUpToTheCapAndCountsTheRest) {
  ReportList r(2);
  EXPECT_TRUE(r.Add("a"));
  EXPECT_TRUE(r.Add("b"));
  EXPECT_TRUE(r.full());
  EXPECT_FALSE(r.Add("c"));
  r.Skip();
  EXPECT_EQ(r.total(), 4u);
  EXPECT_EQ(r.omitted(), 2u);
  EXPECT_EQ(r.Join(), "a, b and 2 more");
  EXPECT_EQ(ReportList().Join(), "");
  ReportList one;
  one.Add("x");
  EXPECT_EQ(one.Join("; "), "x");
}

TEST(ReportList, TheDefaultCapIsTheSharedOne) {
  ReportList r;
  for (size_t i = 0; i < kReportItems + 3; ++i) r.Add(std::to_string(i));
  EXPECT_EQ(r.items().size(), kReportItems);
  EXPECT_EQ(r.omitted(), 3u);
}

}  // namespace
}  // namespace pskv
