// RangeTable (ps/range_table.h): the initial placement of replicas, promotion when a
// server dies, lost ranges, version ordering and the wire form; and the body of a
// replicated job's push message (PushBody, ps/kv_app.h).
#include "ps/range_table.h"

#include <gtest/gtest.h>

#include "protocol/message.h"
#include "ps/kv_app.h"
#include "pskv/error.h"

using namespace pskv;

TEST(RangeTable, InitialPlacesReplicasOnTheNextServers) {
  const RangeTable t = RangeTable::Initial(4, 2);
  EXPECT_EQ(t.version(), 1u);
  ASSERT_EQ(t.num_ranges(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t.Primary(i), ServerId(i));
    EXPECT_EQ(t.Replicas(i), (std::vector<int32_t>{ServerId((i + 1) % 4), ServerId((i + 2) % 4)}));
  }
  EXPECT_EQ(t.ReplicaOf(ServerId(0)), (std::vector<int>{2, 3}));
  EXPECT_EQ(t.PrimaryOf(ServerId(3)), (std::vector<int>{3}));
  // More replicas than other servers: each range is on every server, no more.
  EXPECT_EQ(RangeTable::Initial(2, 5).Replicas(0), (std::vector<int32_t>{ServerId(1)}));
  EXPECT_TRUE(RangeTable::Initial(3, 0).Replicas(1).empty());
  EXPECT_TRUE(RangeTable().empty());
}

TEST(RangeTable, RemovePromotesTheFirstReplicaAndBumpsTheVersion) {
  RangeTable t = RangeTable::Initial(3, 1);  // 0:{s0; s1} 1:{s1; s2} 2:{s2; s0}
  auto r = t.Remove(ServerId(1));
  EXPECT_TRUE(r.changed);
  EXPECT_TRUE(r.lost.empty());
  EXPECT_EQ(t.version(), 2u);
  EXPECT_EQ(t.Primary(0), ServerId(0));
  EXPECT_TRUE(t.Replicas(0).empty());  // its replica was the dead server
  EXPECT_EQ(t.Primary(1), ServerId(2));
  EXPECT_TRUE(t.Replicas(1).empty());
  EXPECT_EQ(t.Primary(2), ServerId(2));
  EXPECT_EQ(t.Replicas(2), (std::vector<int32_t>{ServerId(0)}));
  EXPECT_FALSE(t.Holds(ServerId(1)));
  EXPECT_TRUE(t.Holds(ServerId(0)));
  // Removing it again changes nothing.
  auto again = t.Remove(ServerId(1));
  EXPECT_FALSE(again.changed);
  EXPECT_EQ(t.version(), 2u);
}

TEST(RangeTable, RangesWithoutACopyAreLost) {
  RangeTable none = RangeTable::Initial(2, 0);
  auto r = none.Remove(ServerId(1));
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(r.lost, (std::vector<int>{1}));

  RangeTable t = RangeTable::Initial(2, 1);
  EXPECT_TRUE(t.Remove(ServerId(0)).lost.empty());
  EXPECT_EQ(t.Primary(0), ServerId(1));
  EXPECT_EQ(t.Primary(1), ServerId(1));
  auto last = t.Remove(ServerId(1));
  EXPECT_EQ(last.lost, (std::vector<int>{0, 1}));
  EXPECT_EQ(t.Primary(0), ServerId(1));  // the dead primary stays: nothing to promote
}

TEST(RangeTable, OnlyNewerVersionsApply) {
  RangeTable node = RangeTable::Initial(2, 1);
  RangeTable sched = node;
  sched.Remove(ServerId(0));
  const RangeTable v2 = sched;
  EXPECT_TRUE(node.Apply(v2));
  EXPECT_EQ(node.Primary(0), ServerId(1));
  EXPECT_FALSE(node.Apply(v2));                         // repeated
  EXPECT_FALSE(node.Apply(RangeTable::Initial(2, 1)));  // older
  EXPECT_EQ(node.version(), 2u);
}

TEST(RangeTable, WireFormRoundTripsAndIsChecked) {
  RangeTable t = RangeTable::Initial(3, 2);
  t.Remove(ServerId(2));
  const std::string body = payload::EncodeRangeTable(t.ToData());
  const RangeTable back = RangeTable::FromData(payload::DecodeRangeTable(body), 3);
  EXPECT_EQ(back.version(), t.version());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(back.Primary(i), t.Primary(i));
    EXPECT_EQ(back.Replicas(i), t.Replicas(i));
  }
  EXPECT_NE(back.Describe().find("range 2 server[0]"), std::string::npos) << back.Describe();
  // A table for another job size, a non-server id or a repeated replica is refused.
  EXPECT_THROW(RangeTable::FromData(t.ToData(), 2), ProtocolError);
  auto data = t.ToData();
  data.ranges[0].primary = kSchedulerId;
  EXPECT_THROW(RangeTable::FromData(data, 3), ProtocolError);
  data = t.ToData();
  data.ranges[1].replicas = {data.ranges[1].primary};
  EXPECT_THROW(RangeTable::FromData(data, 3), ProtocolError);
  // Cut bytes are refused by the decoder.
  EXPECT_THROW(payload::DecodeRangeTable(body.substr(0, body.size() - 1)), ProtocolError);
}

