// The dynamic embedding table's rows, pushes, pulls and evictions (table.h); its
// checkpoints are in table_io.cc.
//
// Memory layout: rows live in chunks of kChunkRows blocks of stride_ bytes, each
// block = Head (32 bytes) + width values + slots * width optimizer state, all float32
// and contiguous; a freed block is reused by the next new row. index_ maps an id to
// its block. Nothing is allocated per row.
#include "embedding/table.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "device/kernel_ops.h"
#include "kvstore/optimizer_rules.h"
#include "pskv/error.h"

namespace pskv::embedding {

namespace {
constexpr uint32_t kChunkRows = 1024;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kShardSalt = 0xd6e8feb86659fd93ULL;
}  // namespace

uint32_t ShardOf(uint64_t id, uint32_t num_shards) {
  const unsigned __int128 p =
      static_cast<unsigned __int128>(Mix64(id ^ kShardSalt)) * std::max<uint32_t>(num_shards, 1);
  return static_cast<uint32_t>(p >> 64);
}

}  // namespace pskv::embedding

namespace pskv {

uint32_t EmbeddingShardOf(uint64_t id, uint32_t num_shards) {
  return embedding::ShardOf(id, num_shards);
}

void EmbeddingInitializer::Fill(uint64_t seed, uint64_t id, int64_t width, float* out) const {
  if (kind == Kind::kZeros) {
    std::fill(out, out + width, 0.0f);
    return;
  }
  const uint64_t base = embedding::Mix64(id ^ embedding::Mix64(seed + embedding::kGolden));
  auto bits = [&](uint64_t counter) {
    return embedding::Mix64(base + (counter + 1) * embedding::kGolden);
  };
  for (int64_t j = 0; j < width; ++j) {
    const uint64_t c = static_cast<uint64_t>(j);
    if (kind == Kind::kUniform) {
      const double u = static_cast<double>(bits(c) >> 11) * 0x1.0p-53;  // [0, 1)
      out[j] = static_cast<float>(a + (b - a) * u);
    } else {
      // Box-Muller on counters 2j and 2j+1; u1 in (0, 1].
      const double u1 = static_cast<double>((bits(2 * c) >> 11) + 1) * 0x1.0p-53;
      const double u2 = static_cast<double>(bits(2 * c + 1) >> 11) * 0x1.0p-53;
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      out[j] = static_cast<float>(a + b * z);
    }
  }
}

}  // namespace pskv

