// The optimizer-states file codec (kvstore/states_file.h): round trips, and files
// that are cut, mislabelled or claim more than they hold.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kvstore/states_file.h"
#include "pskv/error.h"
#include "pskv/optimizer.h"

using namespace pskv;

namespace {

states::Blob Sample(bool dumped) {
  states::Blob b;
  b.dumped = dumped;
  b.config = OptimizerConfig::FromParams("adam", {{"learning_rate", "0.25"}}).Serialize();
  b.num_update = 7;
  b.keys.push_back({3, 5, {NDArray::FromVector({1, 2}), NDArray::FromVector({3, 4})}, NDArray()});
  b.keys.push_back({9, 1, {NDArray(), NDArray::FromVector({5})}, NDArray::FromVector({6})});
  return b;
}

std::string TempFile(const std::string& tag, const std::string& bytes) {
  const auto p = std::filesystem::temp_directory_path() /
                 ("pskv_states_file_" + tag + "_" + std::to_string(::getpid()));
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p.string();
}

std::vector<double> Values(const NDArray& a) {
  std::vector<double> v;
  for (int64_t i = 0; i < a.size(); ++i) v.push_back(a.At(i));
  return v;
}

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

TEST(StatesFile, BlobRoundTrip) {
  for (bool dumped : {false, true}) {
    const states::Blob in = Sample(dumped);
    const std::string bytes = states::EncodeBlob(in);
    EXPECT_EQ(bytes.substr(0, 8), dumped ? "PSKVOPT2" : "PSKVOPT1");
    const states::Blob out = states::DecodeBlob(bytes);
    EXPECT_EQ(out.dumped, dumped);
    EXPECT_EQ(out.config, in.config);
    EXPECT_EQ(out.num_update, 7);
    ASSERT_EQ(out.keys.size(), 2u);
    EXPECT_EQ(out.keys[0].key, 3);
    EXPECT_EQ(out.keys[0].t, 5);
    ASSERT_EQ(out.keys[0].slots.size(), 2u);
    EXPECT_EQ(Values(out.keys[0].slots[1]), (std::vector<double>{3, 4}));
    EXPECT_TRUE(out.keys[0].master.empty());
    EXPECT_TRUE(out.keys[1].slots[0].empty());
    EXPECT_EQ(Values(out.keys[1].master), (std::vector<double>{6}));
    EXPECT_EQ(states::EncodeBlob(out), bytes);  // byte-exact
  }
}

TEST(StatesFile, MarkDumpedTurnsVersion1IntoVersion2Only) {
  std::string b = states::EncodeBlob(Sample(false));
  states::MarkDumped(&b);
  EXPECT_EQ(b, states::EncodeBlob(Sample(true)));
  std::string other = "PSKVDST2....";
  states::MarkDumped(&other);
  EXPECT_EQ(other, "PSKVDST2....");
}

TEST(StatesFile, BlobRejectsBadMagicTruncationAndOversizedCounts) {
  const std::string good = states::EncodeBlob(Sample(false));
  std::string bad = good;
  bad[3] = 'X';
  EXPECT_THROW(states::DecodeBlob(bad), IOError);
  EXPECT_THROW(states::DecodeBlob(""), ProtocolError);
  for (size_t cut = 1; cut < good.size(); ++cut)
    EXPECT_THROW(states::DecodeBlob(std::string_view(good).substr(0, good.size() - cut)), Error)
        << "cut " << cut;
  EXPECT_THROW(states::DecodeBlob(good + "x"), IOError);  // trailing bytes
  // A key count far beyond the bytes: refused before anything is reserved.
  states::Blob empty;
  std::string huge = states::EncodeBlob(empty);
  std::memset(huge.data() + huge.size() - 8, 0xff, 8);
  EXPECT_THROW(states::DecodeBlob(huge), IOError);
  // An array claiming 2^40 elements.
  std::string arr = states::EncodeBlob(empty);
  const uint64_t one = 1;
  std::memcpy(arr.data() + arr.size() - 8, &one, 8);
  Put<int64_t>(&arr, 0);          // key
  Put<int64_t>(&arr, 0);          // t
  Put<uint32_t>(&arr, 1);         // one slot
  Put<int64_t>(&arr, 1ll << 40);  // its element count
  Put<int64_t>(&arr, -1);         // (master)
  EXPECT_THROW(states::DecodeBlob(arr), IOError);
  // A slot count beyond the bytes.
  std::string slots = states::EncodeBlob(empty);
  std::memcpy(slots.data() + slots.size() - 8, &one, 8);
  Put<int64_t>(&slots, 0);
  Put<int64_t>(&slots, 0);
  Put<uint32_t>(&slots, 0xffffffffu);
  Put<int64_t>(&slots, -1);
  EXPECT_THROW(states::DecodeBlob(slots), IOError);
}

TEST(StatesFile, DistFileRoundTripBothVersions) {
  const std::string a = states::EncodeBlob(Sample(true)), b = states::EncodeBlob(Sample(false));
  const std::string v2 = states::EncodeDistHeader({a.size(), b.size()}) + a + b;
  auto f2 = states::DecodeDistFile(v2, "v2");
  EXPECT_EQ(f2.version, 2);
  ASSERT_EQ(f2.blobs.size(), 2u);
  EXPECT_EQ(f2.blobs[0], a);
  EXPECT_EQ(f2.blobs[1], b);
  std::string v1 = "PSKVDST1";
  Put<uint32_t>(&v1, 2);
  for (auto* s : {&a, &b}) {
    Put<uint32_t>(&v1, static_cast<uint32_t>(s->size()));
    v1 += *s;
  }
  auto f1 = states::DecodeDistFile(v1, "v1");
  EXPECT_EQ(f1.version, 1);
  ASSERT_EQ(f1.blobs.size(), 2u);
  EXPECT_EQ(f1.blobs[1], b);
  EXPECT_EQ(states::DecodeDistFile(states::EncodeDistHeader({}), "none").blobs.size(), 0u);
}

TEST(StatesFile, DistFileRejectsMalformed) {
  const std::string a = states::EncodeBlob(Sample(false));
  const std::string v2 = states::EncodeDistHeader({a.size()}) + a;
  auto rejects = [](const std::string& bytes, const std::string& why) {
    try {
      states::DecodeDistFile(bytes, "f");
      ADD_FAILURE() << "accepted: " << why;
    } catch (const IOError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  rejects("PSKVDST2", "too short");
  rejects("NOTASTATESFILE", "bad magic");
  rejects(v2.substr(0, v2.size() - 1), "sizes do not add up");
  rejects(v2 + "x", "sizes do not add up");
  std::string many = "PSKVDST2";
  Put<uint32_t>(&many, 0xffffffffu);  // 4G sizes in a 12-byte file
  rejects(many, "truncated");
  std::string big = "PSKVDST2";
  Put<uint32_t>(&big, 1);
  Put<uint64_t>(&big, ~0ull);
  rejects(big, "bad size");
  std::string v1 = "PSKVDST1";
  Put<uint32_t>(&v1, 0x7fffffffu);
  rejects(v1, "truncated");
  std::string v1cut = "PSKVDST1";
  Put<uint32_t>(&v1cut, 1);
  Put<uint32_t>(&v1cut, 100);
  rejects(v1cut + "short", "truncated");
}

TEST(StatesFile, DumpedConfigOfEveryFormat) {
  const states::Blob dumped = Sample(true);
  const std::string a = states::EncodeBlob(dumped), plain = states::EncodeBlob(Sample(false));
  std::string v1 = "PSKVDST1";
  Put<uint32_t>(&v1, 1);
  Put<uint32_t>(&v1, static_cast<uint32_t>(a.size()));
  v1 += a;
  const std::vector<std::pair<std::string, std::string>> files = {
      {"blob", a},
      {"v3", "PSKVDST3" + a},
      {"v2", states::EncodeDistHeader({a.size()}) + a},
      {"v1", v1}};
  for (auto& [tag, bytes] : files) {
    const std::string path = TempFile(tag, bytes);
    EXPECT_EQ(states::ReadDumpedConfigText(path), dumped.config) << tag;
    auto cfg = ReadDumpedOptimizerConfig(path);
    ASSERT_TRUE(cfg) << tag;
    EXPECT_EQ(cfg->type, "adam");
    EXPECT_DOUBLE_EQ(cfg->learning_rate, 0.25);
    std::filesystem::remove(path);
  }
  const std::string p = TempFile("plain", plain), g = TempFile("garbage", "hello");
  EXPECT_FALSE(states::ReadDumpedConfigText(p));
  EXPECT_FALSE(states::ReadDumpedConfigText(g));
  // A config length beyond the file: an error, not a 4 GB read.
  std::string cut = a.substr(0, 12);
  std::memset(cut.data() + 8, 0xff, 4);
  const std::string c = TempFile("cut", cut);
  EXPECT_THROW(states::ReadDumpedConfigText(c), IOError);
  EXPECT_THROW(states::ReadDumpedConfigText(c + ".missing"), IOError);
  for (auto& f : {p, g, c}) std::filesystem::remove(f);
}
