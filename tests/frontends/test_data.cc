#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "pskv/data.h"
#include "pskv/error.h"

using namespace pskv;
using namespace pskv::data;

TEST(Data, PartitionRangeMatchesMXNetMNISTIter) {
  EXPECT_EQ(PartitionRange(10, 3, 0), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(PartitionRange(10, 3, 1), (std::pair<int64_t, int64_t>{3, 6}));
  EXPECT_EQ(PartitionRange(10, 3, 2), (std::pair<int64_t, int64_t>{6, 10}));
  EXPECT_EQ(PartitionRange(60000, 1, 0), (std::pair<int64_t, int64_t>{0, 60000}));
  EXPECT_THROW(PartitionRange(10, 3, 3), InvalidArgument);
  EXPECT_THROW(PartitionRange(10, 0, 0), InvalidArgument);
  // parts cover every record exactly once
  int64_t prev = 0;
  for (int p = 0; p < 7; ++p) {
    auto [b, e] = PartitionRange(60000, 7, p);
    EXPECT_EQ(b, prev);
    prev = e;
  }
  EXPECT_EQ(prev, 60000);
}

TEST(Data, EpochSizeAndEqualBatchesPerWorker) {
  EXPECT_EQ(EpochSize(60000, 2, 64), 469);  // ceil(30000 / 64)
  EXPECT_EQ(EpochSize(10, 3, 2), 2);        // floor(10/3)=3 -> ceil(3/2)
  // Worker 2 of 3 has 4 records, the others 3: all run 2 batches of 2.
  for (int p = 0; p < 3; ++p) {
    auto o = EpochOrder(10, 3, p, 2, EpochSize(10, 3, 2), 1, 0, true);
    EXPECT_EQ(o.size(), 4u);
    auto [b, e] = PartitionRange(10, 3, p);
    for (auto i : o) EXPECT_TRUE(i >= b && i < e);
  }
}

TEST(Data, EpochOrderIsSeededAndWraps) {
  auto a = EpochOrder(100, 2, 1, 8, 10, 42, 3, true);
  auto b = EpochOrder(100, 2, 1, 8, 10, 42, 3, true);
  auto c = EpochOrder(100, 2, 1, 8, 10, 42, 4, true);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.size(), 80u);  // 50 records, wrapped to 80
  auto plain = EpochOrder(100, 2, 1, 10, 5, 42, 0, false);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(plain[i], 50 + i);
}

TEST(Data, SplitBatchEvenly) {
  auto s = SplitBatch(10, 3, false);
  EXPECT_EQ(s, (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 7}, {7, 10}}));
  EXPECT_THROW(SplitBatch(10, 3, true), InvalidArgument);
  EXPECT_EQ(SplitBatch(8, 4).size(), 4u);
}

TEST(Data, SplitByWorkloadMatchesMXNet) {
  auto s = SplitByWorkload(10, {1, 1, 2});
  // round(2.5)=2 (half to even), round(2.5)=2, round(5)=5 -> 9, deficit 1 to the last
  EXPECT_EQ(s, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 4}, {4, 10}}));
  EXPECT_THROW(SplitByWorkload(2, {1, 1, 1, 1}), InvalidArgument);
  EXPECT_THROW(SplitByWorkload(2, {}), InvalidArgument);
}

TEST(Data, ReadsGzipAndPlainIdx) {
  auto dir = std::filesystem::temp_directory_path() / ("pskv_idx_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string img = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3};
  for (int i = 0; i < 12; ++i) img.push_back(static_cast<char>(i));
  std::string lab = {0, 0, 8, 1, 0, 0, 0, 2, 7, 9};
  gzFile g = gzopen((dir / "i.gz").c_str(), "wb");
  gzwrite(g, img.data(), static_cast<unsigned>(img.size()));
  gzclose(g);
  std::ofstream(dir / "l", std::ios::binary) << lab;
  auto d = ReadIdx((dir / "i.gz").string(), (dir / "l").string());
  EXPECT_EQ(d.count, 2);
  EXPECT_EQ(d.rows, 2);
  EXPECT_EQ(d.cols, 3);
  EXPECT_EQ(d.pixels[11], 11);
  EXPECT_EQ(d.labels[1], 9);
  std::ofstream(dir / "bad", std::ios::binary) << img.substr(0, 20);
  EXPECT_THROW(ReadIdx((dir / "bad").string(), (dir / "l").string()), IOError);
  EXPECT_THROW(ReadIdx((dir / "missing").string(), (dir / "l").string()), IOError);
  std::filesystem::remove_all(dir);
}

TEST(Data, RealFashionMnistIfInstalled) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(std::filesystem::path(dir) / "t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto d = ReadMnistDir(dir, false);
  EXPECT_EQ(d.count, 10000);
  EXPECT_EQ(d.rows, 28);
  for (auto l : d.labels) EXPECT_LT(l, 10);
}

// Issue 22 item 5: a negative batch size was split into slices with negative ends.
TEST(Data, NegativeSizesAreInvalidArguments) {
  EXPECT_THROW(SplitBatch(-4, 2, false), InvalidArgument);
  EXPECT_THROW(SplitBatch(-4, 2, true), InvalidArgument);
  EXPECT_THROW(SplitByWorkload(-4, {1.0, 1.0}), InvalidArgument);
  EXPECT_THROW(PartitionRange(-10, 2, 0), InvalidArgument);
  EXPECT_THROW(EpochSize(-10, 2, 3), InvalidArgument);
  EXPECT_THROW(EpochOrder(10, 1, 0, 4, INT64_MAX / 2, 0, 0, false), InvalidArgument);
  EXPECT_EQ(SplitBatch(0, 2, false).size(), 2u);
}
