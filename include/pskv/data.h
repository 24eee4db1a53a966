// Data-parallel helpers (spec section 7): reading MNIST-format IDX files,
// partitioning a dataset over workers, equal batch counts in sync mode, and
// splitting a batch over local devices.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pskv::data {

/// An image-classification dataset held in memory: `count` images of rows x cols
/// uint8 pixels, and one uint8 label each.
struct ImageDataset {
  int64_t count = 0;
  int rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  ///< count * rows * cols, row-major
  std::vector<uint8_t> labels;  ///< count
};

/// Reads an IDX image file and its label file (gzip-compressed or plain, chosen by
/// content). IOError if a file is missing or malformed (the message names it).
ImageDataset ReadIdx(const std::string& images_path, const std::string& labels_path);
/// Reads `<dir>/train-images-idx3-ubyte.gz` + labels (train) or the t10k files.
ImageDataset ReadMnistDir(const std::string& dir, bool train);

/// Records [begin, end) of part `part_index` of `num_parts` (MXNet's MNISTIter:
/// floor(count*p/num_parts) .. floor(count*(p+1)/num_parts)). InvalidArgument
/// unless 0 <= part_index < num_parts.
std::pair<int64_t, int64_t> PartitionRange(int64_t count, int num_parts, int part_index);

/// Batches per epoch that every worker runs in sync mode (as MXNet):
/// ceil(floor(num_examples / num_workers) / batch_size).
int64_t EpochSize(int64_t num_examples, int num_workers, int64_t batch_size);

/// The sample order of one worker's epoch: its partition, shuffled with `seed` and
/// `epoch` (same seed -> same order), exactly `epoch_size * batch_size` indices —
/// wrapping around (MXNet's ResizeIter) or cut short so every worker runs the
/// same number of batches.
std::vector<int64_t> EpochOrder(int64_t count, int num_parts, int part_index, int64_t batch_size,
                                int64_t epoch_size, uint64_t seed, int epoch, bool shuffle);

/// Slices of a batch of `size` over k devices (as Gluon's split_data): the first size % k
/// slices get one more. `even_split` requires size % k == 0 (InvalidArgument).
std::vector<std::pair<int64_t, int64_t>> SplitBatch(int64_t size, int k, bool even_split = true);

/// Slices of a batch by per-device workloads (as MXNet's workload split): b_i = round(w_i*b/sum w)
/// (round half to even), any deficit added to the last device; InvalidArgument if
/// a slice is empty ("Too many slices").
std::vector<std::pair<int64_t, int64_t>> SplitByWorkload(int64_t batch,
                                                         const std::vector<double>& workloads);

}  // namespace pskv::data
