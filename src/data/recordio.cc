// RecordIO framing, .idx files, image-record headers and ImageRecordIter
// (include/pskv/recordio.h). The format is little-endian on disk; pskv builds only
// for little-endian hosts, so fields are copied with memcpy as they are.
#include "pskv/recordio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <tuple>

#include "pskv/error.h"

namespace pskv::data {

namespace {

constexpr uint32_t kLengthMask = (1u << 29) - 1;
constexpr size_t kHeaderBytes = 24;  // IRHeader: uint32, float32, uint64, uint64

uint64_t Align4(uint64_t n) {
  return (n + 3) & ~uint64_t{3};
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------- RecordFile

struct RecordFile::Impl {
  std::string path;
  int fd = -1;
  uint64_t file_size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> records;  // (offset, key), in offset order

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  // Reads exactly n bytes at `off` (the caller checked the bounds).
  void ReadAt(uint64_t off, void* out, size_t n, const std::string& what) const {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(off));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw IOError(what + ": read failed (" + (got < 0 ? std::strerror(errno) : "end of file") +
                      ")");
      p += got;
      off += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
  }

  // Walks the parts of the record starting at `off`; appends the joined payload to
  // `out` unless it is null. Returns the offset after the record.
  uint64_t Walk(uint64_t off, std::vector<uint8_t>* out, const std::string& what) const {
    for (bool first = true;; first = false) {
      if (off + 8 > file_size)
        throw IOError(what + ": truncated: a record header at byte " + std::to_string(off) +
                      " runs past the end of the file (" + std::to_string(file_size) +
                      " bytes); the file was cut short");
      uint32_t head[2];
      ReadAt(off, head, sizeof head, what);
      if (head[0] != kRecordIOMagic)
        throw IOError(what + ": bad magic " + Hex(head[0]) + " at byte " + std::to_string(off) +
                      " (RecordIO records start with " + Hex(kRecordIOMagic) +
                      "): not a RecordIO file, corrupt, or its .idx does not belong to it");
      const uint32_t cflag = head[1] >> 29, len = head[1] & kLengthMask;
      if (cflag > 3 || (first && cflag >= 2) || (!first && cflag <= 1))
        throw IOError(what + ": part flag " + std::to_string(cflag) + " at byte " +
                      std::to_string(off) + " is out of sequence (corrupt multi-part record)");
      if (off + 8 + len > file_size)
        throw IOError(what + ": length " + std::to_string(len) + " at byte " + std::to_string(off) +
                      " runs past the end of the file (" + std::to_string(file_size) +
                      " bytes): truncated or corrupt");
      if (out) {
        const size_t at = out->size();
        out->resize(at + len);
        if (len) ReadAt(off + 8, out->data() + at, len, what);
      }
      off += 8 + Align4(len);
      if (cflag == 0 || cflag == 3) return std::min(off, file_size);
      if (out) {  // the writer dropped an aligned magic here
        const uint32_t m = kRecordIOMagic;
        const auto* b = reinterpret_cast<const uint8_t*>(&m);
        out->insert(out->end(), b, b + 4);
      }
    }
  }
};

RecordFile::RecordFile(const std::string& rec_path, const std::string& idx_path)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.path = rec_path;
  d.fd = ::open(rec_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (d.fd < 0)
    throw IOError("cannot open RecordIO file '" + rec_path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(d.fd, &st) != 0)
    throw IOError("cannot stat '" + rec_path + "': " + std::strerror(errno));
  d.file_size = static_cast<uint64_t>(st.st_size);
  if (idx_path.empty()) {
    for (uint64_t off = 0; off < d.file_size;) {
      const uint64_t key = d.records.size();
      d.records.emplace_back(off, key);
      off = d.Walk(off, nullptr, Describe(static_cast<int64_t>(key)));
    }
    return;
  }
  std::ifstream idx(idx_path);
  if (!idx) throw IOError("cannot open RecordIO index '" + idx_path + "': " + std::strerror(errno));
  std::string line;
  for (int64_t lineno = 1; std::getline(idx, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream in(line);
    long long key = -1, off = -1;
    std::string rest;
    if (!(in >> key >> off) || key < 0 || off < 0 || (in >> rest))
      throw IOError("'" + idx_path + "' line " + std::to_string(lineno) + ": '" + line +
                    "' is not 'key<TAB>offset' (is this the .idx of '" + rec_path + "'?)");
    if (static_cast<uint64_t>(off) + 8 > d.file_size)
      throw IOError("'" + idx_path + "' line " + std::to_string(lineno) + ": offset " +
                    std::to_string(off) + " of key " + std::to_string(key) +
                    " is past the end of '" + rec_path + "' (" + std::to_string(d.file_size) +
                    " bytes): the .rec is truncated or the .idx belongs to another file");
    d.records.emplace_back(static_cast<uint64_t>(off), static_cast<uint64_t>(key));
  }
  // Offset order, as dmlc's indexed split reads them.
  std::stable_sort(d.records.begin(), d.records.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
}

RecordFile::~RecordFile() = default;
RecordFile::RecordFile(RecordFile&&) noexcept = default;
RecordFile& RecordFile::operator=(RecordFile&&) noexcept = default;

int64_t RecordFile::size() const {
  return static_cast<int64_t>(impl_->records.size());
}

uint64_t RecordFile::key(int64_t i) const {
  if (i < 0 || i >= size())
    throw InvalidArgument("record " + std::to_string(i) + " of '" + impl_->path + "': only " +
                          std::to_string(size()) + " records");
  return impl_->records[static_cast<size_t>(i)].second;
}

std::string RecordFile::Describe(int64_t i) const {
  std::string s = "'" + impl_->path + "' record " + std::to_string(i);
  if (i >= 0 && i < size()) {
    const auto& r = impl_->records[static_cast<size_t>(i)];
    s += " (key " + std::to_string(r.second) + ", byte " + std::to_string(r.first) + ")";
  }
  return s;
}

const std::string& RecordFile::path() const {
  return impl_->path;
}

std::vector<uint8_t> RecordFile::Read(int64_t i) const {
  key(i);  // bounds
  std::vector<uint8_t> out;
  impl_->Walk(impl_->records[static_cast<size_t>(i)].first, &out, Describe(i));
  return out;
}

// ---------------------------------------------------------------- RecordFileWriter

struct RecordFileWriter::Impl {
  std::string rec_path, idx_path;
  std::ofstream rec, idx;
  uint64_t offset = 0;

  void Put(const void* p, size_t n) {
    rec.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    offset += n;
  }
  void Part(uint32_t cflag, const uint8_t* p, uint32_t len) {
    const uint32_t head[2] = {kRecordIOMagic, (cflag << 29) | len};
    Put(head, sizeof head);
    if (len) Put(p, len);
  }
};

RecordFileWriter::RecordFileWriter(const std::string& rec_path, const std::string& idx_path)
    : impl_(std::make_unique<Impl>()) {
  impl_->rec_path = rec_path;
  impl_->idx_path = idx_path;
  impl_->rec.open(rec_path, std::ios::binary | std::ios::trunc);
  if (!impl_->rec) throw IOError("cannot write '" + rec_path + "': " + std::strerror(errno));
  if (!idx_path.empty()) {
    impl_->idx.open(idx_path, std::ios::trunc);
    if (!impl_->idx) throw IOError("cannot write '" + idx_path + "': " + std::strerror(errno));
  }
}

RecordFileWriter::~RecordFileWriter() {
  try {
    Close();
  } catch (const Error&) {  // a destructor cannot report; Close() does
  }
}

void RecordFileWriter::Write(uint64_t key, const std::vector<uint8_t>& payload) {
  Impl& d = *impl_;
  if (!d.rec.is_open()) throw UsageError("RecordFileWriter '" + d.rec_path + "' is closed");
  if (payload.size() > kLengthMask)
    throw InvalidArgument("a RecordIO record holds less than 2^29 bytes; this one has " +
                          std::to_string(payload.size()));
  if (d.idx.is_open()) d.idx << key << '\t' << d.offset << '\n';
  // A magic at an aligned position would look like a record start: split there.
  const auto len = static_cast<uint32_t>(payload.size());
  uint32_t begin = 0;
  for (uint32_t i = 0; i + 4 <= len; i += 4) {
    uint32_t word;
    std::memcpy(&word, payload.data() + i, 4);
    if (word != kRecordIOMagic) continue;
    d.Part(begin == 0 ? 1 : 2, payload.data() + begin, i - begin);
    begin = i + 4;
  }
  d.Part(begin == 0 ? 0 : 3, payload.data() + begin, len - begin);
  static const uint8_t zeros[4] = {0, 0, 0, 0};
  d.Put(zeros, Align4(len) - len);
  if (!d.rec) throw IOError("writing '" + d.rec_path + "' failed: " + std::strerror(errno));
}

void RecordFileWriter::Close() {
  Impl& d = *impl_;
  if (d.rec.is_open()) {
    d.rec.close();
    if (d.rec.fail()) throw IOError("writing '" + d.rec_path + "' failed");
  }
  if (d.idx.is_open()) {
    d.idx.close();
    if (d.idx.fail()) throw IOError("writing '" + d.idx_path + "' failed");
  }
}

// ---------------------------------------------------------------- image records

std::vector<uint8_t> PackImageRecord(ImageRecordHeader h, const std::vector<uint8_t>& encoded) {
  if (!h.labels.empty()) {
    h.flag = static_cast<uint32_t>(h.labels.size());
    h.label = 0;
  } else if (h.flag != 0) {
    throw InvalidArgument("ImageRecordHeader.flag is " + std::to_string(h.flag) +
                          " but labels is empty: flag counts the labels (set labels, or flag 0)");
  }
  std::vector<uint8_t> out(kHeaderBytes + 4 * h.labels.size() + encoded.size());
  uint8_t* p = out.data();
  std::memcpy(p, &h.flag, 4);
  std::memcpy(p + 4, &h.label, 4);
  std::memcpy(p + 8, &h.id, 8);
  std::memcpy(p + 16, &h.id2, 8);
  if (!h.labels.empty()) std::memcpy(p + kHeaderBytes, h.labels.data(), 4 * h.labels.size());
  if (!encoded.empty())
    std::memcpy(p + kHeaderBytes + 4 * h.labels.size(), encoded.data(), encoded.size());
  return out;
}

ImageRecordHeader UnpackImageRecord(const std::vector<uint8_t>& payload, size_t* image_offset,
                                    const std::string& what) {
  ImageRecordHeader h;
  if (payload.size() < kHeaderBytes)
    throw IOError(what + ": " + std::to_string(payload.size()) +
                  " bytes, shorter than an image-record header (24 bytes)");
  std::memcpy(&h.flag, payload.data(), 4);
  std::memcpy(&h.label, payload.data() + 4, 4);
  std::memcpy(&h.id, payload.data() + 8, 8);
  std::memcpy(&h.id2, payload.data() + 16, 8);
  const uint64_t need = kHeaderBytes + 4ull * h.flag;
  if (payload.size() < need)
    throw IOError(what + ": the header announces " + std::to_string(h.flag) +
                  " labels but the record ends after " + std::to_string(payload.size()) +
                  " bytes: labels missing (corrupt record)");
  h.labels.resize(h.flag);
  if (h.flag) std::memcpy(h.labels.data(), payload.data() + kHeaderBytes, 4ull * h.flag);
  if (image_offset) *image_offset = static_cast<size_t>(need);
  return h;
}

// ---------------------------------------------------------------- ImageRecordIter

std::pair<int64_t, int64_t> RecordPartition(int64_t count, int num_parts, int part_index) {
  if (count < 0) throw InvalidArgument("count must be >= 0, got " + std::to_string(count));
  if (num_parts < 1 || part_index < 0 || part_index >= num_parts)
    throw InvalidArgument("part_index must be in [0, num_parts): got part " +
                          std::to_string(part_index) + " of " + std::to_string(num_parts));
  const int64_t step = (count + num_parts - 1) / num_parts;
  return {std::min(count, step * part_index), std::min(count, step * (part_index + 1))};
}

struct ImageRecordIter::Impl {
  ImageRecordOptions o;
  RecordFile file;
  int64_t begin = 0, end = 0;
  std::vector<int64_t> order;
  size_t pos = 0;

  explicit Impl(ImageRecordOptions opt) : o(std::move(opt)), file(o.path_imgrec, o.path_imgidx) {}

  // Decodes record i into slot j of `b`.
  void Load(int64_t i, int64_t j, ImageBatch* b) const {
    const std::string what = file.Describe(i);
    const auto payload = file.Read(i);
    size_t at = 0;
    const ImageRecordHeader h = UnpackImageRecord(payload, &at, what);
    float* lab = b->labels.data() + j * o.label_width;
    if (h.flag == 0) {
      if (o.label_width != 1)
        throw IOError(what + ": one label (header flag 0), label_width is " +
                      std::to_string(o.label_width) + ": labels missing");
      lab[0] = h.label;
    } else {
      if (static_cast<int64_t>(h.labels.size()) < o.label_width)
        throw IOError(what + ": " + std::to_string(h.labels.size()) + " labels, label_width is " +
                      std::to_string(o.label_width) + ": labels missing");
      std::copy_n(h.labels.begin(), o.label_width, lab);
    }
    const DecodedImage img =
        DecodeImage(payload.data() + at, payload.size() - at, o.channels, what);
    if (img.rows != o.height || img.cols != o.width)
      throw IOError(what + ": the image is " + std::to_string(img.rows) + "x" +
                    std::to_string(img.cols) + " pixels, data_shape wants " +
                    std::to_string(o.height) + "x" + std::to_string(o.width) +
                    " (this reader does not resize: write the records at that size)");
    const int64_t plane = int64_t{o.height} * o.width;
    float* out = b->data.data() + j * plane * o.channels;
    for (int c = 0; c < o.channels; ++c) {
      const float m = o.mean[c], s = o.stddev[c];
      for (int64_t p = 0; p < plane; ++p)
        out[c * plane + p] = (static_cast<float>(img.pixels[p * o.channels + c]) - m) / s;
    }
  }
};

ImageRecordIter::ImageRecordIter(ImageRecordOptions options) {
  const auto& o = options;
  if (o.channels != 1 && o.channels != 3)
    throw InvalidArgument("data_shape channels must be 1 or 3, got " + std::to_string(o.channels));
  if (o.height < 1 || o.width < 1 || o.batch_size < 1 || o.label_width < 1)
    throw InvalidArgument("data_shape, batch_size and label_width must be positive");
  for (int c = 0; c < o.channels; ++c)
    if (!(o.stddev[c] > 0))
      throw InvalidArgument("stddev[" + std::to_string(c) + "] must be positive");
  impl_ = std::make_unique<Impl>(std::move(options));
  std::tie(impl_->begin, impl_->end) =
      RecordPartition(impl_->file.size(), impl_->o.num_parts, impl_->o.part_index);
  if (impl_->end <= impl_->begin)
    throw InvalidArgument("part " + std::to_string(impl_->o.part_index) + " of " +
                          std::to_string(impl_->o.num_parts) + " of '" + impl_->o.path_imgrec +
                          "' is empty (" + std::to_string(impl_->file.size()) +
                          " records): use fewer parts");
  Reset(0);
}

ImageRecordIter::~ImageRecordIter() = default;

int64_t ImageRecordIter::size() const {
  return impl_->end - impl_->begin;
}

int64_t ImageRecordIter::batches_per_epoch() const {
  return (size() + impl_->o.batch_size - 1) / impl_->o.batch_size;
}

void ImageRecordIter::Reset(int epoch) {
  Impl& d = *impl_;
  d.order.resize(static_cast<size_t>(d.end - d.begin));
  std::iota(d.order.begin(), d.order.end(), d.begin);
  if (d.o.shuffle) {
    // std::mt19937_64 is specified exactly; the shuffle is our own Fisher-Yates so
    // the order does not depend on the standard library's std::shuffle.
    std::mt19937_64 rng(d.o.seed * 1000003ull + static_cast<uint64_t>(epoch) * 7919ull +
                        static_cast<uint64_t>(d.o.part_index));
    for (size_t i = d.order.size(); i > 1; --i) std::swap(d.order[i - 1], d.order[rng() % i]);
  }
  d.pos = 0;
}

bool ImageRecordIter::Next(ImageBatch* batch) {
  Impl& d = *impl_;
  if (d.pos >= d.order.size()) return false;
  const int64_t left = static_cast<int64_t>(d.order.size() - d.pos);
  const int64_t n = d.o.round_batch ? d.o.batch_size : std::min(d.o.batch_size, left);
  batch->size = n;
  batch->pad = std::max<int64_t>(0, n - left);
  batch->data.resize(static_cast<size_t>(n * d.o.channels * d.o.height * d.o.width));
  batch->labels.resize(static_cast<size_t>(n * d.o.label_width));
  for (int64_t j = 0; j < n; ++j) {  // round_batch: the fill wraps to the epoch's start
    const size_t k = (d.pos + static_cast<size_t>(j)) % d.order.size();
    d.Load(d.order[k], j, batch);
  }
  d.pos += static_cast<size_t>(std::min(n, left));
  return true;
}

}  // namespace pskv::data
