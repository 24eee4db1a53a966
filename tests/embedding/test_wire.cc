// The dynamic embedding tables' wire (kvstore/distributed/wire/embedding_codec.h and the
// embedding-table payload of kv_payload.h): what a worker encodes a server decodes,
// and a server refuses malformed, oversized or misdirected values — one test per
// attack — before it allocates anything for them.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "kvstore/distributed/wire/embedding_codec.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/embedding.h"
#include "pskv/error.h"

using namespace pskv;
namespace ew = pskv::dist::embedding_wire;

namespace {

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Ids that all belong to `shard` of `servers`.
std::vector<uint64_t> IdsOf(uint32_t shard, uint32_t servers, size_t n) {
  std::vector<uint64_t> out;
  for (uint64_t id = 1; out.size() < n; id += 0x9e3779b97f4a7c15ULL)
    if (EmbeddingShardOf(id, servers) == shard) out.push_back(id);
  return out;
}

std::string Push(const std::vector<uint64_t>& ids, uint64_t width) {
  std::vector<float> g(ids.size() * width);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i) * 0.5f;
  std::string buf(ew::PushBytes(ids.size(), width), '\0');
  ew::EncodePush(buf.data(), width, ids.data(), ids.size(), g.data());
  return buf;
}

}  // namespace

TEST(EmbeddingCodec, PushAndPullRoundTrip) {
  const auto ids = IdsOf(1, 3, 5);
  const std::string buf = Push(ids, 4);
  const ew::PushRows r = ew::DecodePush(ew::Source::Of(buf), 4, {1, 3});
  EXPECT_EQ(r.ids, ids);
  ASSERT_EQ(r.grads.size(), 20u);
  EXPECT_EQ(r.grads[19], 9.5f);
  EXPECT_TRUE(ew::DecodePush(ew::Source::Of(Push({}, 4)), 4, {1, 3}).ids.empty());
  std::string pull;
  ew::AppendPull(&pull, ids.data(), ids.size());
  EXPECT_EQ(ew::DecodePull(ew::Source::Of(pull), {1, 3}), ids);
}

TEST(EmbeddingCodec, TableConfigRoundTrip) {
  EmbeddingConfig c;
  c.name = "ads";
  c.width = 24;
  c.seed = 7;
  c.init.kind = EmbeddingInitializer::Kind::kNormal;
  c.optimizer = OptimizerConfig::For("adam");
  c.optimizer.learning_rate = 0.25;
  c.admission = EmbeddingAdmission::CountingBloom(3, 1000, 0.01);
  c.unadmitted_pull = EmbeddingConfig::UnadmittedPull::kZeros;
  c.ttl_steps = 9;
  c.capacity = 100;
  c.max_bytes = 1 << 20;
  const std::string b = payload::EncodeEmbeddingTable(c);
  const EmbeddingConfig d = payload::DecodeEmbeddingTable(b);
  EXPECT_EQ(payload::EncodeEmbeddingTable(d), b);
  EXPECT_EQ(d.name, "ads");
  EXPECT_EQ(d.optimizer.type, "adam");
  EXPECT_EQ(d.admission.cbf_counters, c.admission.cbf_counters);
  EXPECT_NO_THROW(payload::DecodeAny(b));  // the fuzzed entry point knows the kind
}

// Attack: a push shorter than its head.
TEST(EmbeddingCodec, RefusesATruncatedPush) {
  EXPECT_THROW(ew::DecodePush(ew::Source::Of("short"), 4, {}), InvalidArgument);
}

// Attack: a row count that would make the server reserve 2^60 rows.
TEST(EmbeddingCodec, RefusesACountTheBytesCannotHold) {
  std::string b;
  Put<uint64_t>(&b, uint64_t{1} << 60);
  Put<uint64_t>(&b, 4);
  b.append(24, '\0');  // one row's worth
  EXPECT_THROW(ew::DecodePush(ew::Source::Of(b), 4, {}), InvalidArgument);
  std::string p;
  Put<uint64_t>(&p, std::numeric_limits<uint64_t>::max());
  Put<uint64_t>(&p, 1);
  EXPECT_THROW(ew::DecodePull(ew::Source::Of(p), {}), InvalidArgument);
}

