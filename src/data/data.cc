#include "pskv/data.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "pskv/error.h"

namespace pskv::data {

namespace {

// Whole file, gunzipped if it is gzip (gzread reads plain files as they are).
std::vector<uint8_t> ReadMaybeGz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f)
    throw IOError("cannot open '" + path +
                  "' (is the dataset installed? Debian package dataset-fashion-mnist)");
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      gzclose(f);
      throw IOError("'" + path + "' is corrupt (gzip error)");
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  gzclose(f);
  return out;
}

uint32_t BigEndian32(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
         b[at + 3];
}

}  // namespace

ImageDataset ReadIdx(const std::string& images_path, const std::string& labels_path) {
  auto img = ReadMaybeGz(images_path);
  auto lab = ReadMaybeGz(labels_path);
  if (img.size() < 16 || BigEndian32(img, 0) != 0x00000803)
    throw IOError("'" + images_path + "' is not an IDX image file (magic 0x00000803)");
  if (lab.size() < 8 || BigEndian32(lab, 0) != 0x00000801)
    throw IOError("'" + labels_path + "' is not an IDX label file (magic 0x00000801)");
  ImageDataset d;
  d.count = BigEndian32(img, 4);
  const uint32_t rows = BigEndian32(img, 8), cols = BigEndian32(img, 12);
  // Bounded so that the size below cannot wrap (a corrupt header is an IOError).
  if (rows == 0 || cols == 0 || rows > 65535 || cols > 65535)
    throw IOError("'" + images_path + "' has images of " + std::to_string(rows) + " x " +
                  std::to_string(cols) + " pixels: not an image file (corrupt header?)");
  d.rows = static_cast<int>(rows);
  d.cols = static_cast<int>(cols);
  const uint64_t need = 16 + static_cast<uint64_t>(d.count) * d.rows * d.cols;
  if (img.size() != need)
    throw IOError("'" + images_path + "' holds " + std::to_string(img.size()) +
                  " bytes, its header implies " + std::to_string(need));
  if (BigEndian32(lab, 4) != d.count || lab.size() != 8 + static_cast<uint64_t>(d.count))
    throw IOError("'" + labels_path + "' does not have one label per image of '" + images_path +
                  "'");
  d.pixels.assign(img.begin() + 16, img.end());
  d.labels.assign(lab.begin() + 8, lab.end());
  return d;
}

ImageDataset ReadMnistDir(const std::string& dir, bool train) {
  const std::string p = train ? "train" : "t10k";
  return ReadIdx(dir + "/" + p + "-images-idx3-ubyte.gz", dir + "/" + p + "-labels-idx1-ubyte.gz");
}

std::pair<int64_t, int64_t> PartitionRange(int64_t count, int num_parts, int part_index) {
  if (count < 0) throw InvalidArgument("count must be >= 0, got " + std::to_string(count));
  if (num_parts < 1 || part_index < 0 || part_index >= num_parts)
    throw InvalidArgument("part_index must be in [0, num_parts): got part " +
                          std::to_string(part_index) + " of " + std::to_string(num_parts));
  auto at = [&](int p) {
    return static_cast<int64_t>(std::floor(static_cast<double>(count) * p / num_parts));
  };
  return {at(part_index), at(part_index + 1)};
}

int64_t EpochSize(int64_t num_examples, int num_workers, int64_t batch_size) {
  if (num_workers < 1 || batch_size < 1)
    throw InvalidArgument("num_workers and batch_size must be >= 1");
  if (num_examples < 0)
    throw InvalidArgument("num_examples must be >= 0, got " + std::to_string(num_examples));
  const int64_t per = num_examples / num_workers;
  return (per + batch_size - 1) / batch_size;
}

std::vector<int64_t> EpochOrder(int64_t count, int num_parts, int part_index, int64_t batch_size,
                                int64_t epoch_size, uint64_t seed, int epoch, bool shuffle) {
  auto [b, e] = PartitionRange(count, num_parts, part_index);
  if (e <= b) throw InvalidArgument("partition " + std::to_string(part_index) + " is empty");
  std::vector<int64_t> part(static_cast<size_t>(e - b));
  std::iota(part.begin(), part.end(), b);
  std::vector<int64_t> order;
  int64_t want;
  if (batch_size < 1 || epoch_size < 0 || __builtin_mul_overflow(epoch_size, batch_size, &want))
    throw InvalidArgument("EpochOrder needs batch_size >= 1 and epoch_size >= 0 (got " +
                          std::to_string(batch_size) + " and " + std::to_string(epoch_size) + ")");
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(epoch) * 7919ull +
                      static_cast<uint64_t>(part_index));
  while (static_cast<int64_t>(order.size()) < want) {  // wraps around like ResizeIter
    if (shuffle) std::shuffle(part.begin(), part.end(), rng);
    for (int64_t i : part) {
      if (static_cast<int64_t>(order.size()) == want) break;
      order.push_back(i);
    }
  }
  return order;
}

std::vector<std::pair<int64_t, int64_t>> SplitBatch(int64_t size, int k, bool even_split) {
  if (k < 1) throw InvalidArgument("SplitBatch needs at least one device");
  if (size < 0)
    throw InvalidArgument("SplitBatch of a batch of " + std::to_string(size) +
                          " examples: the size must be >= 0");
  if (even_split && size % k != 0)
    throw InvalidArgument("batch of " + std::to_string(size) + " cannot be split evenly over " +
                          std::to_string(k) + " devices; use a batch size that is a multiple of " +
                          std::to_string(k) + " or even_split=false");
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t q = size / k, r = size % k;
  int64_t begin = 0;
  for (int i = 0; i < k; ++i) {
    const int64_t n = q + (i < r ? 1 : 0);
    out.emplace_back(begin, begin + n);
    begin += n;
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> SplitByWorkload(int64_t batch,
                                                         const std::vector<double>& w) {
  if (w.empty()) throw InvalidArgument("work_load_list is empty");
  if (batch < 0)
    throw InvalidArgument("SplitByWorkload of a batch of " + std::to_string(batch) +
                          " examples: the size must be >= 0");
  double total = 0;
  for (double x : w) {
    if (!(x >= 0)) throw InvalidArgument("work_load_list entries must be >= 0");
    total += x;
  }
  if (total <= 0) throw InvalidArgument("work_load_list must not be all zero");
  std::vector<int64_t> sizes;
  int64_t sum = 0;
  for (double x : w) {
    const int64_t b = static_cast<int64_t>(
        std::nearbyint(x * static_cast<double>(batch) / total));  // half to even
    sizes.push_back(b);
    sum += b;
  }
  if (sum < batch) sizes.back() += batch - sum;
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int64_t b : sizes) {
    const int64_t end = std::min(begin + b, batch);
    if (end <= begin) throw InvalidArgument("Too many slices. Some splits are empty.");
    out.emplace_back(begin, end);
    begin = end;
  }
  return out;
}

}  // namespace pskv::data
