// The KV store's control payloads (kvstore/distributed/wire/kv_payload.h): every
// payload round-trips, and truncated, oversized, trailing, mis-kinded and
// wrong-version inputs are ProtocolErrors naming the payload. DecodeAny covers the
// node-level kinds too (protocol/payload.h; their own tests: tests/protocol/test_payload.cc).
#include <gtest/gtest.h>

#include <functional>

#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/error.h"
#include "support/expect_protocol_error.h"

using namespace pskv;
using namespace pskv::payload;

namespace {

using testing_support::ExpectProtocolError;

OptimizerConfig SampleOptimizer() {
  OptimizerConfig c;
  c.type = "adamw";
  c.learning_rate = 0.1 / 3;  // not exact in decimal: the wire keeps every bit
  c.wd = 1e-4;
  c.rescale_grad = 1.0 / 7;
  c.clip_gradient = 5;
  c.momentum = 0.9;
  c.beta1 = 0.8;
  c.beta2 = 0.99;
  c.epsilon = 1e-7;
  c.rho = 0.95;
  c.centered = true;
  c.multi_precision = true;
  c.lr_schedule.type = "multifactor";
  c.lr_schedule.step = 7;
  c.lr_schedule.steps = {10, 20, 30};
  c.lr_schedule.factor = 0.5;
  c.lr_schedule.stop_factor_lr = 1e-9;
  c.lr_schedule.max_update = 100;
  c.lr_schedule.final_lr = 1e-5;
  c.lr_schedule.warmup_steps = 4;
  c.lr_schedule.warmup_begin_lr = 1e-3;
  c.lr_mult = {{3, 0.5}, {(int64_t{1} << 32) | 7, 2.0}};
  c.wd_mult = {{3, 0.0}};
  c.sum_keys = {8, 9, 10};
  return c;
}

// Every payload kind, encoded with non-default content.
std::vector<std::string> AllPayloads() {
  const NodeDesc d = testing_support::SampleNodeDesc();
  CompressionConfig comp;
  comp.type = "2bit";
  comp.threshold = 0.3f;
  InitReport rep;
  rep.entries = {{1, "w\tith\ntabs", "float32", "(2,3)"}};
  rep.failures = {{2, "line one\nline two"}};
  RoundStatus st;
  st.deadlocks = {{5, "deadlock"}};
  st.lines = {"a", ""};
  RangeTableData table;
  table.version = 3;
  table.ranges = {{9, {11}, {}}, {11, {}, {13}}};
  table.spares = {15};
  return {EncodeNodeList({d}),      EncodeOptimizer(SampleOptimizer()),
          EncodeCompression(comp),  EncodeInitReport(rep),
          EncodeCheckInit({1, -2}), EncodeRoundStatus(st),
          EncodeStatesSize(77),     EncodeMode(true),
          EncodeHasOptimizer(true), EncodeBarrierState(false),
          EncodeRangeTable(table)};
}

}  // namespace

TEST(KvPayload, OptimizerRoundTripIsExact) {
  const OptimizerConfig c = SampleOptimizer();
  const OptimizerConfig o = DecodeOptimizer(EncodeOptimizer(c));
  EXPECT_EQ(o.type, c.type);
  EXPECT_EQ(o.learning_rate, c.learning_rate);
  EXPECT_EQ(o.wd, c.wd);
  EXPECT_EQ(o.rescale_grad, c.rescale_grad);
  EXPECT_EQ(o.clip_gradient, c.clip_gradient);
  EXPECT_EQ(o.momentum, c.momentum);
  EXPECT_EQ(o.beta1, c.beta1);
  EXPECT_EQ(o.beta2, c.beta2);
  EXPECT_EQ(o.epsilon, c.epsilon);
  EXPECT_EQ(o.rho, c.rho);
  EXPECT_EQ(o.centered, c.centered);
  EXPECT_EQ(o.multi_precision, c.multi_precision);
  EXPECT_EQ(o.lr_schedule.type, c.lr_schedule.type);
  EXPECT_EQ(o.lr_schedule.step, c.lr_schedule.step);
  EXPECT_EQ(o.lr_schedule.steps, c.lr_schedule.steps);
  EXPECT_EQ(o.lr_schedule.factor, c.lr_schedule.factor);
  EXPECT_EQ(o.lr_schedule.stop_factor_lr, c.lr_schedule.stop_factor_lr);
  EXPECT_EQ(o.lr_schedule.max_update, c.lr_schedule.max_update);
  EXPECT_EQ(o.lr_schedule.final_lr, c.lr_schedule.final_lr);
  EXPECT_EQ(o.lr_schedule.warmup_steps, c.lr_schedule.warmup_steps);
  EXPECT_EQ(o.lr_schedule.warmup_begin_lr, c.lr_schedule.warmup_begin_lr);
  EXPECT_EQ(o.lr_mult, c.lr_mult);
  EXPECT_EQ(o.wd_mult, c.wd_mult);
  EXPECT_EQ(o.sum_keys, c.sum_keys);
  // Same as the public text form.
  EXPECT_EQ(o.Serialize(), c.Serialize());
}