// Attack: a huge width (whose row size would overflow) and any width but the table's.
TEST(EmbeddingCodec, RefusesAWidthOtherThanTheTables) {
  std::string b = Push(IdsOf(0, 1, 2), 8);
  EXPECT_THROW(ew::DecodePush(ew::Source::Of(b), 4, {}), ShapeError);
  std::string h;
  Put<uint64_t>(&h, 1);
  Put<uint64_t>(&h, uint64_t{1} << 62);
  h.append(64, '\0');
  EXPECT_THROW(ew::DecodePush(ew::Source::Of(h), 4, {}), ShapeError);
}

// Attack: trailing bytes after the rows.
TEST(EmbeddingCodec, RefusesTrailingBytes) {
  std::string b = Push(IdsOf(0, 1, 2), 4) + "x";
  EXPECT_THROW(ew::DecodePush(ew::Source::Of(b), 4, {}), InvalidArgument);
  std::string p;
  const uint64_t id = 5;
  ew::AppendPull(&p, &id, 1);
  EXPECT_THROW(ew::DecodePull(ew::Source::Of(p + "yy"), {}), InvalidArgument);
}

// Attack: ids sent to a server that does not hold them (rows would be created where
// no pull ever finds them).
TEST(EmbeddingCodec, RefusesIdsOfAnotherServer) {
  const auto theirs = IdsOf(2, 3, 1);
  EXPECT_THROW(ew::DecodePush(ew::Source::Of(Push(theirs, 4)), 4, {0, 3}), KeyError);
  std::string p;
  ew::AppendPull(&p, theirs.data(), 1);
  EXPECT_THROW(ew::DecodePull(ew::Source::Of(p), {0, 3}), KeyError);
}

// Attack: an empty or oversized configuration value.
TEST(EmbeddingCodec, RefusesAnOversizedCreate) {
  EXPECT_THROW(ew::DecodeCreate(ew::Source::Of("")), InvalidArgument);
  ew::Source big;
  big.size = ew::kMaxConfig + 1;
  big.copy = [](uint64_t, uint64_t, char*) { FAIL() << "read before the size check"; };
  EXPECT_THROW(ew::DecodeCreate(big), InvalidArgument);
}

// Attack: configuration payloads that are cut, padded, or carry values out of range.
TEST(EmbeddingCodec, RefusesMalformedConfigs) {
  const std::string b = payload::EncodeEmbeddingTable(EmbeddingConfig{});
  for (size_t cut : {size_t{1}, size_t{2}, b.size() / 2, b.size() - 1})
    EXPECT_THROW(payload::DecodeEmbeddingTable(b.substr(0, cut)), ProtocolError) << cut;
  EXPECT_THROW(payload::DecodeEmbeddingTable(b + "z"), ProtocolError);
  // Field offsets: kind, version, name (u32 length + 9 bytes "embedding"), width.
  const size_t dtype_at = 2 + 4 + 9 + 8;
  std::string bad = b;
  bad[dtype_at] = static_cast<char>(200);
  EXPECT_THROW(payload::DecodeEmbeddingTable(bad), ProtocolError);
  bad = b;
  bad[dtype_at + 1 + 8] = 9;  // the initializer's kind
  EXPECT_THROW(payload::DecodeEmbeddingTable(bad), ProtocolError);
  bad = b;
  const uint32_t huge = 0x7fffffff;  // a name length the payload cannot hold
  std::memcpy(bad.data() + 2, &huge, 4);
  EXPECT_THROW(payload::DecodeEmbeddingTable(bad), ProtocolError);
}
