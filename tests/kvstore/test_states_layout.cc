// Whole-key optimizer states versus the servers' parts (kvstore/states_layout.h):
// gathering per-server blobs into a "PSKVDST3" file, cutting it for another number of
// servers, the errors of both, and whole-keys files that are cut or lie about sizes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kvstore/states_file.h"
#include "kvstore/states_layout.h"
#include "pskv/error.h"
#include "pskv/optimizer.h"

using namespace pskv;
using namespace pskv::states;

namespace {

const std::string kConfig =
    OptimizerConfig::FromParams("adam", {{"learning_rate", "0.5"}}).Serialize();

// Element i of key k's slot s (s == 2: the master copy).
float V(int64_t key, int slot, int64_t i) {
  return static_cast<float>(key * 1000 + slot * 100) + static_cast<float>(i);
}

NDArray Range(int64_t key, int slot, int64_t from, int64_t len) {
  NDArray a(Shape{len}, DType::kFloat32);
  for (int64_t i = 0; i < len; ++i) a.data<float>()[i] = V(key, slot, from + i);
  return a;
}

// Key 1: 10 elements, two slots and a master copy; key 2: 3 elements, two slots;
// key 3: never updated (no states anywhere).
Layout TwoServers() {
  return {{1, 10, {{0, 1, 0, 4}, {1, (int64_t{1} << 32) | 1, 4, 6}}},
          {2, 3, {{1, 2, 0, 3}}},
          {3, 2, {{0, 3, 0, 2}}}};
}
Layout ThreeServers() {
  return {{1, 10, {{2, 1, 0, 3}, {0, 1, 3, 3}, {1, 1, 6, 4}}},
          {2, 3, {{0, 2, 0, 3}}},
          {3, 2, {{1, 3, 0, 2}}}};
}

// The per-server blobs of `layout` (update counts 4 + server, step counts 3).
std::vector<std::string> ServerBlobs(const Layout& layout, int servers) {
  std::vector<Blob> blobs(static_cast<size_t>(servers));
  for (int s = 0; s < servers; ++s) {
    blobs[static_cast<size_t>(s)].config = kConfig;
    blobs[static_cast<size_t>(s)].num_update = 4 + s;
  }
  for (const KeyLayout& k : layout) {
    if (k.key == 3) continue;
    for (const Part& p : k.parts) {
      KeyStates st{p.opt_key,
                   3,
                   {Range(k.key, 0, p.offset, p.len), Range(k.key, 1, p.offset, p.len)},
                   k.key == 1 ? Range(k.key, 2, p.offset, p.len) : NDArray()};
      blobs[static_cast<size_t>(p.server)].keys.push_back(std::move(st));
    }
  }
  std::vector<std::string> out;
  for (auto& b : blobs) out.push_back(EncodeBlob(b));
  return out;
}

std::string Gather(const std::vector<std::string>& blobs, const Layout& layout, bool dumped) {
  std::vector<std::string_view> views(blobs.begin(), blobs.end());
  std::string out;
  GatherWholeKeys(views, layout, dumped, [&out](const char* p, size_t n) { out.append(p, n); });
  return out;
}

// Splits whole-keys bytes into one blob string per server.
std::vector<std::string> Split(const std::string& whole, const Layout& layout, int servers) {
  std::string packed;
  const auto sizes = SplitWholeKeys(IndexBlob(whole), layout, servers, &packed);
  std::vector<std::string> out;
  size_t at = 0;
  for (uint64_t n : sizes) {
    out.push_back(packed.substr(at, n));
    at += n;
  }
  EXPECT_EQ(at, packed.size());
  return out;
}

void ExpectWholeKey(const KeyStates& k, int64_t key, int64_t n, bool master) {
  EXPECT_EQ(k.key, key);
  EXPECT_EQ(k.t, 3);
  ASSERT_EQ(k.slots.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(k.slots[static_cast<size_t>(s)].size(), n);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(k.slots[static_cast<size_t>(s)].data<float>()[i], V(key, s, i));
  }
  EXPECT_EQ(k.master.empty(), !master);
  if (master) {
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(k.master.data<float>()[i], V(key, 2, i));
  }
}

}  // namespace

TEST(StatesLayout, GatherMakesWholeKeysWhateverTheServers) {
  const std::string whole = Gather(ServerBlobs(TwoServers(), 2), TwoServers(), true);
  EXPECT_EQ(whole.substr(0, 8), "PSKVDST3");
  const Blob b = DecodeBlob(whole);
  EXPECT_TRUE(b.dumped);
  EXPECT_EQ(b.config, kConfig);
  EXPECT_EQ(b.num_update, 5);    // the largest of the servers'
  ASSERT_EQ(b.keys.size(), 2u);  // key 3 was never updated
  ExpectWholeKey(b.keys[0], 1, 10, true);
  ExpectWholeKey(b.keys[1], 2, 3, false);
  // The same states held by three servers gather into the same bytes.
  const std::string three = Gather(ServerBlobs(ThreeServers(), 3), ThreeServers(), true);
  EXPECT_EQ(three.substr(0, 8 + 8), whole.substr(0, 8 + 8));
  EXPECT_EQ(DecodeBlob(three).keys.size(), 2u);
  EXPECT_EQ(EncodeBlob(DecodeBlob(three)).substr(8 + 12 + kConfig.size()),
            EncodeBlob(DecodeBlob(whole)).substr(8 + 12 + kConfig.size()))
      << "the keys' bytes are independent of the placement";
}

