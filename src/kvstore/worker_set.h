// WorkerSet: the workers (by node id) that pushed in a key's open sync round, as a bit
// per worker rank, so that a round costs no allocation (a std::set allocated a node
// per push of every key). Not thread-safe: owned by its key's state.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "protocol/message.h"

namespace pskv {

class WorkerSet {
 public:
  bool count(int id) const {
    const size_t r = Rank(id);
    return r / 64 <= more_.size() && ((Word(r / 64) >> (r % 64)) & 1);
  }
  void insert(int id) {
    const size_t r = Rank(id);
    if (r / 64 > more_.size()) more_.resize(r / 64, 0);
    uint64_t& w = r < 64 ? first_ : more_[r / 64 - 1];
    if (!((w >> (r % 64)) & 1)) ++size_;
    w |= uint64_t{1} << (r % 64);
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() {
    first_ = 0;
    std::fill(more_.begin(), more_.end(), 0);
    size_ = 0;
  }

 private:
  static size_t Rank(int id) { return static_cast<size_t>(RankOfId(id)); }
  uint64_t Word(size_t i) const { return i == 0 ? first_ : more_[i - 1]; }
  uint64_t first_ = 0;          // ranks 0..63, inline (no second cache miss)
  std::vector<uint64_t> more_;  // ranks 64.., a word per 64
  size_t size_ = 0;
};

}  // namespace pskv
