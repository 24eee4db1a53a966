// A dist store's keys on the worker: what each key is (KeyMeta), where it lives
// (placement over the servers and wire chunks), the checks of a call's keys, and the
// strict-rounds rule (RoundRules).
//
// Threads: KeyTable and RoundRules are not synchronised; their owner serialises every
// call (DistWorkerStore::mu_). A KeyMeta's placement fields are written once, before
// the key is visible to other calls; `merge`/`residual` are used by the engine's
// operation of that key only (one at a time per key).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/dist_protocol.h"
#include "pskv/ndarray.h"

namespace pskv::dist {

struct DeviceKeyState;  // device_exchange.h

struct KeyMeta {
  int key = 0;
  Shape shape;
  DType dtype = DType::kFloat32;
  int64_t size = 0;
  std::vector<Slice> slices;  // one per wire chunk (ps key), by server and offset
  NDArray merge;              // local reduction buffer (the LocalReducer allocates it)
  NDArray residual;           // compression residual (float32)
  // Values on devices (device_exchange.h): created under DeviceExchange's lock before the
  // key's first operation with device arrays; then used by the key's operations only.
  std::shared_ptr<DeviceKeyState> dev;
  std::vector<uint64_t> ps_keys, lens, comp_lens;
  // Strict rounds (RoundRules): pushes issued by this worker, and whether this worker
  // pulled since its last push.
  int64_t pushes = 0;
  bool pulled = true;
  // row_sparse key: rows of row_size elements, sliced by row range over `ranges`
  // (ps_keys[i] is ranges[i]'s server).
  bool sparse = false;
  int64_t rows = 0, row_size = 0;
  std::vector<RowRange> ranges;
  // The next key of the table (keys are never removed): a call's keys ascend, so a
  // lookup usually finds the next one without a tree search.
  KeyMeta* next = nullptr;
};

/// Places a dense key of `store_id` over `num_servers` (dist_protocol.h, PlaceKey:
/// a big key split by `shares`, evenly if empty; each server's slice cut into wire
/// chunks: one ps key and message per chunk; servers with an empty slice get none).
/// `comp_bytes`, if set, gives the compressed bytes of a slice of n elements;
/// `per_slice` > 1 cuts big slices finer (ChunkSlices; WireShape::chunks_per_slice).
void PlaceDense(KeyMeta* m, int store_id, int num_servers, int64_t bigarray_bound,
                const std::vector<int64_t>& shares, int64_t wire_chunk_bytes,
                const std::function<int64_t(int64_t)>& comp_bytes, int64_t per_slice = 1);
/// Places a row_sparse key of `store_id` by row ranges (one ps key per range). Always
/// evenly: a row_sparse key's traffic is the rows a step touches, not its size.
void PlaceRowSparse(KeyMeta* m, int store_id, int num_servers, int64_t bigarray_bound);

/// A call's arrays by key, without copying them: keys ascending, each key's arrays as
/// indices into the call's vector, in the order given.
struct Grouped {
  struct Entry {
    int key;
    size_t first, count;  // idx[first, first + count)
  };
  std::vector<Entry> groups;
  std::vector<size_t> idx;

  const NDArray& At(size_t g, size_t j, const std::vector<NDArray>& arrays) const {
    return arrays[idx[groups[g].first + j]];
  }
  /// Group g's arrays (copies of the handles).
  std::vector<NDArray> Arrays(size_t g, const std::vector<NDArray>& arrays) const;
  bool Has(int key) const;
};
/// Groups a call's (key, array) lists; InvalidArgument for an empty array.
Grouped Group(const std::vector<int>& keys, const std::vector<NDArray>& arrays);

class KeyTable {
 public:
  using Namer = std::function<std::string(int)>;
  explicit KeyTable(Namer name) : name_(std::move(name)) {}

  bool Has(int key) const { return keys_.count(key) > 0; }
  bool empty() const { return keys_.empty(); }
  /// Every key's meta, by key.
  std::vector<const KeyMeta*> All() const;
  /// Adds a key's meta (its `key` set) and links it to its neighbours.
  KeyMeta* Add(std::unique_ptr<KeyMeta> m);
  /// The key's meta; KeyError (naming `op`) if it was never inited.
  KeyMeta& Find(int key, const char* op);
  /// A row_sparse key's meta; UsageError if the key is dense.
  KeyMeta& FindSparse(int key, const char* op);
  /// The metas of a call's dense keys (by group), after checking each key exists, is
  /// dense, and every array matches its shape and dtype (`what` names the arrays).
  /// Changes nothing.
  std::vector<KeyMeta*> Check(const Grouped& groups, const std::vector<NDArray>& arrays,
                              const char* op, const char* what);

 private:
  Namer name_;
  std::map<int, std::unique_ptr<KeyMeta>> keys_;
};

/// PSKV_STRICT_ROUNDS=1 (dist_sync): each key's calls on this worker must form
/// rounds "push (or push-pull), then pulls"; pulls before the key's first push are
/// free. Admit checks a call's keys against the rule and, only if all pass, records
/// the call in their metas (pushes, pulled).
class RoundRules {
 public:
  enum class Step { kPush, kPull, kPushPull };
  /// Throws UsageError (naming `op` and the key) if a key breaks the rule; else
  /// records the step for every key.
  static void Admit(const std::vector<KeyMeta*>& metas, Step step, const char* op,
                    const KeyTable::Namer& name);
};

}  // namespace pskv::dist
