// The worker's cache of hot embedding rows (row_cache.h): LFU with aging, staleness by
// the step a row was fetched at.
#include "embedding/row_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "pskv/error.h"

namespace pskv::embedding {

RowCache::RowCache(RowCacheConfig cfg) : cfg_(cfg) {
  if (cfg_.width <= 0 || cfg_.capacity < 1 || cfg_.staleness < 0 || cfg_.aging_steps < 1)
    throw InvalidArgument(
        "row cache: width and capacity must be >= 1, staleness >= 0 and "
        "aging_steps >= 1 (got width " +
        std::to_string(cfg_.width) + ", capacity " + std::to_string(cfg_.capacity) +
        ", staleness " + std::to_string(cfg_.staleness) + ", aging_steps " +
        std::to_string(cfg_.aging_steps) + ")");
}

uint32_t RowCache::Aged(const Meta& m, uint32_t epoch) const {
  const uint32_t d = epoch - m.epoch;
  return d >= 32 ? 0 : m.count >> d;
}

const std::vector<uint64_t>& RowCache::Plan(const uint64_t* ids, int64_t n, int64_t step) {
  if (step < step_)
    throw InvalidArgument("row cache: plan at step " + std::to_string(step) +
                          " after a plan at step " + std::to_string(step_) +
                          ": steps must not go back");
  step_ = step;
  const auto epoch = static_cast<uint32_t>(step / cfg_.aging_steps);
  fetch_.clear();
  batch_.Clear();
  for (int64_t i = 0; i < n; ++i) {
    bool inserted;
    IdMap::Entry& b = batch_.FindOrInsert(ids[i], &inserted);
    b.a = 1;
    if (!inserted) continue;
    ++stats_.planned;
    const IdMap::Entry* e = index_.Find(ids[i]);
    if (!e) {
      fetch_.push_back(ids[i]);
      continue;
    }
    Meta& m = meta_[e->a - 1];
    m.count = std::min<uint32_t>(Aged(m, epoch), UINT32_MAX - 1) + 1;
    m.epoch = epoch;
    m.last_used = step;
    if (step - m.fetched > cfg_.staleness)
      fetch_.push_back(ids[i]);
    else
      ++stats_.hits;
  }
  return fetch_;
}

void RowCache::Fill(const uint64_t* ids, int64_t n, const float* rows, const int64_t* versions) {
  const size_t w = static_cast<size_t>(cfg_.width);
  const auto epoch = static_cast<uint32_t>(std::max<int64_t>(step_, 0) / cfg_.aging_steps);
  for (int64_t i = 0; i < n; ++i) {
    bool inserted;
    IdMap::Entry& e = index_.FindOrInsert(ids[i], &inserted);
    if (inserted) {
      uint32_t slot;
      if (!free_.empty()) {
        slot = free_.back();
        free_.pop_back();
      } else {
        slot = static_cast<uint32_t>(meta_.size());
        meta_.emplace_back();
        rows_.resize(rows_.size() + w);
      }
      e.a = slot + 1;
      meta_[slot] = Meta{ids[i], 0, 0, step_, 1, epoch};
    }
    Meta& m = meta_[e.a - 1];
    m.version = versions[i];
    m.fetched = step_;
    m.last_used = step_;
    std::memcpy(rows_.data() + (e.a - 1) * w, rows + static_cast<size_t>(i) * w, w * sizeof(float));
    ++stats_.fetched;
  }
  if (static_cast<int64_t>(index_.size()) > cfg_.capacity) Evict();
}

void RowCache::Evict() {
  const int64_t target = cfg_.capacity - cfg_.capacity / 32;
  const auto epoch = static_cast<uint32_t>(std::max<int64_t>(step_, 0) / cfg_.aging_steps);
  struct Cand {
    uint32_t count;
    int64_t last_used;
    uint64_t id;
    uint32_t slot;
  };
  std::vector<Cand> c;
  c.reserve(index_.size());
  index_.ForEach([&](const IdMap::Entry& e) {
    const Meta& m = meta_[e.a - 1];
    if (m.last_used != step_) c.push_back({Aged(m, epoch), m.last_used, m.id, e.a - 1});
  });
  const int64_t excess = static_cast<int64_t>(index_.size()) - target;
  const auto k = static_cast<size_t>(std::min<int64_t>(excess, static_cast<int64_t>(c.size())));
  auto less = [](const Cand& x, const Cand& y) {
    if (x.count != y.count) return x.count < y.count;
    if (x.last_used != y.last_used) return x.last_used < y.last_used;
    return x.id < y.id;
  };
  if (k < c.size())
    std::nth_element(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(k), c.end(), less);
  for (size_t i = 0; i < k; ++i) {
    index_.Erase(index_.Find(c[i].id));
    free_.push_back(c[i].slot);
  }
  stats_.evicted += static_cast<int64_t>(k);
}

void RowCache::Read(const uint64_t* ids, int64_t n, float* out) const {
  const size_t w = static_cast<size_t>(cfg_.width);
  for (int64_t i = 0; i < n; ++i) {
    const IdMap::Entry* e = index_.Find(ids[i]);
    if (!e)
      throw UsageError("row cache: id " + std::to_string(ids[i]) +
                       " is not cached: Plan the step's ids, pull the ids Plan returns and "
                       "Fill them before Read");
    std::memcpy(out + static_cast<size_t>(i) * w, rows_.data() + (e->a - 1) * w, w * sizeof(float));
  }
}

bool RowCache::Version(uint64_t id, int64_t* version, int64_t* fetched_step) const {
  const IdMap::Entry* e = index_.Find(id);
  if (!e) return false;
  *version = meta_[e->a - 1].version;
  if (fetched_step) *fetched_step = meta_[e->a - 1].fetched;
  return true;
}

RowCacheStats RowCache::Stats() const {
  RowCacheStats s = stats_;
  s.cached = static_cast<int64_t>(index_.size());
  return s;
}

}  // namespace pskv::embedding