namespace pskv::embedding {

struct Table::Chunk {
  std::unique_ptr<char[]> bytes;
};

// A row a push updates: its block (once created), where its summed gradient is.
struct Table::Target {
  uint32_t slot;
  bool create;
  uint64_t id;
  int64_t first;  // index of its first gradient row in the push
  int64_t count;  // gradient rows summed
  size_t acc;     // offset in acc_ of the sum when count > 1
};

namespace {
// The admission settings, once the counting Bloom filter is known to fit the budget:
// checked before the filter is allocated (a server creates tables from the wire).
const AdmissionConfig& WithinBudget(const TableConfig& c) {
  const AdmissionConfig& a = c.admission;
  if (a.mode == AdmissionConfig::Mode::kCountingBloom && a.admit_after > 1 && c.max_bytes > 0 &&
      a.cbf_counters > c.max_bytes)
    throw InvalidArgument("embedding table '" + c.name + "': a counting Bloom filter of " +
                          std::to_string(a.cbf_counters) +
                          " counters (bytes) exceeds max_bytes = " + std::to_string(c.max_bytes) +
                          ": raise max_bytes or size the filter for fewer ids");
  return a;
}
}  // namespace

Table::Table(TableConfig cfg) : cfg_(std::move(cfg)), admission_(WithinBudget(cfg_)) {
  const std::string t = "embedding table '" + cfg_.name + "': ";
  if (cfg_.width <= 0 || cfg_.width > (int64_t{1} << 20))
    throw InvalidArgument(t + "width must be in [1, 2^20], got " + std::to_string(cfg_.width));
  if (cfg_.dtype != DType::kFloat32)
    throw InvalidArgument(t + "rows of dtype " + DTypeName(cfg_.dtype) +
                          " are not supported: use float32 (dtype = float32)");
  cfg_.optimizer.Validate();
  const kops::UpdateKind kind = BuiltinUpdateKind(cfg_.optimizer);
  if (kind == kops::UpdateKind::kNone)
    throw InvalidArgument(t + "optimizer '" + cfg_.optimizer.type +
                          "' is a registered rule; a dynamic table runs the built-in ones "
                          "(sgd, nag, adam, adamw, rmsprop, adagrad)");
  if (!cfg_.optimizer.lr_mult.empty() || !cfg_.optimizer.wd_mult.empty() ||
      !cfg_.optimizer.sum_keys.empty())
    throw InvalidArgument(t +
                          "lr_mult, wd_mult and sum_keys are per dense key and do not apply "
                          "to a dynamic table: leave them empty (set learning_rate / wd)");
  kind_ = static_cast<int>(kind);
  slots_ = FindUpdateRule(cfg_.optimizer.type)->slots(cfg_.optimizer);
  stride_ = (sizeof(Head) + sizeof(float) * static_cast<size_t>(cfg_.width) * (1 + slots_) + 15) &
            ~size_t{15};
  if (cfg_.init.kind == Initializer::Kind::kUniform && !(cfg_.init.a <= cfg_.init.b))
    throw InvalidArgument(t + "uniform initializer needs low <= high");
  if (cfg_.init.kind == Initializer::Kind::kNormal && !(cfg_.init.b >= 0))
    throw InvalidArgument(t + "normal initializer needs a standard deviation >= 0");
  if (cfg_.ttl_steps < 0 || cfg_.capacity < 0)
    throw InvalidArgument(t + "ttl_steps and capacity must be >= 0 (0: none)");
  if (cfg_.capacity > 0 && cfg_.max_bytes > 0) {
    const uint64_t need = ProjectedBytes(cfg_.capacity);
    if (need > cfg_.max_bytes)
      throw InvalidArgument(t + "capacity " + std::to_string(cfg_.capacity) + " rows needs " +
                            std::to_string(need) +
                            " bytes, over max_bytes = " + std::to_string(cfg_.max_bytes) +
                            ": lower the capacity or raise max_bytes");
  }
  stats_.row_bytes = stride_;
}

Table::~Table() = default;

Table::Head* Table::HeadAt(uint32_t slot) const {
  return reinterpret_cast<Head*>(chunks_[slot / kChunkRows]->bytes.get() +
                                 static_cast<size_t>(slot % kChunkRows) * stride_);
}

float* Table::ValuesAt(uint32_t slot) const {
  return reinterpret_cast<float*>(HeadAt(slot) + 1);
}

uint32_t Table::AllocSlot() {
  if (!free_.empty()) {
    const uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  if (top_ == std::numeric_limits<uint32_t>::max() - 1)
    throw UsageError("embedding table '" + cfg_.name +
                     "' holds 2^32 - 1 rows in one shard: use more shards");
  if (top_ == chunks_.size() * kChunkRows) {
    auto c = std::make_unique<Chunk>();
    c->bytes.reset(new char[stride_ * kChunkRows]);
    chunks_.push_back(std::move(c));
  }
  return top_++;
}

void Table::MarkDirty(uint32_t slot) {
  Head* h = HeadAt(slot);
  if (lineage_ == 0 || (h->flags & kDirty)) return;
  h->flags |= kDirty;
  dirty_.push_back(slot);
  // A block freed and reused between saves is listed again: rebuild the list from
  // the flags once it holds twice the live rows (bounded bookkeeping).
  if (dirty_.size() > 2 * index_.size() + 1024) {
    dirty_.clear();
    for (uint32_t s = 0; s < top_; ++s)
      if ((HeadAt(s)->flags & (kLive | kDirty)) == (kLive | kDirty)) dirty_.push_back(s);
  }
}

uint32_t Table::CreateRow(uint64_t id, int64_t step) {
  const uint32_t slot = AllocSlot();
  Head* h = HeadAt(slot);
  *h = Head{id, step, 0, kLive, 0};
  float* w = ValuesAt(slot);
  cfg_.init.Fill(cfg_.seed, id, cfg_.width, w);
  std::fill(w + cfg_.width, w + cfg_.width * (1 + slots_), 0.0f);
  bool inserted;
  IdMap::Entry& e = index_.FindOrInsert(id, &inserted);
  e.a = slot + 1;
  ++stats_.admitted;
  MarkDirty(slot);
  return slot;
}

void Table::FreeRow(uint32_t slot) {
  Head* h = HeadAt(slot);
  index_.Erase(index_.Find(h->id));
  if (lineage_ != 0) evicted_.push_back(h->id);
  h->flags = 0;
  free_.push_back(slot);
}

void Table::ExpireRows(int64_t now) {
  last_sweep_ = now;
  if (cfg_.ttl_steps <= 0) return;
  for (uint32_t s = 0; s < top_; ++s) {
    Head* h = HeadAt(s);
    if ((h->flags & kLive) && now - h->last_step >= cfg_.ttl_steps) {
      FreeRow(s);
      ++stats_.evicted_ttl;
    }
  }
  admission_.Expire(now, cfg_.ttl_steps);
}

void Table::EvictForCapacity(int64_t needed) {
  struct Cand {
    int64_t last_step;
    uint64_t id;
    uint32_t slot;
  };
  std::vector<Cand> c;
  c.reserve(index_.size());
  for (uint32_t s = 0; s < top_; ++s) {
    const Head* h = HeadAt(s);
    if (!(h->flags & kLive)) continue;
    const IdMap::Entry* b = batch_.Find(h->id);
    if (b && b->a >= 2) continue;  // a row of this push
    c.push_back({h->last_step, h->id, s});
  }
  needed = std::min<int64_t>(needed, static_cast<int64_t>(c.size()));
  auto older = [](const Cand& x, const Cand& y) {
    return x.last_step != y.last_step ? x.last_step < y.last_step : x.id < y.id;
  };
  std::nth_element(c.begin(), c.begin() + needed, c.end(), older);
  for (int64_t i = 0; i < needed; ++i) FreeRow(c[static_cast<size_t>(i)].slot);
  stats_.evicted_capacity += needed;
}

uint64_t Table::ProjectedBytes(int64_t rows) const {
  const uint64_t r = static_cast<uint64_t>(rows);
  const uint64_t chunk_rows = (r + kChunkRows - 1) / kChunkRows * kChunkRows;
  const uint64_t arena = std::max<uint64_t>(chunks_.size() * kChunkRows, chunk_rows) * stride_;
  const uint64_t index =
      std::max<uint64_t>(index_.buckets(), IdMap::BucketsFor(r)) * sizeof(IdMap::Entry);
  return arena + index + admission_.bytes();
}

void Table::Push(int64_t step, const uint64_t* ids, int64_t n, const float* grads) {
  if (step < 0 || n < 0)
    throw InvalidArgument("embedding table '" + cfg_.name + "': push with step " +
                          std::to_string(step) + " and " + std::to_string(n) +
                          " ids (both must be >= 0)");
  step_ = std::max(step_, step);
  if (cfg_.ttl_steps > 0 && step_ - last_sweep_ >= std::max<int64_t>(1, cfg_.ttl_steps / 8))
    ExpireRows(step_);
  const Resolved r = Resolve(ids, n, grads);
  const int64_t evict = CheckRoom(r);
  Commit(step, ids, n, grads, evict, r.dropped);
}

// 1. Resolve every id (nothing changes yet): a row, a row to create, or dropped.
// batch_: id -> a = 1 (no row) or target index + 2; b = sightings before admission.
Table::Resolved Table::Resolve(const uint64_t* ids, int64_t n, const float* grads) {
  const int64_t w = cfg_.width;
  batch_.Clear();
  targets_.clear();
  acc_.clear();
  const uint32_t admit_after = admission_.enabled() ? cfg_.admission.admit_after : 1;
  Resolved r;
  auto add = [&](Target& t, int64_t i) {
    const float* g = grads + i * w;
    if (t.count == 0) {
      t.first = i;
    } else {
      if (t.count == 1) {
        t.acc = acc_.size();
        acc_.insert(acc_.end(), grads + t.first * w, grads + (t.first + 1) * w);
      }
      float* a = acc_.data() + t.acc;
      for (int64_t j = 0; j < w; ++j) a[j] += g[j];
    }
    ++t.count;
  };
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t id = ids[i];
    bool inserted;
    IdMap::Entry& e = batch_.FindOrInsert(id, &inserted);
    if (!inserted && e.a >= 2) {
      add(targets_[e.a - 2], i);
      continue;
    }
    e.a = 1;
    if (inserted) {
      if (const IdMap::Entry* row = index_.Find(id)) {
        targets_.push_back({row->a - 1, false, id, 0, 0, 0});
        e.a = static_cast<uint32_t>(targets_.size() + 1);
        add(targets_.back(), i);
        continue;
      }
      ++r.unrowed;
      if (admission_.enabled() && admission_.Count(id) == 0) ++r.new_pending;
    }
    const uint64_t seen = (admit_after > 1 ? admission_.Count(id) : 0) + uint64_t{e.b};
    if (seen + 1 >= admit_after) {
      targets_.push_back({0, true, id, 0, 0, 0});
      e.a = static_cast<uint32_t>(targets_.size() + 1);
      add(targets_.back(), i);
      ++r.creates;
    } else {
      ++e.b;
      ++r.dropped;
    }
  }
  return r;
}

// 2. Room: capacity (LRU eviction) and the memory budget, checked before any change.
// Returns the rows to evict.
int64_t Table::CheckRoom(const Resolved& r) const {
  const int64_t live = static_cast<int64_t>(index_.size());
  int64_t evict = 0;
  if (cfg_.capacity > 0 && live + r.creates > cfg_.capacity) {
    const int64_t pushed_live = static_cast<int64_t>(targets_.size()) - r.creates;
    if (r.creates + pushed_live > cfg_.capacity)
      throw UsageError("embedding table '" + cfg_.name + "': one push of " +
                       std::to_string(r.creates + pushed_live) +
                       " distinct ids with rows exceeds the capacity of " +
                       std::to_string(cfg_.capacity) +
                       " rows: raise the capacity or push smaller batches; the push was not "
                       "applied");
    evict = std::min(live - pushed_live, live + r.creates - cfg_.capacity + cfg_.capacity / 32);
  }
  if (cfg_.max_bytes > 0) {
    uint64_t need = ProjectedBytes(live - evict + r.creates);
    // Growth of the exact counter and of its record of changes (for the next delta).
    auto growth = [](const IdMap& m, size_t n) {
      const size_t b = IdMap::BucketsFor(n);
      return (b - std::min(b, m.buckets())) * sizeof(IdMap::Entry);
    };
    if (admission_.config().mode == AdmissionConfig::Mode::kExact && admission_.enabled()) {
      need += growth(admission_.exact(), admission_.pending() + static_cast<size_t>(r.new_pending));
      if (admission_.tracking())
        need += growth(admission_.changed_ids(),
                       admission_.changed_ids().size() + static_cast<size_t>(r.unrowed));
    }
    if (need > cfg_.max_bytes)
      throw UsageError(
          "embedding table '" + cfg_.name + "' would need " + std::to_string(need) + " bytes for " +
          std::to_string(live - evict + r.creates) +
          " rows, over its memory budget max_bytes = " + std::to_string(cfg_.max_bytes) +
          ": raise max_bytes, set a capacity (LRU eviction) or ttl_steps, or "
          "admit fewer ids (admission.admit_after); the push was not applied");
  }
  return evict;
}

// 3. Apply: evict, count sightings, create rows, update.
void Table::Commit(int64_t step, const uint64_t* ids, int64_t n, const float* grads, int64_t evict,
                   int64_t dropped) {
  if (evict > 0) EvictForCapacity(evict);
  stats_.dropped_grads += dropped;
  if (admission_.enabled()) {
    // In order of first appearance: the CBF's conservative update is order-dependent.
    for (int64_t i = 0; i < n; ++i) {
      IdMap::Entry* e = batch_.Find(ids[i]);
      if (e->a == 1) {
        admission_.Add(ids[i], e->b, step);
        e->b = 0;
      } else if (targets_[e->a - 2].create) {
        admission_.Admitted(ids[i]);
      }
    }
  }
  for (Target& t : targets_)
    if (t.create) t.slot = CreateRow(t.id, step);
  ApplyUpdates(step, grads);
}

void Table::ApplyUpdates(int64_t step, const float* grads) {
  const OptimizerConfig& c = cfg_.optimizer;
  const double lr = c.lr_schedule.Rate(c.learning_rate, step);
  const int64_t w = cfg_.width;
  const auto kind = static_cast<kops::UpdateKind>(kind_);
  kops::DispatchUpdate(kind, [&](auto tag) {
    constexpr kops::UpdateKind K = decltype(tag)::kind;
    constexpr bool kPerRow = K == kops::UpdateKind::kAdam || K == kops::UpdateKind::kAdamW;
    kops::UpdateScalars sc = UpdateScalarsFor(K, c, UpdateStep{lr, c.wd, 1});
    // Adam's scalars depend on the row's t (two pow()s): computed once per t per push.
    struct Cached {
      int64_t t = -1;
      kops::UpdateScalars sc;
    };
    std::array<Cached, kPerRow ? 256 : 1> cache{};
    float* slot[3] = {nullptr, nullptr, nullptr};
    const size_t nt = targets_.size();
    for (size_t k = 0; k < nt; ++k) {
      const Target& t = targets_[k];
      if (k + 1 < nt) __builtin_prefetch(HeadAt(targets_[k + 1].slot));
      Head* h = HeadAt(t.slot);
      float* v = reinterpret_cast<float*>(h + 1);
      for (int s = 0; s < slots_; ++s) slot[s] = v + (s + 1) * w;
      const float* g = t.count == 1 ? grads + t.first * w : acc_.data() + t.acc;
      ++h->t;
      if constexpr (kPerRow) {
        Cached& e = cache[static_cast<size_t>(h->t) & 255];
        if (e.t != h->t) e = {h->t, UpdateScalarsFor(K, c, UpdateStep{lr, c.wd, h->t})};
        sc = e.sc;
      }
      for (int64_t j = 0; j < w; ++j) kops::UpdateAt<K>(sc, g, v, slot, j);
      h->last_step = step;
      MarkDirty(t.slot);
    }
  });
}

void Table::Push(int64_t step, const NDArray& ids, const NDArray& grads) {
  const std::string t = "embedding table '" + cfg_.name + "': ";
  if (ids.dtype() != DType::kInt64)
    throw InvalidArgument(t + "ids are " + DTypeName(ids.dtype()) +
                          ": ids are int64 (a u64 id as its bits); cast them to int64");
  if (grads.dtype() != cfg_.dtype)
    throw ShapeError(t + "gradients are " + DTypeName(grads.dtype()) + " but the rows are " +
                     DTypeName(cfg_.dtype) + ": cast the gradients to " + DTypeName(cfg_.dtype));
  if (grads.shape() != Shape{ids.size(), cfg_.width})
    throw ShapeError(t + "gradients of shape " + ShapeToString(grads.shape()) + " for " +
                     std::to_string(ids.size()) + " ids; the table's rows have " +
                     std::to_string(cfg_.width) + " elements, so the shape must be (" +
                     std::to_string(ids.size()) + ", " + std::to_string(cfg_.width) + ")");
  if (ids.device().is_cuda() || grads.device().is_cuda())
    throw UsageError(t + "ids and gradients must be in host memory (copy them with To(CPU))");
  Push(step, reinterpret_cast<const uint64_t*>(ids.raw()), ids.size(), grads.data<float>());
}

void Table::Pull(const uint64_t* ids, int64_t n, float* out) {
  const int64_t w = cfg_.width;
  for (int64_t i = 0; i < n; ++i) {
    float* o = out + i * w;
    if (const IdMap::Entry* e = index_.Find(ids[i])) {
      std::memcpy(o, ValuesAt(e->a - 1), static_cast<size_t>(w) * sizeof(float));
      ++stats_.pulled_rows;
    } else {
      if (cfg_.unadmitted_pull == TableConfig::UnadmittedPull::kZeros)
        std::fill(o, o + w, 0.0f);
      else
        cfg_.init.Fill(cfg_.seed, ids[i], w, o);
      ++stats_.pulled_defaults;
    }
  }
}

void Table::Pull(const NDArray& ids, NDArray* out) {
  const std::string t = "embedding table '" + cfg_.name + "': ";
  if (ids.dtype() != DType::kInt64)
    throw InvalidArgument(t + "ids are " + DTypeName(ids.dtype()) +
                          ": ids are int64 (a u64 id as its bits); cast them to int64");
  if (out->dtype() != cfg_.dtype || out->shape() != Shape{ids.size(), cfg_.width})
    throw ShapeError(t + "pull into " + DTypeName(out->dtype()) + " " +
                     ShapeToString(out->shape()) + ": the rows are " + DTypeName(cfg_.dtype) +
                     " of " + std::to_string(cfg_.width) + " elements, so pull into (" +
                     std::to_string(ids.size()) + ", " + std::to_string(cfg_.width) + ") " +
                     DTypeName(cfg_.dtype));
  if (ids.device().is_cuda() || out->device().is_cuda())
    throw UsageError(t + "ids and the output must be in host memory");
  Pull(reinterpret_cast<const uint64_t*>(ids.raw()), ids.size(), out->data<float>());
}

TableStats Table::Stats() const {
  TableStats s = stats_;
  s.live = static_cast<int64_t>(index_.size());
  s.pending_ids = static_cast<int64_t>(admission_.pending());
  s.memory_bytes = chunks_.size() * kChunkRows * stride_ + index_.bytes() + admission_.bytes();
  s.row_bytes = stride_;
  return s;
}

bool Table::Contains(uint64_t id) const {
  return index_.Find(id) != nullptr;
}

bool Table::Row(uint64_t id, RowView* out) const {
  const IdMap::Entry* e = index_.Find(id);
  if (!e) return false;
  const Head* h = HeadAt(e->a - 1);
  const float* v = reinterpret_cast<const float*>(h + 1);
  *out = RowView{v, v + cfg_.width, h->t, h->last_step};
  return true;
}

void Table::ForEachRow(const std::function<void(uint64_t, const RowView&)>& fn) const {
  for (uint32_t s = 0; s < top_; ++s) {
    const Head* h = HeadAt(s);
    if (!(h->flags & kLive)) continue;
    const float* v = reinterpret_cast<const float*>(h + 1);
    fn(h->id, RowView{v, v + cfg_.width, h->t, h->last_step});
  }
}

void Table::Clear() {
  chunks_.clear();
  top_ = 0;
  free_.clear();
  index_.Reset();
  admission_.Clear();
  step_ = last_sweep_ = 0;
  stats_ = TableStats{};
  stats_.row_bytes = stride_;
  dirty_.clear();
  evicted_.clear();
  lineage_ = seq_ = 0;
}

}  // namespace pskv::embedding
