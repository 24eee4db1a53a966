// The bodies servers send each other (kvstore/distributed/wire/replication_wire.h): each
// round-trips, and every truncation and every longer body is refused with a
// ProtocolError naming it, as are counts beyond the bytes and unknown copy parts.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kvstore/distributed/wire/replication_wire.h"
#include "pskv/error.h"

using namespace pskv;
using namespace pskv::dist;
namespace rw = pskv::dist::replication_wire;

namespace {

// `parse` accepts `body` and refuses each of its prefixes and `body` plus a byte,
// with a ProtocolError whose message names `what`.
void ExpectStrict(const std::string& body, const std::function<void(const std::string&)>& parse,
                  const std::string& what) {
  EXPECT_NO_THROW(parse(body)) << what;
  for (size_t n = 0; n < body.size(); ++n) {
    try {
      parse(body.substr(0, n));
      ADD_FAILURE() << what << ": a prefix of " << n << " of " << body.size()
                    << " bytes was accepted";
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse(body + '\0'), ProtocolError) << what << ": a trailing byte";
}

// Overwrites the u32 at `at` of `body` with `n`.
std::string WithCount(std::string body, size_t at, uint32_t n) {
  std::memcpy(body.data() + at, &n, sizeof n);
  return body;
}

TEST(ReplicationWire, RoundTripsAndIsStrict) {
  const rw::Round r{5, 12, {{9, 12}, {11, 12}}, {{11, 77, -1, 0x0700}}};
  const std::string b = rw::EncodeRound(r);
  EXPECT_EQ(rw::ParseRound(b), r);
  EXPECT_EQ(rw::ParseVersion(b), 5u);
  ExpectStrict(
      b, [](const std::string& s) { rw::ParseRound(s); }, "replicated round");
  // A count of more push counts than the bytes hold is refused before any is read.
  EXPECT_THROW(rw::ParseRound(WithCount(b, 16, 0xffffffff)), ProtocolError);
  EXPECT_THROW(rw::ParseRound(WithCount(b, 16 + 4 + 2 * 12, 1000)), ProtocolError);
  // Sent again: under another version, without its answers.
  rw::Round again = rw::ParseRound(rw::RoundAgain(b, 6));
  EXPECT_EQ(again.version, 6u);
  EXPECT_EQ(again.round, 12);
  EXPECT_EQ(again.counts, r.counts);
  EXPECT_TRUE(again.answers.empty());
  EXPECT_THROW(rw::RoundAgain(b.substr(0, 20), 6), ProtocolError);
  const rw::Round empty{1, 1, {}, {}};
  EXPECT_EQ(rw::ParseRound(rw::EncodeRound(empty)), empty);
}

TEST(ReplicationWire, SparseRoundRoundTripsAndIsStrict) {
  const rw::SparseRound r{5, 3, 40, {{9, 3}, {10, 2}}};
  const std::string b = rw::EncodeSparseRound(r);
  EXPECT_EQ(rw::ParseSparseRound(b), r);
  ExpectStrict(
      b, [](const std::string& s) { rw::ParseSparseRound(s); }, "replicated row_sparse round");
  EXPECT_THROW(rw::ParseSparseRound(WithCount(b, 24, 3)), ProtocolError);
}

TEST(ReplicationWire, EmbeddingRoundRoundTripsAndIsStrict) {
  const rw::EmbeddingRound r{5, 17, {{9, 3}, {10, 2}}, {}};
  const std::string b = rw::EncodeEmbeddingRound(r);
  EXPECT_EQ(rw::ParseEmbeddingRound(b), r);
  EXPECT_EQ(rw::ParseVersion(b), 5u);
  ExpectStrict(
      b, [](const std::string& s) { rw::ParseEmbeddingRound(s); }, "replicated embedding update");
  // More push counts than the bytes hold: refused before any is read.
  EXPECT_THROW(rw::ParseEmbeddingRound(WithCount(b, 16, 3)), ProtocolError);
  EXPECT_THROW(rw::ParseEmbeddingRound(WithCount(b, 16, 0xffffffff)), ProtocolError);
  const rw::EmbeddingRound empty{1, 0, {}, {}};
  EXPECT_EQ(rw::ParseEmbeddingRound(rw::EncodeEmbeddingRound(empty)), empty);
  // A restore: its directory round-trips; a path too long or holding a NUL is refused.
  const rw::EmbeddingRound restore{2, 9, {}, "/shared/ckpt"};
  EXPECT_EQ(rw::ParseEmbeddingRound(rw::EncodeEmbeddingRound(restore)), restore);
  EXPECT_THROW(rw::ParseEmbeddingRound(
                   rw::EncodeEmbeddingRound({2, 9, {}, std::string(rw::kMaxRestorePath + 1, 'a')})),
               ProtocolError);
  EXPECT_THROW(
      rw::ParseEmbeddingRound(rw::EncodeEmbeddingRound({2, 9, {}, std::string("a\0b", 3)})),
      ProtocolError);
}

TEST(ReplicationWire, AsyncPushesRoundTripAndAreStrict) {
  const rw::AsyncPushes p{5, 9, {{4, 30, 4}, {2, -1, 2}}};
  const std::string b = rw::EncodeAsyncPushes(p);
  EXPECT_EQ(rw::ParseAsyncPushes(b, 2), p);
  ExpectStrict(
      b, [](const std::string& s) { rw::ParseAsyncPushes(s, 2); }, "replicated async push");
  EXPECT_THROW(rw::ParseAsyncPushes(b, 1), ProtocolError) << "one entry per key";
  EXPECT_THROW(rw::ParseAsyncPushes(b, 3), ProtocolError);
  EXPECT_THROW(rw::ParseAsyncPushes(b, uint64_t{1} << 62), ProtocolError);
}

TEST(ReplicationWire, ForwardedInitRoundTripsAndIsStrict) {
  const uint64_t counts[3] = {1, 2, 3};
  const std::string b = rw::EncodeForwardedInit(
      4, 9, std::string(reinterpret_cast<const char*>(counts), sizeof counts));
  EXPECT_EQ(rw::ParseForwardedInit(b, 3), (rw::ForwardedInit{4, 9, {1, 2, 3}}));
  EXPECT_EQ(rw::ParseVersion(b), 4u);
  EXPECT_EQ(rw::ParseVersion(rw::EncodeForwardedStates(7)), 7u);
  ExpectStrict(
      b, [](const std::string& s) { rw::ParseForwardedInit(s, 3); }, "forwarded init");
  EXPECT_THROW(rw::ParseForwardedInit(b, 2), ProtocolError);
}

TEST(ReplicationWire, CopyPartsRoundTripAndAreStrict) {
  const rw::CopyHead head{5, CopyPart::kKeys, 1};  // each encoder sets its own part
  const rw::CopyBegin begin{true, 2, 4096, {{0, 1024}, {3, 8}}};
  const std::string bb = rw::EncodeCopyBegin(head, begin);
  EXPECT_EQ(rw::ParseCopyHead(bb), (rw::CopyHead{5, CopyPart::kBegin, 1}));
  EXPECT_EQ(rw::ParseCopyBegin(bb), begin);
  ExpectStrict(
      bb, [](const std::string& s) { rw::ParseCopyBegin(s); }, "range copy (begin)");
  EXPECT_THROW(rw::ParseCopyBegin(WithCount(bb, 13 + 1 + 16, 0xffffffff)), ProtocolError);

  const std::vector<rw::CopyKey> keys = {{65536, 0, 0, 4, {{9, 3}, {11, 3}}}, {65537, 2, 8, 1, {}}};
  const std::string kb = rw::EncodeCopyKeys(head, keys);
  EXPECT_EQ(rw::ParseCopyHead(kb).part, CopyPart::kKeys);
  EXPECT_EQ(rw::ParseCopyKeys(kb, 2), keys);
  ExpectStrict(
      kb, [](const std::string& s) { rw::ParseCopyKeys(s, 2); }, "range copy (keys)");
  EXPECT_THROW(rw::ParseCopyKeys(kb, 1), ProtocolError);
  EXPECT_THROW(rw::ParseCopyKeys(kb, 3), ProtocolError);

  const std::string sb = rw::EncodeCopyStates(head, {3, 512});
  EXPECT_EQ(rw::ParseCopyStates(sb), (rw::CopyStates{3, 512}));
  ExpectStrict(
      sb, [](const std::string& s) { rw::ParseCopyStates(s); }, "range copy (states)");

  const std::string eb = rw::EncodeCopyEnd(head);
  EXPECT_EQ(rw::ParseCopyHead(eb), (rw::CopyHead{5, CopyPart::kEnd, 1}));
  ExpectStrict(
      eb, [](const std::string& s) { rw::ParseCopyEnd(s); }, "range copy (end)");
  // The head alone: what follows it is the part's parser's, but it must be whole.
  EXPECT_EQ(rw::ParseCopyHead(kb).range, 1);
  for (size_t n = 0; n < eb.size(); ++n)
    EXPECT_THROW(rw::ParseCopyHead(eb.substr(0, n)), ProtocolError) << n;

  // Each part's parser refuses another part, and every parser an unknown one.
  EXPECT_THROW(rw::ParseCopyBegin(eb), ProtocolError);
  EXPECT_THROW(rw::ParseCopyKeys(bb, 0), ProtocolError);
  EXPECT_THROW(rw::ParseCopyStates(kb), ProtocolError);
  EXPECT_THROW(rw::ParseCopyEnd(sb), ProtocolError);
  std::string unknown = eb;
  unknown[8] = 4;
  EXPECT_THROW(rw::ParseCopyHead(unknown), ProtocolError);
  std::string sync2 = bb;
  sync2[13] = 2;
  EXPECT_THROW(rw::ParseCopyBegin(sync2), ProtocolError);
}

TEST(ReplicationWire, TheVersionComesFirstInEveryChange) {
  const std::string b = rw::EncodeSparseRound({5, 3, 40, {}});
  const std::string again = rw::WithVersion(b, 9);
  EXPECT_EQ(rw::ParseSparseRound(again), (rw::SparseRound{9, 3, 40, {}}));
  EXPECT_EQ(rw::ParseVersion(rw::EncodeAsyncPushes({7, 1, {}})), 7u);
  EXPECT_THROW(rw::ParseVersion("1234567"), ProtocolError);
  EXPECT_THROW(rw::WithVersion("1234567", 9), ProtocolError);
}

}  // namespace