TEST(KvPayload, CompressionThresholdIsExact) {
  CompressionConfig c;
  c.type = "2bit";
  c.threshold = 0.1f + 1e-8f;
  const CompressionConfig o = DecodeCompression(EncodeCompression(c));
  EXPECT_EQ(o.type, "2bit");
  EXPECT_EQ(o.threshold, c.threshold);
}

TEST(KvPayload, InitReportRoundTrip) {
  InitReport r;
  r.entries = {{1, "a\tb\nc\\", "float32", "(2,3)"},
               {(int64_t{3} << 32) | 4, "", "float16", "(7)"}};
  r.failures = {{9, "bad\tvalue\nsecond line"}};
  const InitReport o = DecodeInitReport(EncodeInitReport(r));
  ASSERT_EQ(o.entries.size(), 2u);
  EXPECT_EQ(o.entries[0].name, "a\tb\nc\\");
  EXPECT_EQ(o.entries[0].dtype, "float32");
  EXPECT_EQ(o.entries[0].shape, "(2,3)");
  EXPECT_EQ(o.entries[1].id, (int64_t{3} << 32) | 4);
  ASSERT_EQ(o.failures.size(), 1u);
  EXPECT_EQ(o.failures[0].id, 9);
  EXPECT_EQ(o.failures[0].message, "bad\tvalue\nsecond line");
}

TEST(KvPayload, CheckInitRoundTrip) {
  const std::vector<int64_t> ids = {0, 1, -5, int64_t{1} << 40};
  EXPECT_EQ(DecodeCheckInit(EncodeCheckInit(ids)), ids);
  EXPECT_TRUE(DecodeCheckInit(EncodeCheckInit({})).empty());
}

TEST(KvPayload, RoundStatusRoundTrip) {
  RoundStatus s;
  s.deadlocks = {{(int64_t{1} << 32) | 3, "key 3 round 2: deadlock"}};
  s.lines = {"key 3 round 2 on server 0: waiting for worker 1 for 5 s", "second"};
  const RoundStatus o = DecodeRoundStatus(EncodeRoundStatus(s));
  ASSERT_EQ(o.deadlocks.size(), 1u);
  EXPECT_EQ(o.deadlocks[0].key, s.deadlocks[0].key);
  EXPECT_EQ(o.deadlocks[0].message, s.deadlocks[0].message);
  EXPECT_EQ(o.lines, s.lines);
}

TEST(KvPayload, ScalarsRoundTrip) {
  EXPECT_EQ(DecodeStatesSize(EncodeStatesSize(0)), 0u);
  EXPECT_EQ(DecodeStatesSize(EncodeStatesSize(uint64_t{1} << 40)), uint64_t{1} << 40);
  EXPECT_TRUE(DecodeMode(EncodeMode(true)));
  EXPECT_FALSE(DecodeMode(EncodeMode(false)));
  EXPECT_TRUE(DecodeHasOptimizer(EncodeHasOptimizer(true)));
  EXPECT_FALSE(DecodeHasOptimizer(EncodeHasOptimizer(false)));
  EXPECT_TRUE(DecodeBarrierState(EncodeBarrierState(true)));
  EXPECT_FALSE(DecodeBarrierState(EncodeBarrierState(false)));
}