TEST(StatesLayout, SplitForAnotherNumberOfServersAndBackIsExact) {
  const std::string whole = Gather(ServerBlobs(TwoServers(), 2), TwoServers(), false);
  const std::vector<std::string> three = Split(whole, ThreeServers(), 3);
  ASSERT_EQ(three.size(), 3u);
  // Server 0 holds key 1's elements [3, 6) under optimizer key 1, and all of key 2.
  const Blob s0 = DecodeBlob(three[0]);
  EXPECT_EQ(s0.num_update, DecodeBlob(whole).num_update);
  ASSERT_EQ(s0.keys.size(), 2u);
  EXPECT_EQ(s0.keys[0].key, 1);
  EXPECT_EQ(s0.keys[0].slots[1].size(), 3);
  EXPECT_EQ(s0.keys[0].slots[1].data<float>()[0], V(1, 1, 3));
  EXPECT_EQ(s0.keys[0].master.data<float>()[2], V(1, 2, 5));
  EXPECT_EQ(s0.keys[1].key, 2);
  EXPECT_EQ(DecodeBlob(three[1]).keys.size(), 1u);
  // Gathered again with the three-server layout: the same file.
  const std::string again = Gather(three, ThreeServers(), false);
  EXPECT_EQ(again, whole);
  // One server holds everything.
  Layout one = TwoServers();
  for (auto& k : one)
    for (auto& p : k.parts) p.server = 0;
  EXPECT_EQ(Gather(Split(whole, one, 1), one, false), whole);
}

TEST(StatesLayout, AnOptimizersOwnBlobLoadsAsWholeKeys) {
  // A local store's or a Trainer's blob is whole keys: it splits like a dist file,
  // and an Optimizer loads a dist file.
  const std::string whole = Gather(ServerBlobs(TwoServers(), 2), TwoServers(), false);
  const std::string blob = whole.substr(8);
  EXPECT_EQ(Split(blob, ThreeServers(), 3), Split(whole, ThreeServers(), 3));
  Optimizer opt(OptimizerConfig::Deserialize(kConfig));
  opt.LoadStates(whole);
  EXPECT_EQ(opt.UpdateCount(1), 3);
  EXPECT_EQ(opt.SaveStates(), blob);
}

TEST(StatesLayout, SplitRefusesKeysAndSizesNotOfThisStore) {
  const std::string whole = Gather(ServerBlobs(TwoServers(), 2), TwoServers(), false);
  std::string out = "kept";
  Layout missing = ThreeServers();
  missing.erase(missing.begin() + 1);  // no key 2
  EXPECT_THROW(SplitWholeKeys(IndexBlob(whole), missing, 3, &out), KeyError);
  Layout bigger = ThreeServers();
  bigger[0].size = 11;
  bigger[0].parts[2].len = 5;
  try {
    SplitWholeKeys(IndexBlob(whole), bigger, 3, &out);
    ADD_FAILURE() << "accepted states of another size";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("key 1 has a state of 10 elements but the weight has 11"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(out, "kept");
}

TEST(StatesLayout, GatherRefusesPartsTheLayoutDoesNotExplain) {
  const std::vector<std::string> blobs = ServerBlobs(TwoServers(), 2);
  std::string out;
  auto sink = [&out](const char* p, size_t n) { out.append(p, n); };
  auto gather = [&](const std::vector<std::string>& b, const Layout& l) {
    std::vector<std::string_view> v(b.begin(), b.end());
    GatherWholeKeys(v, l, false, sink);
  };
  // A part held by a server the layout does not name.
  Layout no_key2 = TwoServers();
  no_key2.erase(no_key2.begin() + 1);
  EXPECT_THROW(gather(blobs, no_key2), InternalError);
  // Key 1 split elsewhere than the servers hold it: states on one part only.
  Layout other = TwoServers();
  other[0].parts = {{0, 1, 0, 5}, {1, 7, 5, 5}};
  EXPECT_THROW(gather(blobs, other), InternalError);
  // The right keys, the wrong sizes.
  Layout sizes = TwoServers();
  sizes[0].parts = {{0, 1, 0, 5}, {1, (int64_t{1} << 32) | 1, 5, 5}};
  EXPECT_THROW(gather(blobs, sizes), InternalError);
  EXPECT_TRUE(out.empty());
}

TEST(StatesLayout, CutOrLyingWholeKeysFilesAreErrorsNotHugeAllocations) {
  const std::string whole = Gather(ServerBlobs(TwoServers(), 2), TwoServers(), false);
  for (size_t cut = 1; cut < whole.size(); ++cut)
    EXPECT_THROW(IndexBlob(std::string_view(whole).substr(0, whole.size() - cut)), Error)
        << "cut " << cut;
  EXPECT_THROW(IndexBlob(whole + "x"), IOError);
  // A key count of 2^64 - 1 and an array of 2^40 elements in a short file.
  std::string count = whole.substr(0, 8 + 8 + 4 + kConfig.size() + 8);
  const uint64_t lots = ~0ull;
  count.append(reinterpret_cast<const char*>(&lots), 8);
  EXPECT_THROW(IndexBlob(count), IOError);
  std::string arr = whole;
  const int64_t huge = int64_t{1} << 40;
  // Key 1's first slot's element count follows the head, the key and its step count.
  const size_t at = 8 + 8 + 4 + kConfig.size() + 8 + 8 + 8 + 8 + 4;
  std::memcpy(arr.data() + at, &huge, 8);
  EXPECT_THROW(IndexBlob(arr), IOError);
  // Sizes that lie about the key: refused by the split, nothing sent.
  std::string shrunk = whole;
  const int64_t nine = 9;
  std::memcpy(shrunk.data() + at, &nine, 8);
  EXPECT_THROW(Split(shrunk, ThreeServers(), 3), Error);
}
