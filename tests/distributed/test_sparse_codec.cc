// The row_sparse wire codec (kvstore/distributed/wire/sparse_codec.h): what a worker encodes a
// server decodes, and a server refuses malformed or oversized values (its input is
// whatever arrived on the wire).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "kvstore/distributed/wire/sparse_codec.h"
#include "pskv/error.h"

using namespace pskv;
namespace sw = pskv::dist::sparse_wire;

namespace {

template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A Source over pieces of `bytes` (a received message's values may be split).
sw::Source Pieces(const std::string& bytes, size_t piece) {
  sw::Source s;
  s.size = bytes.size();
  s.copy = [bytes, piece](uint64_t off, uint64_t len, char* out) {
    while (len) {  // copy piece by piece, as Message::CopyVals does across frames
      const uint64_t in_piece = std::min<uint64_t>(len, piece - off % piece);
      std::memcpy(out, bytes.data() + off, in_piece);
      off += in_piece, out += in_piece, len -= in_piece;
    }
  };
  return s;
}

}  // namespace

TEST(SparseCodec, InitRoundTrip) {
  std::vector<float> rows(3 * 4);
  std::iota(rows.begin(), rows.end(), 1.f);
  std::string buf(sw::InitBytes(3, 16), '\0');
  char* end = sw::EncodeInit(buf.data(), 3, 4, rows.data(), 16);
  EXPECT_EQ(end, buf.data() + buf.size());
  const sw::InitHead h = sw::DecodeInitHead(sw::Source::Of(buf), 4);
  EXPECT_EQ(h.rows, 3u);
  EXPECT_EQ(h.row_size, 4u);
  EXPECT_EQ(std::memcmp(buf.data() + 16, rows.data(), 48), 0);
}

TEST(SparseCodec, PushRoundTripWithLocalIds) {
  // Global rows 10, 12, 15 of a server whose range starts at row 10.
  const int64_t ids[] = {10, 12, 15};
  std::vector<float> vals = {1, 2, 3, 4, 5, 6};  // row_size 2
  std::string buf(sw::PushBytes(3, 8), '\0');
  EXPECT_EQ(sw::EncodePush(buf.data(), 2, ids, 3, 10, vals.data(), 8), buf.data() + buf.size());
  for (size_t piece : {size_t{1000}, size_t{7}}) {
    const sw::PushRows r = sw::DecodePush(Pieces(buf, piece), 6, 2, DType::kFloat32);
    EXPECT_EQ(r.ids, (std::vector<int64_t>{0, 2, 5}));
    ASSERT_EQ(r.data.size(), 6);
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(r.data.At(i), vals[static_cast<size_t>(i)]);
  }
  // An empty push (a server's part of a round without rows) is valid.
  std::string empty(sw::PushBytes(0, 8), '\0');
  sw::EncodePush(empty.data(), 2, nullptr, 0, 0, nullptr, 8);
  EXPECT_TRUE(sw::DecodePush(sw::Source::Of(empty), 6, 2, DType::kFloat32).ids.empty());
}

TEST(SparseCodec, PullRoundTrip) {
  const int64_t ids[] = {101, 107};
  std::string req;
  sw::AppendPull(&req, ids, 2, 100);
  sw::AppendPull(&req, ids, 0, 100);  // parts append: the second one is empty
  ASSERT_EQ(req.size(), sw::PullBytes(2) + sw::PullBytes(0));
  const std::string first = req.substr(0, sw::PullBytes(2));
  EXPECT_EQ(sw::DecodePull(sw::Source::Of(first), 8), (std::vector<int64_t>{1, 7}));
  EXPECT_TRUE(sw::DecodePull(sw::Source::Of(req.substr(first.size())), 8).empty());
}

TEST(SparseCodec, InitRejectsMalformed) {
  EXPECT_THROW(sw::DecodeInitHead(sw::Source::Of("short"), 4), InvalidArgument);
  auto head = [](uint64_t rows, uint64_t row_size, size_t body) {
    std::string s;
    Put(&s, rows);
    Put(&s, row_size);
    return s + std::string(body, '\0');
  };
  EXPECT_THROW(sw::DecodeInitHead(sw::Source::Of(head(0, 4, 0)), 4), ShapeError);
  EXPECT_THROW(sw::DecodeInitHead(sw::Source::Of(head(2, 0, 0)), 4), ShapeError);
  EXPECT_THROW(sw::DecodeInitHead(sw::Source::Of(head(2, 2, 15)), 4), ShapeError);
  EXPECT_THROW(sw::DecodeInitHead(sw::Source::Of(head(2, 2, 17)), 4), ShapeError);
  // rows * row_size * 4 overflows to 16: refused by the bound, not by the product.
  EXPECT_THROW(sw::DecodeInitHead(sw::Source::Of(head(1ull << 62, 1, 16)), 4), ShapeError);
  EXPECT_THROW(sw::DecodeInitHead(sw::Source::Of(head(1ull << 32, 1ull << 32, 16)), 4), ShapeError);
  EXPECT_NO_THROW(sw::DecodeInitHead(sw::Source::Of(head(2, 2, 16)), 4));
}

TEST(SparseCodec, PushRejectsMalformed) {
  auto push = [](uint64_t n, uint64_t row_size, std::vector<int64_t> ids, size_t body) {
    std::string s;
    Put(&s, n);
    Put(&s, row_size);
    for (int64_t id : ids) Put(&s, id);
    return s + std::string(body, '\0');
  };
  auto decode = [](const std::string& b) {
    return sw::DecodePush(sw::Source::Of(b), 10, 2, DType::kFloat32);
  };
  EXPECT_THROW(decode("tiny"), InvalidArgument);
  EXPECT_THROW(decode(push(1, 3, {0}, 12)), ShapeError);    // rows of another size
  EXPECT_THROW(decode(push(1, 2, {0}, 7)), ShapeError);     // short body
  EXPECT_THROW(decode(push(11, 2, {}, 0)), ShapeError);     // more rows than the key
  EXPECT_THROW(decode(push(~0ull, 2, {}, 0)), ShapeError);  // a count near 2^64
  EXPECT_THROW(decode(push(2, 2, {3, 3}, 16)), KeyError);   // not unique
  EXPECT_THROW(decode(push(2, 2, {4, 3}, 16)), KeyError);   // not ascending
  EXPECT_THROW(decode(push(1, 2, {10}, 8)), KeyError);      // out of range
  EXPECT_THROW(decode(push(1, 2, {-1}, 8)), KeyError);      // negative
  EXPECT_NO_THROW(decode(push(2, 2, {3, 9}, 16)));
}

TEST(SparseCodec, PullRejectsMalformed) {
  auto pull = [](uint64_t n, std::vector<int64_t> ids) {
    std::string s;
    Put(&s, n);
    for (int64_t id : ids) Put(&s, id);
    return s;
  };
  auto decode = [](const std::string& b) { return sw::DecodePull(sw::Source::Of(b), 10); };
  EXPECT_THROW(decode("abc"), InvalidArgument);
  EXPECT_THROW(decode(pull(2, {1})), InvalidArgument);          // short
  EXPECT_THROW(decode(pull(1, {1, 2})), InvalidArgument);       // long
  EXPECT_THROW(decode(pull(11, {})), InvalidArgument);          // more rows than the key
  EXPECT_THROW(decode(pull(1ull << 61, {})), InvalidArgument);  // 8 + 8n wraps around
  EXPECT_THROW(decode(pull(2, {5, 5})), KeyError);
  EXPECT_THROW(decode(pull(1, {10})), KeyError);
  EXPECT_EQ(decode(pull(2, {0, 9})), (std::vector<int64_t>{0, 9}));
}

TEST(SparseCodec, SourceOfRefusesReadsPastTheEnd) {
  const sw::Source s = sw::Source::Of("12345678");
  char out[16];
  EXPECT_THROW(s.copy(4, 8, out), InvalidArgument);
  EXPECT_NO_THROW(s.copy(0, 8, out));
}