// Spare servers (docs/fault-tolerance.md, "Back to full strength").
TEST(RangeTable, ASpareJoinsTheRangesLeftShortOfACopyAndBecomesTheirReplica) {
  RangeTable t = RangeTable::Initial(2, 1, 2);  // 0:{s0; s1} 1:{s1; s0}; spares s2, s3
  EXPECT_EQ(t.Spares(), (std::vector<int32_t>{ServerId(2), ServerId(3)}));
  EXPECT_TRUE(t.IsSpare(ServerId(2)));
  EXPECT_FALSE(t.Holds(ServerId(2)));
  EXPECT_FALSE(t.Gone(ServerId(2)));
  EXPECT_EQ(t.AssignSpare(1), 0);  // every range has its replica: nothing to do
  EXPECT_EQ(t.version(), 1u);
  ASSERT_TRUE(t.Remove(ServerId(0)).lost.empty());  // v2: s1 holds both ranges alone
  EXPECT_TRUE(t.Gone(ServerId(0)));
  // One spare replaces the dead server: it joins both ranges.
  EXPECT_EQ(t.AssignSpare(1), ServerId(2));
  EXPECT_EQ(t.version(), 3u);
  EXPECT_EQ(t.Joining(0), (std::vector<int32_t>{ServerId(2)}));
  EXPECT_EQ(t.Joining(1), (std::vector<int32_t>{ServerId(2)}));
  EXPECT_EQ(t.Spares(), (std::vector<int32_t>{ServerId(3)}));
  EXPECT_TRUE(t.Holds(ServerId(2)));              // it acknowledges the ranges' rounds
  EXPECT_TRUE(t.ReplicaOf(ServerId(2)).empty());  // but is not promoted yet
  EXPECT_EQ(t.AssignSpare(1), 0);                 // nothing short of a copy any more
  EXPECT_FALSE(t.Joined(0, ServerId(3)));         // not joining: nothing changes
  EXPECT_TRUE(t.Joined(0, ServerId(2)));
  EXPECT_EQ(t.version(), 4u);
  EXPECT_EQ(t.Replicas(0), (std::vector<int32_t>{ServerId(2)}));
  EXPECT_TRUE(t.Joining(0).empty());
  EXPECT_FALSE(t.Joined(0, ServerId(2)));  // repeated
  ASSERT_TRUE(t.Joined(1, ServerId(2)));
  // Full strength: a second death is survived, the spare is promoted.
  auto r = t.Remove(ServerId(1));
  EXPECT_TRUE(r.lost.empty());
  EXPECT_EQ(t.Primary(0), ServerId(2));
  EXPECT_EQ(t.Primary(1), ServerId(2));
  // ... and the last spare joins both.
  EXPECT_EQ(t.AssignSpare(1), ServerId(3));
  // The wire form keeps spares and joining servers.
  const RangeTable back = RangeTable::FromData(t.ToData(), 2, 2);
  EXPECT_EQ(back.Describe(), t.Describe());
  EXPECT_EQ(back.Joining(1), (std::vector<int32_t>{ServerId(3)}));
  EXPECT_NE(t.Describe().find("server[3] (copying)"), std::string::npos) << t.Describe();
}

TEST(RangeTable, AJoiningSpareIsNeverPromotedAndALostSpareLeaves) {
  RangeTable t = RangeTable::Initial(2, 1, 1);
  t.Remove(ServerId(0));
  ASSERT_EQ(t.AssignSpare(1), ServerId(2));
  // The last copy dies while the spare is still copying: the ranges are lost.
  auto r = t.Remove(ServerId(1));
  EXPECT_EQ(r.lost, (std::vector<int>{0, 1}));
  // A dead spare leaves the table (a new version tells every node).
  RangeTable u = RangeTable::Initial(2, 1, 1);
  auto s = u.Remove(ServerId(2));
  EXPECT_TRUE(s.changed);
  EXPECT_EQ(u.version(), 2u);
  EXPECT_TRUE(u.Gone(ServerId(2)));
  EXPECT_TRUE(u.Spares().empty());
}

TEST(RangeTable, SparesOnTheWireAreChecked) {
  payload::RangeTableData d = RangeTable::Initial(2, 1, 1).ToData();
  EXPECT_THROW(RangeTable::FromData(d, 2, 0), ProtocolError);  // s2 is no server of a 2s job
  d.spares = {ServerId(1)};                                    // holds a range
  EXPECT_THROW(RangeTable::FromData(d, 2, 1), ProtocolError);
  d.spares = {};
  d.ranges[0].joining = {ServerId(1)};  // listed twice for range 0
  EXPECT_THROW(RangeTable::FromData(d, 2, 1), ProtocolError);
  d.ranges[0].joining = {ServerId(2)};
  EXPECT_NO_THROW(RangeTable::FromData(d, 2, 1));
  EXPECT_EQ(payload::DecodeRangeTable(payload::EncodeRangeTable(d)).ranges[0].joining,
            (std::vector<int32_t>{ServerId(2)}));
}

// Push counts, then optionally the answerer's node id; anything else is no push body.
TEST(PushBody, CountsAndAnswererRoundTrip) {
  const std::string plain = PushBody::Encode({7, 9}, -1);
  EXPECT_EQ(plain.size(), 16u);
  PushBody b = PushBody::Parse(plain, 2);
  EXPECT_EQ(b.counts, (std::vector<uint64_t>{7, 9}));
  EXPECT_EQ(b.answerer, -1);
  b = PushBody::Parse(PushBody::Encode({3}, ServerId(1)), 1);
  EXPECT_EQ(b.counts, (std::vector<uint64_t>{3}));
  EXPECT_EQ(b.answerer, ServerId(1));
  EXPECT_TRUE(PushBody::Parse(plain, 1).counts.empty());  // another key count
  EXPECT_TRUE(PushBody::Parse("", 1).counts.empty());
  EXPECT_TRUE(PushBody::Parse(plain + "x", 2).counts.empty());
}
