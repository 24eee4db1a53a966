// IdMap: an open-addressing hash map from u64 ids (any value) to two u32 fields, for
// the embedding table's row index and its exact admission counter.
//
// One 16-byte entry per bucket {id, a, b}; a == 0 marks an empty bucket, so callers
// store a non-zero `a` (the row index: slot + 1; the counter: count >= 1). Linear
// probing, at most 3/4 full (the table doubles beyond), deletion by backward shift
// (no tombstones, so probe lengths do not grow with churn). Buckets come from one
// allocation that only grows by doubling: no allocation per entry.
// Not thread-safe (one shard, one thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace pskv::embedding {

/// A 64-bit mixer (MurmurHash3's fmix64): a bijection whose every output bit
/// depends on every input bit.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

class IdMap {
 public:
  struct Entry {
    uint64_t id;
    uint32_t a;  // 0: empty
    uint32_t b;
  };

  IdMap() = default;
  IdMap(IdMap&&) = default;
  IdMap& operator=(IdMap&&) = default;

  size_t size() const { return size_; }
  size_t buckets() const { return mask_ + (buckets_ ? 1 : 0); }
  size_t bytes() const { return buckets() * sizeof(Entry); }

  Entry* Find(uint64_t id) const {
    if (!buckets_) return nullptr;
    for (size_t i = Home(id);; i = (i + 1) & mask_) {
      Entry& e = buckets_[i];
      if (e.a == 0) return nullptr;
      if (e.id == id) return &e;
    }
  }
  /// The entry of `id`, inserted with a = b = 0 if absent (*inserted says which): the
  /// caller must set a != 0 before the next call of any other method.
  Entry& FindOrInsert(uint64_t id, bool* inserted) {
    if ((size_ + 1) * 4 > buckets() * 3) Grow();
    for (size_t i = Home(id);; i = (i + 1) & mask_) {
      Entry& e = buckets_[i];
      if (e.a == 0) {
        e.id = id;
        e.b = 0;
        ++size_;
        *inserted = true;
        return e;
      }
      if (e.id == id) {
        *inserted = false;
        return e;
      }
    }
  }
  /// Removes `e` (an entry Find returned).
  void Erase(Entry* e) {
    size_t i = static_cast<size_t>(e - buckets_.get());
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      Entry& n = buckets_[j];
      if (n.a == 0) break;
      // n may fill the hole at i if its home is not in (i, j] (cyclically).
      if (((j - Home(n.id)) & mask_) >= ((j - i) & mask_)) {
        buckets_[i] = n;
        i = j;
      }
    }
    buckets_[i].a = 0;
    --size_;
  }
  /// Calls fn(Entry&) for every entry; fn must not insert or erase.
  template <typename F>
  void ForEach(F&& fn) const {
    for (size_t i = 0; i < buckets(); ++i)
      if (buckets_[i].a != 0) fn(buckets_[i]);
  }
  /// Removes every entry, keeping the buckets.
  void Clear() {
    for (size_t i = 0; i < buckets(); ++i) buckets_[i].a = 0;
    size_ = 0;
  }
  /// Removes every entry and frees the buckets.
  void Reset() {
    buckets_.reset();
    mask_ = 0;
    size_ = 0;
  }
  /// Buckets an IdMap holding `n` entries has at most (for memory projections).
  static size_t BucketsFor(size_t n) {
    size_t b = 16;
    while (n * 4 > b * 3) b *= 2;
    return b;
  }

 private:
  size_t Home(uint64_t id) const { return static_cast<size_t>(Mix64(id ^ kSalt)) & mask_; }
  void Grow() {
    const size_t old = buckets();
    const size_t nb = old ? old * 2 : 16;
    std::unique_ptr<Entry[]> prev = std::move(buckets_);
    buckets_ = std::make_unique<Entry[]>(nb);  // value-initialised: a == 0
    mask_ = nb - 1;
    for (size_t i = 0; i < old; ++i) {
      const Entry& e = prev[i];
      if (e.a == 0) continue;
      size_t j = Home(e.id);
      while (buckets_[j].a != 0) j = (j + 1) & mask_;
      buckets_[j] = e;
    }
  }

  // Not the shard function's salt: within one shard the shard hash is constant in
  // some bits, the bucket hash must not be.
  static constexpr uint64_t kSalt = 0x9e3779b97f4a7c15ULL;
  std::unique_ptr<Entry[]> buckets_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace pskv::embedding
