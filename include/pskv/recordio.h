// MXNet's RecordIO image datasets (`.rec` + `.idx`, what `im2rec` writes and
// `ImageRecordIter` reads): the record framing, the image-record header, JPEG/PNG
// decoding, and an iterator of decoded float batches with MXNet's `num_parts` /
// `part_index` and seeded shuffling.
//
// Start here: ImageRecordIter for batches, RecordFile for raw records,
// RecordFileWriter + PackImageRecord to write a dataset (as mx.recordio.pack_img).
//
// The format (dmlc-core's RecordIO, MXNet's image record):
//   record  = uint32 magic 0xced7230a, uint32 lrecord, payload, zero padding to 4 bytes.
//             lrecord's upper 3 bits are cflag, the lower 29 bits the payload length.
//             A payload holding the magic at a 4-byte-aligned position is split there
//             into parts (cflag 1 first, 2 middle, 3 last; 0 a whole record), the magic
//             itself dropped and restored on reading.
//   payload = IRHeader {uint32 flag, float32 label, uint64 id, uint64 id2} (24 bytes,
//             little-endian), then `flag` float32 labels when flag > 0 (`label` is then
//             unused), then the encoded image (JPEG or PNG).
//   .idx    = text lines "key<TAB>byte offset"; records are read in offset order.
//
// Errors: a malformed file is an IOError naming the file and the record (its
// position and .idx key); bad options are InvalidArgument. Decoding needs libjpeg and
// libpng at build time; without them (HaveImageDecoder() false) decoding throws
// UsageError naming the Debian packages, and the record-level API still works.
//
// Thread safety: the classes hold no shared state; use one object per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pskv::data {

/// The magic number that starts every RecordIO record (part).
inline constexpr uint32_t kRecordIOMagic = 0xced7230a;

/// Random access to the records of a `.rec` file through its `.idx` (or, without an
/// index, through one scan of the file). The whole file is not kept in memory.
class RecordFile {
 public:
  /// Opens `rec_path`; `idx_path` empty scans the file for record boundaries.
  /// IOError if a file is missing, an .idx line is malformed or an offset lies past
  /// the end of the .rec, or (without an index) the file's framing is corrupt.
  explicit RecordFile(const std::string& rec_path, const std::string& idx_path = "");
  ~RecordFile();
  RecordFile(RecordFile&&) noexcept;
  RecordFile& operator=(RecordFile&&) noexcept;

  /// Number of records.
  int64_t size() const;
  /// The .idx key of record `i` (its position when there is no index).
  uint64_t key(int64_t i) const;
  /// The payload of record `i` (parts joined). IOError naming the file, `i` and its
  /// key on a bad magic, a truncated record or a length past the end of the file.
  std::vector<uint8_t> Read(int64_t i) const;
  /// "FILE record I (key K, offset O)", for error messages.
  std::string Describe(int64_t i) const;
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Writes records in RecordIO framing and, if `idx_path` is not empty, the .idx
/// lines. IOError if a file cannot be written.
class RecordFileWriter {
 public:
  RecordFileWriter(const std::string& rec_path, const std::string& idx_path = "");
  ~RecordFileWriter();
  RecordFileWriter(const RecordFileWriter&) = delete;
  RecordFileWriter& operator=(const RecordFileWriter&) = delete;
  /// Appends one record; `key` is its .idx key. InvalidArgument if it is 2^29 bytes
  /// or larger (RecordIO's limit).
  void Write(uint64_t key, const std::vector<uint8_t>& payload);
  /// Flushes and closes both files (also done by the destructor, which cannot report).
  void Close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The header of an image record (MXNet's IRHeader). `labels` holds the flag > 0
/// labels; with flag == 0 the single label is `label`.
struct ImageRecordHeader {
  uint32_t flag = 0;
  float label = 0;
  uint64_t id = 0, id2 = 0;
  std::vector<float> labels;
};

/// Header + labels + `encoded` image as one payload (mx.recordio.pack). A non-empty
/// `labels` sets flag = labels.size().
std::vector<uint8_t> PackImageRecord(ImageRecordHeader header, const std::vector<uint8_t>& encoded);
/// Splits a payload into its header and the offset of the encoded image. IOError
/// (naming `what`) if the payload is shorter than its header and labels.
ImageRecordHeader UnpackImageRecord(const std::vector<uint8_t>& payload, size_t* image_offset,
                                    const std::string& what);

/// A decoded image: rows x cols x channels uint8, interleaved (HWC), RGB order.
struct DecodedImage {
  int rows = 0, cols = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

/// Whether this build decodes JPEG and PNG (libjpeg and libpng were found).
bool HaveImageDecoder();
/// Decodes a JPEG or PNG (chosen by content) to `channels` 1 or 3 (grey is repeated,
/// alpha dropped). IOError naming `what` if the data is neither or corrupt;
/// UsageError if this build has no decoder.
DecodedImage DecodeImage(const uint8_t* data, size_t size, int channels, const std::string& what);

/// The options of ImageRecordIter, named as MXNet's ImageRecordIter's.
struct ImageRecordOptions {
  std::string path_imgrec;
  std::string path_imgidx;                    ///< empty: the .rec is scanned once
  int channels = 3, height = 32, width = 32;  ///< data_shape; images must have it
  int label_width = 1;
  int64_t batch_size = 128;
  int num_parts = 1, part_index = 0;
  bool shuffle = false;
  uint64_t seed = 0;
  /// Fill the last batch from the start of the part (MXNet's round_batch); false:
  /// the last batch is short.
  bool round_batch = true;
  /// Output = (pixel - mean[c]) / stddev[c] (MXNet's mean_r.. and std_r..; the
  /// defaults leave pixels at 0..255).
  float mean[3] = {0, 0, 0};
  float stddev[3] = {1, 1, 1};
};

/// A batch: data [size, channels, height, width] float32 (NCHW, as MXNet's),
/// labels [size, label_width]; `pad` of the records are repeats that filled the last
/// batch (MXNet's DataBatch.pad).
struct ImageBatch {
  int64_t size = 0, pad = 0;
  std::vector<float> data, labels;
};

/// Decoded image batches of one part of a RecordIO dataset.
///
/// Part `part_index` of `num_parts` is MXNet's indexed-RecordIO split: with
/// step = ceil(count / num_parts), records [part_index*step, min(count,
/// (part_index+1)*step)) in file order (a trailing part may be empty, InvalidArgument).
/// With shuffle, each epoch's order is a permutation of the part drawn from (seed,
/// epoch): the same seed gives the same batches.
class ImageRecordIter {
 public:
  explicit ImageRecordIter(ImageRecordOptions options);
  ~ImageRecordIter();
  /// Records in this part.
  int64_t size() const;
  /// Batches per epoch (ceil(size / batch_size)).
  int64_t batches_per_epoch() const;
  /// Starts epoch `epoch` (0 after construction).
  void Reset(int epoch);
  /// The next batch of the epoch; false at its end. IOError naming the file and
  /// record on a corrupt record, an undecodable image, an image whose shape is not
  /// (channels, height, width), or fewer labels than label_width; the iterator then
  /// stays at that batch (the next call fails the same way).
  bool Next(ImageBatch* batch);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Records [begin, end) of part `part_index` of `num_parts` as MXNet's indexed
/// RecordIO split (step = ceil(count / num_parts)). InvalidArgument unless
/// 0 <= part_index < num_parts.
std::pair<int64_t, int64_t> RecordPartition(int64_t count, int num_parts, int part_index);

}  // namespace pskv::data
