// Wire chunks (dist_protocol.h): the lengths a server's slice of a dense key is cut
// into (ChunkLengths: ramps of small chunks at both ends, balanced chunks between)
// and the chunks' ps keys inside their servers' key ranges (ChunkSlices).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/worker/wire_shape.h"

namespace pskv {
namespace {

// A slice of several chunks starts and ends with per/8, per/4, per/2 (as far as the
// slice allows), the middle balanced within one element and at most `per`; the
// lengths rise to the middle and fall after it, and cover the slice exactly.
TEST(DistProtocol, ChunkLengthsRampUpAndDownAroundBalancedMiddle) {
  const int64_t per = 65536;  // 256 KiB of float32
  // 1 MiB of float32 (the k = 4, 4 MiB slice): 3 ramp steps each side.
  EXPECT_EQ(dist::ChunkLengths(262144, per, 1000),
            (std::vector<int64_t>{8192, 16384, 32768, 49152, 49152, 49152, 32768, 16384, 8192}));
  // Just over one chunk: one ramp step each side, the rest in one middle chunk.
  EXPECT_EQ(dist::ChunkLengths(per + 1, per, 1000),
            (std::vector<int64_t>{8192, per + 1 - 16384, 8192}));
  // A slice of at most one chunk is one chunk (small keys are unchanged).
  EXPECT_EQ(dist::ChunkLengths(per, per, 1000), (std::vector<int64_t>{per}));
  EXPECT_EQ(dist::ChunkLengths(5, per, 1000), (std::vector<int64_t>{5}));
  EXPECT_TRUE(dist::ChunkLengths(0, per, 1000).empty());
  // Chunks too small to ramp (per < 8): balanced chunks only.
  EXPECT_EQ(dist::ChunkLengths(10, 4, 1000), (std::vector<int64_t>{4, 4, 2}));
  for (int64_t len : {per + 1, 2 * per - 7, 3 * per, int64_t{1000003}, 64 * per + 5}) {
    const auto l = dist::ChunkLengths(len, per, 1000);
    ASSERT_GE(l.size(), 3u) << len;
    EXPECT_EQ(std::accumulate(l.begin(), l.end(), int64_t{0}), len);
    EXPECT_EQ(l.front(), per / 8) << len;
    EXPECT_EQ(l.back(), per / 8) << len;
    const auto peak = std::max_element(l.begin(), l.end());
    EXPECT_LE(*peak, per);
    EXPECT_TRUE(std::is_sorted(l.begin(), peak + 1)) << len;
    EXPECT_TRUE(std::is_sorted(l.rbegin(), std::make_reverse_iterator(peak))) << len;
    // the two ramps mirror each other
    for (size_t i = 0; i < l.size() && l[i] < per / 2 + 1 && l[i] != *peak; ++i)
      EXPECT_EQ(l[i], l[l.size() - 1 - i]) << len << " at " << i;
  }
  // Where the ramp does not fit in max_chunks: balanced chunks, as many as allowed.
  EXPECT_EQ(dist::ChunkLengths(4 * per, per, 4), (std::vector<int64_t>(4, per)));
  EXPECT_EQ(dist::ChunkLengths(100 * per, per, 7).size(), 7u);
}

// Chunking: each server's slice is covered exactly, in balanced chunks, within the
// chunk range of the servers' key ranges; ps keys are unique and on their server.
TEST(DistProtocol, ChunkSlicesCoverEachSliceWithinTheKeyRange) {
  for (int S : {1, 2, 3, 7}) {
    const int64_t n = 1000003;
    auto slices = dist::PlaceKey(42, n, S, 1000);
    auto chunks = dist::ChunkSlices(slices, 4, 65536, S);
    std::set<uint64_t> keys;
    int64_t covered = 0;
    for (auto& c : chunks) {
      EXPECT_LE(c.len * 4, 65536);
      EXPECT_LT(c.index, dist::MaxChunks(S));
      const uint64_t k = dist::PsKey(dist::ChunkKey(dist::WireKey(3, 42), c.index), c.server, S);
      auto [b, e] = KVWorker::ServerRange(c.server, S);
      EXPECT_TRUE(k >= b && k < e);
      keys.insert(k);
      covered += c.len;
    }
    EXPECT_EQ(covered, n);
    EXPECT_EQ(keys.size(), chunks.size());
    EXPECT_EQ(dist::ChunkSlices(slices, 4, 0, S).size(), static_cast<size_t>(S));
  }
  // More chunks than the range holds: fewer, bigger chunks.
  auto few = dist::ChunkSlices({{0, 0, int64_t{1} << 30}}, 4, 4096, 1 << 10);
  EXPECT_EQ(few.size(), dist::MaxChunks(1 << 10));
  EXPECT_EQ(dist::StoreOf(dist::ChunkKey(dist::WireKey(3, 42), 9)), 3);
  EXPECT_EQ(dist::KeyOf(dist::ChunkKey(dist::WireKey(3, 42), 9)), 42);
  EXPECT_EQ(dist::OptimizerKey(dist::ChunkKey(dist::WireKey(3, 42), 0)), 42);
  EXPECT_EQ(dist::OptimizerKey(dist::ChunkKey(dist::WireKey(3, 42), 9)), (int64_t{9} << 32) | 42);
}

// Finer chunks (per_slice > 1, where links are the limit): a slice bigger than the
// chunk size is cut into chunks of a per_slice-th of it, not below
// kMinFineChunkBytes and not above the chunk size; a slice of at most the chunk size
// stays one chunk, and per_slice = 1 is the chunk size alone.
TEST(DistProtocol, FineChunksCutBigSlicesIntoAFixedNumberOfChunks) {
  const int64_t chunk = 256 << 10;  // bytes
  const int64_t n = dist::kFineChunksPerSlice;
  // The k = 4, 4 MiB slice (1 MiB of float32): chunks of 32 KiB instead of 256 KiB.
  EXPECT_EQ(dist::ChunkElems(262144, 4, chunk), 65536);
  EXPECT_EQ(dist::ChunkElems(262144, 4, chunk, n), 262144 / n);
  const auto fine = dist::ChunkLengths(262144, dist::ChunkElems(262144, 4, chunk, n), 1000);
  EXPECT_LE(*std::max_element(fine.begin(), fine.end()) * 4, (int64_t{1} << 20) / n);
  EXPECT_GE(fine.size(), static_cast<size_t>(n));
  EXPECT_EQ(std::accumulate(fine.begin(), fine.end(), int64_t{0}), 262144);
  // A 64 MiB key's slices (16 MiB) keep the chunk size: a 32nd of them is bigger.
  EXPECT_EQ(dist::ChunkElems(int64_t{4} << 20, 4, chunk, n), chunk / 4);
  // Not below kMinFineChunkBytes (a 300 KiB slice: 16 KiB, not 9.4 KiB).
  EXPECT_EQ(dist::ChunkElems(76800, 4, chunk, n), dist::kMinFineChunkBytes / 4);
  // A slice of at most the chunk size stays one chunk; chunks off stay off.
  EXPECT_EQ(dist::ChunkElems(65536, 4, chunk, n), 65536);
  EXPECT_EQ(dist::ChunkElems(1000, 4, 0, n), 1000);
  // A chunk size below the floor is kept (the floor only limits the finer cut).
  EXPECT_EQ(dist::ChunkElems(262144, 4, 4096, n), 1024);
  // ChunkSlices cuts every slice of a split key alike, each within its slice.
  const auto slices = dist::PlaceKey(7, 1 << 20, 4, 1000);  // 4 MiB over 4 servers
  const auto coarse = dist::ChunkSlices(slices, 4, chunk, 4);
  const auto chunks = dist::ChunkSlices(slices, 4, chunk, 4, n);
  EXPECT_GE(chunks.size(), static_cast<size_t>(4 * n));
  EXPECT_GT(chunks.size(), 3 * coarse.size());
  std::vector<int64_t> covered(4, 0);
  for (const auto& c : chunks) {
    EXPECT_LE(c.len * 4, (int64_t{1} << 20) / n);
    covered[static_cast<size_t>(c.server)] += c.len;
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(covered[static_cast<size_t>(r)], slices[r].len);
}

// Paced links (WireShape::MessageBytes): a push's messages carry kPacedMessageUs of
// the link's rate, at most the wire chunk size; at 100 Mbit/s less than a fine chunk
// (each chunk its own message, as before); unpaced, and while no rate is learned (the
// connections are not paced: the cores may hold them), up to the chunk size as unpaced.
TEST(DistProtocol, PacedMessagesCarryAMillisecondOfTheLinksRate) {
  Options o;
  o.wire_chunk_bytes = 256 << 10;
  o.wire_ahead_bytes = 512 << 10;
  EXPECT_EQ(dist::WireShape::Of(o, false, nullptr).MessageBytes(), 0u);
  EXPECT_EQ(dist::WireShape::Of(o, false, nullptr).push_ahead, 512u << 10);
  o.link_rate = 12'500'000;  // 100 Mbit/s: 12.5 kB, below the least fine chunk
  const auto slow = dist::WireShape::Of(o, true, nullptr);
  EXPECT_EQ(slow.MessageBytes(), 12'500u);
  EXPECT_LT(slow.MessageBytes(), static_cast<uint64_t>(dist::kMinFineChunkBytes));
  EXPECT_EQ(slow.push_ahead, 0u);
  EXPECT_EQ(slow.chunks_per_slice, dist::kFineChunksPerSlice);
  o.link_rate = 125'000'000;  // 1 Gbit/s
  EXPECT_EQ(dist::WireShape::Of(o, true, nullptr).MessageBytes(), 125'000u);
  o.link_rate = 1'250'000'000;  // 10 Gbit/s: held to the wire chunk size
  EXPECT_EQ(dist::WireShape::Of(o, true, nullptr).MessageBytes(), 256u << 10);
  // Learned (PSKV_LINK_RATE=1, the default: Options::link_rate -1): the rate the
  // node's pacer paces for now; an unpaced shape ignores it.
  o.link_rate = -1;
  LinkRateShare rates;
  const auto learned = dist::WireShape::Of(o, true, &rates);
  const auto unpaced = dist::WireShape::Of(o, false, &rates);
  EXPECT_EQ(learned.MessageBytes(), 0u);  // nothing learned yet: not paced
  rates.PacedFor(162'000'000);
  EXPECT_EQ(learned.MessageBytes(), 162'000u);
  EXPECT_EQ(unpaced.MessageBytes(), 0u);
  // With replicas, a chunk each (a push-pull of one key is answered by the copy on
  // the worker's host).
  o.replicas = 1;
  EXPECT_EQ(dist::WireShape::Of(o, true, &rates).MessageBytes(), 1u);
  o.replicas = 0;
  rates.PacedFor(12'000'000);
  EXPECT_EQ(learned.MessageBytes(), 12'000u);
  rates.PacedFor(0);
  EXPECT_EQ(learned.MessageBytes(), 0u);
}

}  // namespace
}  // namespace pskv