TEST(KvPayload, EveryTruncationIsRejected) {
  for (const std::string& p : AllPayloads()) {
    EXPECT_NO_THROW(DecodeAny(p));
    for (size_t n = 0; n < p.size(); ++n)
      EXPECT_THROW(DecodeAny(p.substr(0, n)), ProtocolError)
          << "kind " << int(p[0]) << " cut at " << n;
  }
}

TEST(KvPayload, TrailingBytesAreRejected) {
  for (const std::string& p : AllPayloads())
    ExpectProtocolError([&] { DecodeAny(p + "x"); }, "1 trailing bytes");
}

TEST(KvPayload, WrongVersionSaysWhichAreUnderstood) {
  for (std::string p : AllPayloads()) {
    p[1] = 2;
    ExpectProtocolError([&] { DecodeAny(p); }, "version 2 is not understood (understood: 1)");
  }
  std::string p = EncodeMode(true);
  p[1] = 0;
  ExpectProtocolError([&] { DecodeMode(p); }, "mode payload: version 0");
}

TEST(KvPayload, WrongOrUnknownKindIsRejected) {
  ExpectProtocolError([] { DecodeMode(EncodeHasOptimizer(true)); },
                      "mode payload: wrong kind 9 (expected 8)");
  ExpectProtocolError([] { DecodeAny(std::string("\x63\x01", 2)); }, "unknown kind 99");
  ExpectProtocolError([] { DecodeAny(""); }, "empty");
}

TEST(KvPayload, OversizedCountsAreRejectedBeforeAllocating) {
  // A count of 2^32-1 elements in a payload of a few bytes.
  auto huge = [](std::string p, size_t count_at) {
    p[count_at] = p[count_at + 1] = p[count_at + 2] = p[count_at + 3] = '\xff';
    return p;
  };
  ExpectProtocolError([&] { DecodeCheckInit(huge(EncodeCheckInit({1}), 2)); },
                      "check-init ids payload: 4294967295 ids cannot fit");
  ExpectProtocolError([&] { DecodeInitReport(huge(EncodeInitReport({}), 2)); },
                      "init report payload: 4294967295 entries cannot fit");
  ExpectProtocolError([&] { DecodeInitReport(huge(EncodeInitReport({}), 6)); },
                      "4294967295 failures cannot fit");
  ExpectProtocolError([&] { DecodeRoundStatus(huge(EncodeRoundStatus({}), 2)); },
                      "round status payload: 4294967295 deadlocks cannot fit");
  ExpectProtocolError([&] { DecodeRoundStatus(huge(EncodeRoundStatus({}), 6)); },
                      "4294967295 lines cannot fit");
  // A string length beyond the bytes present.
  ExpectProtocolError([&] { DecodeCompression(huge(EncodeCompression({}), 2)); },
                      "compression setting payload");
  // The last count of the optimizer config (sum keys).
  OptimizerConfig c;
  std::string p = EncodeOptimizer(c);
  ExpectProtocolError([&] { DecodeOptimizer(huge(p, p.size() - 4)); },
                      "optimizer config payload: 4294967295 sum keys cannot fit");
}

TEST(KvPayload, BadBooleanIsRejected) {
  std::string p = EncodeMode(true);
  p[2] = 2;
  ExpectProtocolError([&] { DecodeMode(p); }, "bad boolean 2");
}

TEST(KvPayload, DuplicateMapKeysAreRejected) {
  OptimizerConfig c;
  c.sum_keys = {5, 6};
  std::string p = EncodeOptimizer(c);
  p.replace(p.size() - 8, 8, p.substr(p.size() - 16, 8));  // 5, 5
  ExpectProtocolError([&] { DecodeOptimizer(p); }, "sum key 5 twice");
}
