// The checks and de-duplication of a batch (batch.h), and the table of a local store
// (local_table.h).
#include "embedding/local_table.h"

#include <algorithm>
#include <cstring>

#include "embedding/batch.h"
#include "embedding/id_map.h"
#include "embedding/stats_fields.h"
#include "embedding/table.h"
#include "embedding/table_files.h"
#include "pskv/error.h"

namespace pskv {

namespace embedding {

const uint64_t* CheckIds(const NDArray& ids, const EmbeddingConfig& cfg, const char* call) {
  const std::string t = std::string(call) + " of embedding table '" + cfg.name + "': ";
  if (ids.dtype() != DType::kInt64)
    throw InvalidArgument(t + "ids must be int64 (got " + DTypeName(ids.dtype()) +
                          "); convert them first (u64 ids: their bits as int64)");
  if (ids.device().is_cuda())
    throw InvalidArgument(t + "ids on " + ids.device().str() +
                          ": move them to the host first (NDArray::To(Device::CPU()))");
  if (ids.size() >= (int64_t{1} << 32))
    throw InvalidArgument(t + "more than 2^32 - 1 ids in one call: split the batch");
  return reinterpret_cast<const uint64_t*>(ids.data<int64_t>());
}

const float* CheckGrads(const NDArray& grads, int64_t n, const EmbeddingConfig& cfg) {
  const std::string t = "Push of embedding table '" + cfg.name + "': ";
  if (grads.dtype() != DType::kFloat32)
    throw ShapeError(t + "gradients must be float32 (got " + DTypeName(grads.dtype()) +
                     "), the table's dtype; convert them first");
  if (grads.device().is_cuda())
    throw ShapeError(t + "gradients on " + grads.device().str() +
                     ": move them to the host first (NDArray::To(Device::CPU()))");
  if (grads.size() != n * cfg.width)
    throw ShapeError(t + "gradients of shape " + ShapeToString(grads.shape()) + " for " +
                     std::to_string(n) + " ids; the table's width is " + std::to_string(cfg.width) +
                     ", so (" + std::to_string(n) + ", " + std::to_string(cfg.width) +
                     ") is expected");
  return grads.data<float>();
}

Distinct DistinctOf(const uint64_t* ids, int64_t n) {
  Distinct d;
  d.where.resize(static_cast<size_t>(n));
  IdMap seen;  // id -> a: index + 1
  for (int64_t i = 0; i < n; ++i) {
    bool fresh = false;
    IdMap::Entry& e = seen.FindOrInsert(ids[i], &fresh);
    if (fresh) {
      d.ids.push_back(ids[i]);
      e.a = static_cast<uint32_t>(d.ids.size());
    }
    d.where[static_cast<size_t>(i)] = e.a - 1;
  }
  return d;
}

std::vector<float> SumGrads(const Distinct& d, const float* grads, int64_t n, int64_t width) {
  std::vector<float> out(d.ids.size() * static_cast<size_t>(width), 0.0f);
  std::vector<bool> started(d.ids.size(), false);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = d.where[static_cast<size_t>(i)];
    float* acc = out.data() + static_cast<size_t>(u) * width;
    const float* g = grads + i * width;
    if (!started[u]) {
      std::copy(g, g + width, acc);
      started[u] = true;
    } else {
      for (int64_t j = 0; j < width; ++j) acc[j] += g[j];
    }
  }
  return out;
}

namespace {

// A local store's table: one in-process shard, each push applied at once.
class LocalTable final : public EmbeddingTable {
 public:
  LocalTable(int key, const EmbeddingConfig& cfg) : EmbeddingTable(key, cfg), table_(cfg) {}

  NDArray Pull(const NDArray& ids, std::chrono::milliseconds timeout) override {
    return Pull(ids, nullptr, timeout);
  }
  NDArray Pull(const NDArray& ids, NDArray* versions, std::chrono::milliseconds) override {
    const uint64_t* id = CheckIds(ids, config(), "Pull");
    const int64_t n = ids.size();
    NDArray out(Shape{n, config().width}, DType::kFloat32);
    table_.Pull(id, n, out.data<float>());
    if (versions) {
      *versions = NDArray(Shape{n}, DType::kInt64);
      for (int64_t i = 0; i < n; ++i) {
        Table::RowView row;
        versions->data<int64_t>()[i] = table_.Row(id[i], &row) ? row.last_step : -1;
      }
    }
    return out;
  }
  void Push(const NDArray& ids, const NDArray& grads, std::chrono::milliseconds) override {
    const uint64_t* id = CheckIds(ids, config(), "Push");
    const int64_t n = ids.size();
    const float* g = CheckGrads(grads, n, config());
    const Distinct d = DistinctOf(id, n);
    const std::vector<float> sum = SumGrads(d, g, n, config().width);
    table_.Push(step_, d.ids.data(), static_cast<int64_t>(d.ids.size()), sum.data());
    ++step_;
  }
  EmbeddingStats Stats(std::chrono::milliseconds) override {
    EmbeddingStats s;
    AddStats(table_.Stats(), &s);
    s.step = step_;
    return s;
  }
  // The files of a dist table's single part (table_files.h), written here.
  uint64_t Save(const std::string& dir, EmbeddingSaveKind kind,
                std::chrono::milliseconds) override {
    MakeDir(dir);
    const uint64_t seq = std::max(save_seq_, LastSavedSeq(dir, key(), 0, 1)) + 1;
    const bool full = kind == EmbeddingSaveKind::kFull;
    const std::string path = dir + "/" + SaveFileName(key(), seq, 0, 1, step_, full);
    if (full) {
      table_.SaveFull(path);
    } else {
      table_.SaveDelta(path);
    }
    save_seq_ = seq;
    return FileBytes(path);
  }
  void Restore(const std::string& dir, std::chrono::milliseconds) override {
    const SavedTable saved = FindSaved(dir, key());
    table_.Restore(saved.chains);  // unchanged on error
    step_ = saved.step;
    save_seq_ = saved.seq;
  }
  uint64_t Export(const std::string& dir, std::chrono::milliseconds) override {
    MakeDir(dir);
    const std::string path = dir + "/" + ExportFileName(key(), 0, 1);
    table_.ExportRows(path);
    return FileBytes(path);
  }

 private:
  Table table_;
  int64_t step_ = 0;
  uint64_t save_seq_ = 0;
};

}  // namespace

std::unique_ptr<EmbeddingTable> CreateLocalTable(int key, const EmbeddingConfig& config) {
  return std::make_unique<LocalTable>(key, config);
}

}  // namespace embedding

EmbeddingTable::~EmbeddingTable() = default;

void EmbeddingTable::ReadExport(
    const std::string& dir, int key,
    const std::function<void(uint64_t id, const float* values, int64_t width)>& fn) {
  for (const std::string& path : embedding::FindExports(dir, key))
    embedding::ReadExportFile(path, fn);
}

}  // namespace pskv
