#include "kvstore/distributed/worker/key_table.h"

#include <algorithm>

#include "kvstore/kvstore_common.h"
#include "pskv/error.h"

namespace pskv::dist {

void PlaceDense(KeyMeta* m, int store_id, int num_servers, int64_t bigarray_bound,
                const std::vector<int64_t>& shares, int64_t wire_chunk_bytes,
                const std::function<int64_t(int64_t)>& comp_bytes, int64_t per_slice) {
  const int S = num_servers;
  for (auto& c :
       ChunkSlices(PlaceKey(m->key, m->size, S, bigarray_bound, shares),
                   static_cast<int64_t>(DTypeSize(m->dtype)), wire_chunk_bytes, S, per_slice)) {
    const Slice s{c.server, c.offset, c.len};
    m->slices.push_back(s);
    m->ps_keys.push_back(PsKey(ChunkKey(WireKey(store_id, m->key), c.index), s.server, S));
    m->lens.push_back(static_cast<uint64_t>(s.len) * DTypeSize(m->dtype));
    if (comp_bytes) m->comp_lens.push_back(static_cast<uint64_t>(comp_bytes(s.len)));
  }
}

void PlaceRowSparse(KeyMeta* m, int store_id, int num_servers, int64_t bigarray_bound) {
  m->ranges = PlaceRows(m->key, m->rows, m->row_size, num_servers, bigarray_bound);
  for (auto& r : m->ranges)
    m->ps_keys.push_back(PsKey(WireKey(store_id, m->key), r.server, num_servers));
}

std::vector<NDArray> Grouped::Arrays(size_t g, const std::vector<NDArray>& arrays) const {
  std::vector<NDArray> out;
  out.reserve(groups[g].count);
  for (size_t j = 0; j < groups[g].count; ++j) out.push_back(At(g, j, arrays));
  return out;
}

bool Grouped::Has(int key) const {
  auto it = std::lower_bound(groups.begin(), groups.end(), key,
                             [](const Entry& e, int k) { return e.key < k; });
  return it != groups.end() && it->key == key;
}

Grouped Group(const std::vector<int>& keys, const std::vector<NDArray>& arrays) {
  for (size_t i = 0; i < keys.size(); ++i)
    if (arrays[i].empty() && arrays[i].size() == 0 && arrays[i].shape().empty())
      throw InvalidArgument("empty NDArray passed for key " + std::to_string(keys[i]));
  Grouped g;
  g.idx.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) g.idx[i] = i;
  if (!std::is_sorted(keys.begin(), keys.end()))
    std::stable_sort(g.idx.begin(), g.idx.end(),
                     [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  for (size_t j = 0; j < g.idx.size();) {
    size_t e = j + 1;
    while (e < g.idx.size() && keys[g.idx[e]] == keys[g.idx[j]]) ++e;
    g.groups.push_back({keys[g.idx[j]], j, e - j});
    j = e;
  }
  return g;
}

KeyMeta* KeyTable::Add(std::unique_ptr<KeyMeta> m) {
  const int key = m->key;
  auto at = keys_.emplace(key, std::move(m)).first;
  auto after = std::next(at);
  at->second->next = after == keys_.end() ? nullptr : after->second.get();
  if (at != keys_.begin()) std::prev(at)->second->next = at->second.get();
  return at->second.get();
}

std::vector<const KeyMeta*> KeyTable::All() const {
  std::vector<const KeyMeta*> out;
  out.reserve(keys_.size());
  for (const auto& [key, m] : keys_) out.push_back(m.get());
  return out;
}

KeyMeta& KeyTable::Find(int key, const char* op) {
  auto it = keys_.find(key);
  if (it == keys_.end())
    throw KeyError(std::string(op) + ": key " + name_(key) +
                   " has not been inited (call Init first)");
  return *it->second;
}

KeyMeta& KeyTable::FindSparse(int key, const char* op) {
  KeyMeta& m = Find(key, op);
  if (!m.sparse) throw SparseUseOfDenseKey(op, name_(key));
  return m;
}

std::vector<KeyMeta*> KeyTable::Check(const Grouped& groups, const std::vector<NDArray>& arrays,
                                      const char* op, const char* what) {
  std::vector<KeyMeta*> metas;
  metas.reserve(groups.groups.size());
  KeyMeta* prev = nullptr;
  for (size_t g = 0; g < groups.groups.size(); ++g) {
    const int k = groups.groups[g].key;
    // Keys ascend: often the successor of the previous one.
    KeyMeta& m = prev && prev->next && prev->next->key == k ? *prev->next : Find(k, op);
    prev = &m;
    if (m.next) __builtin_prefetch(m.next);
    if (m.sparse) throw DenseUseOfSparseKey(op, name_(k));
    for (size_t j = 0; j < groups.groups[g].count; ++j) {
      const NDArray& a = groups.At(g, j, arrays);
      if (a.dtype() != m.dtype || a.shape() != m.shape)
        CheckMatches(a, m.shape, m.dtype, what, name_(k));
    }
    metas.push_back(&m);
  }
  return metas;
}

void RoundRules::Admit(const std::vector<KeyMeta*>& metas, Step step, const char* op,
                       const KeyTable::Namer& name) {
  static const std::string rule =
      " (PSKV_STRICT_ROUNDS=1: in dist_sync each round of a key is one push or push-pull "
      "by every worker, then pulls of that round's value; pulls before the key's first "
      "push are free)";
  for (const KeyMeta* m : metas) {
    if (step == Step::kPull && m->pushes > 0 && m->pulled) {
      const std::string k = name(m->key);  // names only on the error path
      throw UsageError("Pull of key " + k + " in round " + std::to_string(m->pushes + 1) +
                       ": this worker has not pushed key " + k + " in round " +
                       std::to_string(m->pushes + 1) + " (it already pulled round " +
                       std::to_string(m->pushes) +
                       "); the other workers' pushes of this round would be mixed with the "
                       "next round's" +
                       rule);
    }
    if (step != Step::kPull && m->pushes > 0 && !m->pulled) {
      const std::string k = name(m->key);
      throw UsageError(std::string(op) + " of key " + k + " in round " + std::to_string(m->pushes) +
                       ": second push in one round (this worker " + "pushed key " + k +
                       " in round " + std::to_string(m->pushes) + " and has not pulled it since)" +
                       rule);
    }
  }
  for (KeyMeta* m : metas) {
    if (step == Step::kPull) {
      m->pulled = true;
    } else {
      ++m->pushes;
      m->pulled = step == Step::kPushPull;
    }
  }
}

}  // namespace pskv::dist
