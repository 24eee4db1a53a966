// The admission policy for connections that have not proven themselves
// (transport/admission.h), alone: both listeners of a node (ZeroMQ's, direct
// TCP's) apply it.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "transport/admission.h"

using pskv::AdmissionPolicy;

namespace {

TEST(AdmissionPolicy, LimitsFollowTheCap) {
  EXPECT_EQ(AdmissionPolicy(0).cap(), 1u);
  EXPECT_EQ(AdmissionPolicy(8).per_source(), AdmissionPolicy::kMinPerSource);
  EXPECT_EQ(AdmissionPolicy(64).per_source(), 16u);
  EXPECT_EQ(AdmissionPolicy(400).per_source(), 100u);
}

TEST(AdmissionPolicy, WithinBothLimitsNobodyGoes) {
  const AdmissionPolicy p(64);
  EXPECT_FALSE(p.Victim({}));
  EXPECT_FALSE(p.Victim({{"10.0.0.1", 16}, {"10.0.0.2", 16}, {"10.0.0.3", 16}, {"10.0.0.4", 16}}));
}

TEST(AdmissionPolicy, ASourceOverItsShareLosesItsOwn) {
  const AdmissionPolicy p(64);
  EXPECT_EQ(p.Victim({{"10.0.0.1", 2}, {"6.6.6.6", 17}}), "6.6.6.6");
}

TEST(AdmissionPolicy, OverTheCapTheSourceHoldingTheMostLoses) {
  const AdmissionPolicy p(8);  // share (16) above the cap: the cap binds
  EXPECT_FALSE(p.Victim({{"10.0.0.1", 8}}));
  EXPECT_EQ(p.Victim({{"10.0.0.1", 9}}), "10.0.0.1");
  EXPECT_EQ(p.Victim({{"10.0.0.1", 1}, {"6.6.6.6", 8}}), "6.6.6.6");
  // A tie goes to the first address (deterministic).
  EXPECT_EQ(p.Victim({{"10.0.0.2", 3}, {"10.0.0.1", 3}, {"10.0.0.3", 3}}), "10.0.0.1");
}

TEST(AdmissionPolicy, ManyNodesOfOneHostAllGetIn) {
  // 12 receivers on one host connect at once to a node with the smallest cap a
  // node gets (4 x nodes + 64).
  const AdmissionPolicy p(64);
  EXPECT_FALSE(p.Victim({{"10.0.0.7", 12}}));
}

TEST(AdmissionPolicy, RepeatedUntilNothingGoesItEndsWithinTheLimits) {
  const AdmissionPolicy p(32);
  std::map<std::string, size_t> w = {{"a", 40}, {"b", 3}, {"c", 9}};
  int closed = 0;
  while (auto v = p.Victim(w)) {
    --w[*v];
    ++closed;
  }
  EXPECT_EQ(w["a"], 16u);  // its share; the others kept theirs
  EXPECT_EQ(w["b"], 3u);
  EXPECT_EQ(w["c"], 9u);
  EXPECT_EQ(closed, 24);
}

}  // namespace
