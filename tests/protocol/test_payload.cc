// The node-level control payloads (protocol/payload.h: node list, barrier state,
// range table): round trips, and truncated, trailing and wrong-version inputs are
// ProtocolErrors naming the payload. The KV store's payloads have their own tests
// (tests/distributed/test_kv_payload.cc).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "protocol/payload.h"
#include "pskv/error.h"
#include "support/expect_protocol_error.h"

using namespace pskv;
using namespace pskv::payload;

namespace {

using testing_support::ExpectProtocolError;

// Every node-level kind, encoded with non-default content.
std::vector<std::string> NodeLevelPayloads() {
  const NodeDesc d = testing_support::SampleNodeDesc();
  RangeTableData table;
  table.version = 3;
  table.ranges = {{9, {11}, {}}, {11, {}, {13}}};
  table.spares = {15};
  return {EncodeNodeList({d}), EncodeBarrierState(false), EncodeRangeTable(table)};
}

}  // namespace

TEST(Payload, NodeListRoundTrip) {
  NodeDesc a, b;
  a.id = 1;
  a.host = "127.0.0.1";
  a.port = 9000;
  a.token = 42;
  b.id = 8;
  b.role = 2;
  b.rank = 3;
  b.host = "example.org";
  b.port = 65535;
  b.rank_hint = 5;
  auto out = DecodeNodeList(EncodeNodeList({a, b}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].host, "127.0.0.1");
  EXPECT_EQ(out[0].token, 42u);
  EXPECT_EQ(out[1].id, 8);
  EXPECT_EQ(out[1].role, 2);
  EXPECT_EQ(out[1].rank, 3);
  EXPECT_EQ(out[1].port, 65535);
  EXPECT_EQ(out[1].rank_hint, 5);
  EXPECT_TRUE(DecodeNodeList(EncodeNodeList({})).empty());
  // The message layer's names are the same schema.
  EXPECT_EQ(EncodeNodes({a}), EncodeNodeList({a}));
  EXPECT_EQ(DecodeNodes(EncodeNodeList({a, b})).size(), 2u);
}

TEST(Payload, NodeListRejectsBadEntry) {
  NodeDesc a;
  a.port = 70000;
  ExpectProtocolError([&] { DecodeNodeList(EncodeNodeList({a})); }, "invalid node entry");
}

TEST(Payload, BarrierStateAndRangeTableRoundTrip) {
  EXPECT_TRUE(DecodeBarrierState(EncodeBarrierState(true)));
  EXPECT_FALSE(DecodeBarrierState(EncodeBarrierState(false)));
  RangeTableData t;
  t.version = 7;
  t.ranges = {{9, {11, 12}, {}}, {11, {}, {13}}};
  t.spares = {15};
  const RangeTableData o = DecodeRangeTable(EncodeRangeTable(t));
  EXPECT_EQ(o.version, 7u);
  ASSERT_EQ(o.ranges.size(), 2u);
  EXPECT_EQ(o.ranges[0].primary, 9);
  EXPECT_EQ(o.ranges[0].replicas, (std::vector<int32_t>{11, 12}));
  EXPECT_EQ(o.ranges[1].joining, std::vector<int32_t>{13});
  EXPECT_EQ(o.spares, std::vector<int32_t>{15});
}

TEST(Payload, NodeLevelTruncationTrailingBytesAndVersionsAreRejected) {
  for (std::string p : NodeLevelPayloads()) {
    EXPECT_TRUE(DecodeNodeLevel(p));
    for (size_t n = 1; n < p.size(); ++n)
      EXPECT_THROW(DecodeNodeLevel(p.substr(0, n)), ProtocolError)
          << "kind " << int(p[0]) << " cut at " << n;
    ExpectProtocolError([&] { DecodeNodeLevel(p + "x"); }, "1 trailing bytes");
    p[1] = 2;
    ExpectProtocolError([&] { DecodeNodeLevel(p); }, "version 2 is not understood (understood: 1)");
  }
  // Not a node-level kind: the KV layer's (DecodeAny) or nothing.
  EXPECT_FALSE(DecodeNodeLevel(""));
  EXPECT_FALSE(DecodeNodeLevel(std::string("\x02\x01", 2)));
}

TEST(Payload, OversizedNodeListIsRejectedBeforeAllocating) {
  std::string p = EncodeNodeList({});
  p[2] = p[3] = p[4] = p[5] = '\xff';
  ExpectProtocolError([&] { DecodeNodeList(p); }, "node list payload: 4294967295 nodes cannot fit");
}
