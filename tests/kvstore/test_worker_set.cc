#include "kvstore/worker_set.h"

#include <gtest/gtest.h>

#include <set>

using namespace pskv;

TEST(WorkerSet, BehavesAsASetOfWorkerIdsUpTo200Workers) {
  WorkerSet s;
  std::set<int> ref;
  EXPECT_TRUE(s.empty());
  for (int round = 0; round < 3; ++round) {
    for (int r : {0, 63, 64, 1, 127, 128, 199, 64, 0}) {
      const int id = WorkerId(r);
      s.insert(id);
      ref.insert(id);
      EXPECT_EQ(s.size(), ref.size());
    }
    for (int r = 0; r < 200; ++r) EXPECT_EQ(s.count(WorkerId(r)), ref.count(WorkerId(r)) > 0) << r;
    EXPECT_FALSE(s.empty());
    s.clear();
    ref.clear();
    EXPECT_TRUE(s.empty());
    EXPECT_EQ(s.size(), 0u);
    for (int r = 0; r < 200; ++r) EXPECT_FALSE(s.count(WorkerId(r)));
  }
}
