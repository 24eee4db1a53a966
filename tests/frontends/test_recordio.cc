// RecordIO image datasets (pskv/recordio.h): files written here in MXNet's format
// (PNG and JPEG records encoded with libpng/libjpeg), read back whole, in parts and
// shuffled; and each kind of bad input reported with the file and the record.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "pskv/error.h"
#include "pskv/recordio.h"

#ifdef RECORDIO_TEST_ENCODERS
#include <jpeglib.h>
#include <png.h>
#endif

namespace pskv::data {
namespace {

namespace fs = std::filesystem;

class RecordIOTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pskv_recordio_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::vector<uint8_t> Bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

void Patch(const std::string& path, long offset, const void* data, size_t n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

template <typename F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const IOError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no IOError";
  return "";
}

TEST_F(RecordIOTest, RecordsRoundTripAndPayloadsHoldingTheMagicAreSplitIntoParts) {
  // Payloads with the magic at aligned offsets 0, 8 and the end, and one unaligned.
  std::vector<std::vector<uint8_t>> payloads;
  const uint32_t m = kRecordIOMagic;
  std::vector<uint8_t> p(20, 7);
  std::memcpy(&p[0], &m, 4);
  std::memcpy(&p[8], &m, 4);
  std::memcpy(&p[16], &m, 4);
  payloads.push_back(p);
  std::vector<uint8_t> q(11, 1);
  std::memcpy(&q[3], &m, 4);  // unaligned: stays one part
  payloads.push_back(q);
  payloads.push_back({});
  payloads.push_back(Bytes("hello"));
  {
    RecordFileWriter w(Path("a.rec"), Path("a.idx"));
    for (size_t i = 0; i < payloads.size(); ++i) w.Write(100 + i, payloads[i]);
    w.Close();
  }
  // The first record: four parts (flags 1, 2, 2, 3) of 0, 4, 4 and 0 bytes.
  std::ifstream f(Path("a.rec"), std::ios::binary);
  uint32_t head[2];
  std::vector<uint32_t> flags;
  for (int part = 0; part < 4; ++part) {
    f.read(reinterpret_cast<char*>(head), 8);
    EXPECT_EQ(head[0], kRecordIOMagic);
    flags.push_back(head[1] >> 29);
    f.seekg(((head[1] & ((1u << 29) - 1)) + 3) / 4 * 4, std::ios::cur);
  }
  EXPECT_EQ(flags, (std::vector<uint32_t>{1, 2, 2, 3}));
  for (const std::string& idx : {Path("a.idx"), std::string()}) {  // with and without the index
    RecordFile rf(Path("a.rec"), idx);
    ASSERT_EQ(rf.size(), 4);
    for (int64_t i = 0; i < rf.size(); ++i) {
      EXPECT_EQ(rf.Read(i), payloads[static_cast<size_t>(i)]) << i;
      EXPECT_EQ(rf.key(i), idx.empty() ? static_cast<uint64_t>(i) : 100 + static_cast<uint64_t>(i));
    }
  }
}

TEST_F(RecordIOTest, ImageRecordHeaderPacksOneLabelOrSeveral) {
  ImageRecordHeader h;
  h.label = 3;
  h.id = 42;
  auto one = PackImageRecord(h, Bytes("img"));
  EXPECT_EQ(one.size(), 24u + 3);
  size_t at = 0;
  auto got = UnpackImageRecord(one, &at, "x");
  EXPECT_EQ(got.flag, 0u);
  EXPECT_EQ(got.label, 3.f);
  EXPECT_EQ(got.id, 42u);
  EXPECT_EQ(at, 24u);
  h.labels = {1.5f, 2.5f};
  auto two = PackImageRecord(h, Bytes("img"));
  got = UnpackImageRecord(two, &at, "x");
  EXPECT_EQ(got.flag, 2u);
  EXPECT_EQ(got.labels, (std::vector<float>{1.5f, 2.5f}));
  EXPECT_EQ(at, 32u);
  two.resize(28);  // the second label cut off
  const std::string e = ErrorOf([&] { UnpackImageRecord(two, &at, "'f.rec' record 9"); });
  EXPECT_NE(e.find("'f.rec' record 9"), std::string::npos) << e;
  EXPECT_NE(e.find("labels missing"), std::string::npos) << e;
}

TEST_F(RecordIOTest, PartitionIsMXNetsIndexedSplit) {
  EXPECT_EQ(RecordPartition(10, 3, 0), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(RecordPartition(10, 3, 1), (std::pair<int64_t, int64_t>{4, 8}));
  EXPECT_EQ(RecordPartition(10, 3, 2), (std::pair<int64_t, int64_t>{8, 10}));
  EXPECT_EQ(RecordPartition(4, 3, 2), (std::pair<int64_t, int64_t>{4, 4}));  // empty
  EXPECT_THROW(RecordPartition(10, 3, 3), InvalidArgument);
}

TEST_F(RecordIOTest, CorruptFilesNameTheFileAndRecord) {
  {
    RecordFileWriter w(Path("c.rec"), Path("c.idx"));
    for (int i = 0; i < 4; ++i) w.Write(i, std::vector<uint8_t>(40, static_cast<uint8_t>(i)));
  }
  const std::string rec = Path("c.rec");
  // Each record: 8 bytes of head + 40 of payload.
  const uint32_t bad = 0x12345678;
  Patch(rec, 2 * 48, &bad, 4);
  std::string e = ErrorOf([&] { RecordFile(rec, Path("c.idx")).Read(2); });
  EXPECT_NE(e.find(rec), std::string::npos) << e;
  EXPECT_NE(e.find("record 2 (key 2, byte 96)"), std::string::npos) << e;
  EXPECT_NE(e.find("bad magic 0x12345678"), std::string::npos) << e;
  // Without an index the scan stops at the same record.
  e = ErrorOf([&] { RecordFile r(rec); });
  EXPECT_NE(e.find("record 2"), std::string::npos) << e;
  EXPECT_NE(e.find("bad magic"), std::string::npos) << e;
  Patch(rec, 2 * 48, &kRecordIOMagic, 4);

  // An .idx offset past the end of the .rec.
  fs::copy_file(Path("c.idx"), Path("e.idx"));
  std::ofstream(Path("e.idx"), std::ios::app) << "4\t5000\n";
  e = ErrorOf([&] { RecordFile r(rec, Path("e.idx")); });
  EXPECT_NE(e.find(Path("e.idx") + "' line 5"), std::string::npos) << e;
  EXPECT_NE(e.find("offset 5000 of key 4 is past the end of '" + rec + "'"), std::string::npos)
      << e;

  // A length running past the end of the file.
  const uint32_t huge = 100000;
  Patch(rec, 3 * 48 + 4, &huge, 4);
  e = ErrorOf([&] { RecordFile(rec, Path("c.idx")).Read(3); });
  EXPECT_NE(e.find("record 3 (key 3, byte 144)"), std::string::npos) << e;
  EXPECT_NE(e.find("length 100000"), std::string::npos) << e;
  EXPECT_NE(e.find("past the end of the file (192 bytes)"), std::string::npos) << e;

  // A file cut in the middle of a record's header.
  fs::resize_file(rec, 3 * 48 + 4);
  e = ErrorOf([&] { RecordFile r(rec); });
  EXPECT_NE(e.find("record 3"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  std::ofstream(Path("d.idx")) << "0 zero\n";
  e = ErrorOf([&] { RecordFile r(rec, Path("d.idx")); });
  EXPECT_NE(e.find("line 1"), std::string::npos) << e;
  EXPECT_THROW(RecordFile r(Path("missing.rec")), IOError);
}

#ifdef RECORDIO_TEST_ENCODERS

// A rows x cols RGB image whose pixels encode (seed, row, col), smooth enough for JPEG.
std::vector<uint8_t> Pattern(int rows, int cols, int seed) {
  std::vector<uint8_t> px(static_cast<size_t>(rows * cols * 3));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      uint8_t* p = &px[static_cast<size_t>((r * cols + c) * 3)];
      p[0] = static_cast<uint8_t>(seed * 20 + r * 2);
      p[1] = static_cast<uint8_t>(255 - c * 3);
      p[2] = static_cast<uint8_t>(100 + seed * 10);
    }
  return px;
}

std::vector<uint8_t> EncodePng(const std::vector<uint8_t>& rgb, int rows, int cols) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(cols);
  img.height = static_cast<png_uint_32>(rows);
  img.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_to_memory(&img, nullptr, &size, 0, rgb.data(), 0, nullptr));
  std::vector<uint8_t> out(size);
  EXPECT_TRUE(png_image_write_to_memory(&img, out.data(), &size, 0, rgb.data(), 0, nullptr));
  out.resize(size);
  return out;
}

std::vector<uint8_t> EncodeJpeg(const std::vector<uint8_t>& rgb, int rows, int cols) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = static_cast<JDIMENSION>(cols);
  c.image_height = static_cast<JDIMENSION>(rows);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 95, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(rgb.data()) + c.next_scanline * cols * 3;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<uint8_t> out(buf, buf + size);
  jpeg_destroy_compress(&c);
  std::free(buf);
  return out;
}

// n records of 32x32 images: PNG for even i, JPEG for odd; label i % 5, id i.
void WriteImages(const std::string& rec, const std::string& idx, int n, int rows = 32) {
  RecordFileWriter w(rec, idx);
  for (int i = 0; i < n; ++i) {
    ImageRecordHeader h;
    h.label = static_cast<float>(i % 5);
    h.id = static_cast<uint64_t>(i);
    const auto px = Pattern(rows, 32, i);
    w.Write(static_cast<uint64_t>(i),
            PackImageRecord(h, i % 2 ? EncodeJpeg(px, rows, 32) : EncodePng(px, rows, 32)));
  }
  w.Close();
}

ImageRecordOptions Options(const std::string& rec, const std::string& idx) {
  ImageRecordOptions o;
  o.path_imgrec = rec;
  o.path_imgidx = idx;
  o.batch_size = 4;
  return o;
}

// The pixel (r, c, channel ch) of record `slot` of a batch, back from NCHW.
float At(const ImageBatch& b, int64_t slot, int ch, int r, int c) {
  return b.data[static_cast<size_t>(((slot * 3 + ch) * 32 + r) * 32 + c)];
}

TEST_F(RecordIOTest, ImageRecordIterDecodesPngExactlyAndJpegClosely) {
  ASSERT_TRUE(HaveImageDecoder());
  WriteImages(Path("i.rec"), Path("i.idx"), 10);
  ImageRecordIter it(Options(Path("i.rec"), Path("i.idx")));
  EXPECT_EQ(it.size(), 10);
  EXPECT_EQ(it.batches_per_epoch(), 3);
  ImageBatch b;
  int64_t seen = 0;
  std::vector<int64_t> pads;
  while (it.Next(&b)) {
    ASSERT_EQ(b.size, 4);
    pads.push_back(b.pad);
    for (int64_t j = 0; j < b.size; ++j) {
      const int rec = static_cast<int>((seen + j) % 10);  // round_batch wraps to record 0
      EXPECT_EQ(b.labels[static_cast<size_t>(j)], static_cast<float>(rec % 5));
      const auto px = Pattern(32, 32, rec);
      double err = 0;
      for (int ch = 0; ch < 3; ++ch)
        for (int r = 0; r < 32; ++r)
          for (int c = 0; c < 32; ++c)
            err += std::abs(At(b, j, ch, r, c) - px[static_cast<size_t>((r * 32 + c) * 3 + ch)]);
      err /= 3 * 32 * 32;
      if (rec % 2 == 0)
        EXPECT_EQ(err, 0) << "PNG record " << rec;
      else
        EXPECT_LT(err, 2.0) << "JPEG record " << rec;  // quality 95
    }
    seen += b.size;
  }
  EXPECT_EQ(pads, (std::vector<int64_t>{0, 0, 2}));

  // mean/std normalisation, no round_batch: a short last batch.
  auto o = Options(Path("i.rec"), Path("i.idx"));
  o.round_batch = false;
  o.mean[2] = 100;
  o.stddev[2] = 2;
  ImageRecordIter it2(o);
  std::vector<int64_t> sizes;
  while (it2.Next(&b)) sizes.push_back(b.size);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(At(b, 0, 2, 0, 0), (100 + 8 * 10 - 100) / 2.f);  // record 8, blue 100 + 8*10
}

TEST_F(RecordIOTest, PartsCoverTheFileOnceAndShufflingIsSeeded) {
  WriteImages(Path("p.rec"), Path("p.idx"), 10);
  auto ids = [&](int parts, int part, bool shuffle, uint64_t seed, int epoch) {
    auto o = Options(Path("p.rec"), Path("p.idx"));
    o.num_parts = parts;
    o.part_index = part;
    o.shuffle = shuffle;
    o.seed = seed;
    o.round_batch = false;
    ImageRecordIter it(o);
    it.Reset(epoch);
    std::vector<int> out;
    ImageBatch b;
    // Records are told apart by their blue channel: 100 + 10 * record.
    while (it.Next(&b))
      for (int64_t j = 0; j < b.size; ++j)
        out.push_back(static_cast<int>(std::lround((At(b, j, 2, 0, 0) - 100) / 10)));
    return out;
  };
  EXPECT_EQ(ids(3, 0, false, 0, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ids(3, 1, false, 0, 0), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(ids(3, 2, false, 0, 0), (std::vector<int>{8, 9}));
  const auto a = ids(1, 0, true, 7, 0);
  EXPECT_EQ(a, ids(1, 0, true, 7, 0));  // same seed, same order
  EXPECT_NE(a, ids(1, 0, true, 8, 0));
  EXPECT_NE(a, ids(1, 0, true, 7, 1));  // another epoch, another order
  EXPECT_EQ(std::set<int>(a.begin(), a.end()).size(), 10u);
  const auto s = ids(3, 1, true, 7, 0);  // a shuffled part stays inside its part
  EXPECT_EQ(std::set<int>(s.begin(), s.end()), (std::set<int>{4, 5, 6, 7}));
  EXPECT_THROW(ids(12, 11, false, 0, 0), InvalidArgument);  // 10 records: part 11 is empty
}

TEST_F(RecordIOTest, BadImagesAndMissingLabelsNameTheRecord) {
  WriteImages(Path("w.rec"), Path("w.idx"), 3, /*rows=*/28);
  std::string e = ErrorOf([&] {
    ImageRecordIter it(Options(Path("w.rec"), Path("w.idx")));
    ImageBatch b;
    it.Next(&b);
  });
  EXPECT_NE(e.find(Path("w.rec") + "' record 0 (key 0, byte 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("28x32 pixels, data_shape wants 32x32"), std::string::npos) << e;

  WriteImages(Path("l.rec"), Path("l.idx"), 3);
  auto o = Options(Path("l.rec"), Path("l.idx"));
  o.label_width = 2;
  e = ErrorOf([&] {
    ImageRecordIter it(o);
    ImageBatch b;
    it.Next(&b);
  });
  EXPECT_NE(e.find("record 0 (key 0"), std::string::npos) << e;
  EXPECT_NE(e.find("label_width is 2: labels missing"), std::string::npos) << e;

  {
    RecordFileWriter w(Path("g.rec"), Path("g.idx"));
    w.Write(0, PackImageRecord({}, EncodePng(Pattern(32, 32, 0), 32, 32)));
    auto png = EncodePng(Pattern(32, 32, 1), 32, 32);
    png.resize(png.size() / 2);  // a PNG cut in half
    w.Write(1, PackImageRecord({}, png));
    w.Write(2, PackImageRecord({}, Bytes("not an image at all")));
  }
  o = Options(Path("g.rec"), Path("g.idx"));
  o.batch_size = 1;
  ImageRecordIter it(o);
  ImageBatch b;
  ASSERT_TRUE(it.Next(&b));
  e = ErrorOf([&] { it.Next(&b); });
  EXPECT_NE(e.find("record 1 (key 1"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot decode its PNG image"), std::string::npos) << e;
  EXPECT_EQ(ErrorOf([&] { it.Next(&b); }), e);  // a failed batch is not skipped
  o.num_parts = 3;                              // part 2 of 3 is record 2 alone
  o.part_index = 2;
  ImageRecordIter last(o);
  e = ErrorOf([&] { last.Next(&b); });
  EXPECT_NE(e.find("record 2 (key 2"), std::string::npos) << e;
  EXPECT_NE(e.find("neither JPEG nor PNG"), std::string::npos) << e;
}

// Files written by the other implementation: tests/python/test_seed_data.py sets
// RECORDIO_CROSS_DIR to a folder holding py.rec/py.idx (written by pskv.recordio) and
// py.txt ("id label0 label1 blue" per record); this reads them, and writes cpp.rec/
// cpp.idx/cpp.txt for Python to read. Skipped when run alone.
TEST_F(RecordIOTest, CrossCheckWithThePythonImplementation) {
  const char* dir = std::getenv("RECORDIO_CROSS_DIR");
  if (!dir) GTEST_SKIP() << "run by tests/python/test_seed_data.py";
  const std::string d = dir;
  std::ifstream txt(d + "/py.txt");
  std::vector<std::vector<double>> want;
  for (double id, l0, l1, blue; txt >> id >> l0 >> l1 >> blue;) want.push_back({id, l0, l1, blue});
  ASSERT_GT(want.size(), 0u);
  RecordFile rf(d + "/py.rec", d + "/py.idx");
  ASSERT_EQ(rf.size(), static_cast<int64_t>(want.size()));
  auto o = Options(d + "/py.rec", d + "/py.idx");
  o.batch_size = 1;
  o.label_width = 2;
  ImageRecordIter it(o);
  ImageBatch b;
  for (size_t i = 0; i < want.size(); ++i) {
    const auto h = UnpackImageRecord(rf.Read(static_cast<int64_t>(i)), nullptr, "py");
    EXPECT_EQ(static_cast<double>(h.id), want[i][0]) << i;
    ASSERT_TRUE(it.Next(&b));
    EXPECT_EQ(b.labels[0], want[i][1]) << i;
    EXPECT_EQ(b.labels[1], want[i][2]) << i;
    EXPECT_NEAR(At(b, 0, 2, 5, 5), want[i][3], 3) << i;  // JPEG or PNG
  }
  EXPECT_FALSE(it.Next(&b));

  RecordFileWriter w(d + "/cpp.rec", d + "/cpp.idx");
  std::ofstream out(d + "/cpp.txt");
  for (int i = 0; i < 5; ++i) {
    ImageRecordHeader h;
    h.id = i == 2 ? kRecordIOMagic : static_cast<uint64_t>(i);  // an aligned magic: parts
    if (i % 2)
      h.labels = {static_cast<float>(i), 0.5f};
    else
      h.label = static_cast<float>(i);
    const auto px = Pattern(32, 32, i);
    w.Write(static_cast<uint64_t>(10 + i),
            PackImageRecord(h, i % 2 ? EncodeJpeg(px, 32, 32) : EncodePng(px, 32, 32)));
    out << h.id << ' ' << i << ' ' << (i % 2 ? 2 : 0) << ' ' << 100 + 10 * i << '\n';
  }
  w.Close();
}

#else

TEST_F(RecordIOTest, WithoutTheDecoderDecodingSaysWhatToInstall) {
  EXPECT_FALSE(HaveImageDecoder());
  const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  try {
    DecodeImage(png, sizeof png, 3, "x");
    ADD_FAILURE() << "decoded without a decoder";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("libpng-dev"), std::string::npos) << e.what();
  }
}

#endif

}  // namespace
}  // namespace pskv::data
