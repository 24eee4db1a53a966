// SparseWorker: DistWorkerStore's row_sparse keys (sparse_worker.h).
#include "kvstore/distributed/worker/sparse_worker.h"

#include <algorithm>

#include "common/observe.h"  // [observe]
#include "kvstore/distributed/wire/sparse_codec.h"
#include "kvstore/distributed/worker/collective_init.h"
#include "kvstore/kvstore_common.h"
#include "pskv/error.h"
#include "sparse/sparse_ops.h"

namespace pskv::dist {

namespace sw = sparse_wire;

namespace {

// row_sparse values and row ids on devices: refused (the rows are encoded on the CPU).
void RequireHost(const NDArray& a, const char* what, const std::string& key_name) {
  if (a.device().is_cuda())
    throw UsageError(std::string(what) + " of row_sparse key " + key_name + " is on " +
                     a.device().str() +
                     ": the dist stores encode row_sparse rows on the CPU and do not take them "
                     "on devices; move them to the host first (NDArray::To(Device::CPU())), or "
                     "keep the embedding table on the CPU");
}

Frame FrameOfString(std::shared_ptr<std::string> buf) {
  Frame f;
  f.data = buf->data();
  f.size = buf->size();
  f.owner = std::move(buf);
  return f;
}

}  // namespace

void SparseWorker::Init(int key, const RowSparseNDArray& value, bool compressed) {
  const std::string name = name_(key);
  KeyMeta* meta;
  {
    std::lock_guard<std::mutex> lk(keys_mu_);
    if (keys_.Has(key)) throw KeyError("duplicate init of key " + name);
    if (compressed) throw SparseWithCompression(name);
    RequireHost(value.data(), "the rows of the initial value", name_(key));
    auto m = std::make_unique<KeyMeta>();
    m->key = key;
    m->shape = value.shape();
    m->dtype = value.dtype();
    m->size = NumElements(value.shape());
    m->sparse = true;
    m->rows = value.num_rows();
    m->row_size = value.RowSize();
    if (m->rows == 0 || m->row_size == 0)
      throw ShapeError("Init of row_sparse key " + name_(key) + " with an empty shape " +
                       ShapeToString(value.shape()));
    PlaceRowSparse(m.get(), link_.store_id(), link_.node()->num_servers(),
                   link_.options().bigarray_bound);
    meta = keys_.Add(std::move(m));
  }
  payload::InitReport report;
  report.entries.push_back({WireKey(link_.store_id(), key), name,
                            DTypeName(value.dtype()) + " row_sparse",
                            ShapeToString(value.shape())});
  CollectiveInit(link_, report, [&](size_t) {
    const NDArray dense = value.ToDense();
    const uint64_t rb = meta->row_size * DTypeSize(meta->dtype);
    std::vector<uint64_t> lens;
    uint64_t total = 0;
    for (auto& r : meta->ranges) {
      lens.push_back(sw::InitBytes(r.count, rb));
      total += lens.back();
    }
    auto buf = std::make_shared<std::string>(total, '\0');
    char* p = buf->data();
    for (auto& r : meta->ranges)
      p = sw::EncodeInit(p, r.count, meta->row_size,
                         static_cast<const char*>(dense.raw()) + r.begin * rb, rb);
    auto done = std::make_shared<Completion>();
    auto ts =
        link_.worker()->Push(meta->ps_keys, FrameOfString(std::move(buf)), lens,
                             MakeCmd(Kind::kSparseInit, meta->dtype), Completion::Callback(done));
    link_.Await(ts, done, "init of row_sparse key " + name);
  });
}

void SparseWorker::Push(int key, const std::vector<RowSparseNDArray>& values, int priority) {
  KeyMeta* m;
  {
    std::lock_guard<std::mutex> lk(keys_mu_);
    m = &keys_.FindSparse(key, "Push of a row_sparse value");
    for (auto& v : values) {
      CheckSparseMatches(v.shape(), v.dtype(), m->shape, m->dtype, "pushed row_sparse value",
                         name_(key));
      RequireHost(v.data(), "the rows of a pushed value", name_(key));
      RequireHost(v.indices(), "the row ids of a pushed value", name_(key));
    }
  }
  const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
  engine_.Push({key}, priority, [this, key, m, values, obs_t, priority](Engine::Done done) {
    const RowSparseNDArray sum = sparse::Sum(values);
    const int64_t* ids = sum.indices().data<int64_t>();
    const int64_t nnz = sum.nnz();
    const uint64_t rb = m->row_size * DTypeSize(m->dtype);
    std::vector<uint64_t> lens;
    uint64_t total = 0;
    std::vector<std::pair<int64_t, int64_t>> parts;  // [first, last) of ids per range
    for (auto& r : m->ranges) {
      const int64_t a = std::lower_bound(ids, ids + nnz, r.begin) - ids;
      const int64_t b = std::lower_bound(ids, ids + nnz, r.begin + r.count) - ids;
      parts.emplace_back(a, b);
      lens.push_back(sw::PushBytes(b - a, rb));
      total += lens.back();
    }
    auto buf = std::make_shared<std::string>(total, '\0');
    char* p = buf->data();
    for (size_t i = 0; i < m->ranges.size(); ++i) {
      const auto [a, b] = parts[i];
      p = sw::EncodePush(p, m->row_size, ids + a, b - a, m->ranges[i].begin,
                         static_cast<const char*>(sum.data().raw()) + a * rb, rb);
    }
    Frame f = FrameOfString(std::move(buf));
    done = obs::Track("push", std::to_string(key), f.size, obs_t, std::move(done));  // [observe]
    link_.worker()->Push(m->ps_keys, f, lens, MakeCmd(Kind::kSparsePush, m->dtype), done, priority);
  });
}

void SparseWorker::Pull(int key, const std::vector<RowSparseNDArray>& outs,
                        const std::vector<NDArray>& row_ids, int priority) {
  KeyMeta* m;
  std::vector<NDArray> ids;
  {
    std::lock_guard<std::mutex> lk(keys_mu_);
    m = &keys_.FindSparse(key, "RowSparsePull");
    for (size_t i = 0; i < outs.size(); ++i) {
      CheckSparseMatches(outs[i].shape(), outs[i].dtype(), m->shape, m->dtype,
                         "row_sparse_pull output", name_(key));
      RequireHost(row_ids[i], "the row ids asked for", name_(key));
      ids.push_back(CanonicalRowIds(row_ids[i], m->rows));
    }
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
    engine_.Push({key}, priority,
                 [this, key, m, out = outs[i], want = ids[i], obs_t, priority](Engine::Done done) {
                   const int64_t* id = want.data<int64_t>();
                   const int64_t nnz = want.size();
                   const uint64_t rb = m->row_size * DTypeSize(m->dtype);
                   Shape rs = m->shape;
                   rs[0] = nnz;
                   NDArray rows(rs, m->dtype);
                   std::vector<uint64_t> keys, lens, out_lens;
                   std::string req;
                   for (size_t r = 0; r < m->ranges.size(); ++r) {
                     const auto& rg = m->ranges[r];
                     const int64_t a = std::lower_bound(id, id + nnz, rg.begin) - id;
                     const int64_t b = std::lower_bound(id, id + nnz, rg.begin + rg.count) - id;
                     if (a == b) continue;  // this server holds none of the rows
                     keys.push_back(m->ps_keys[r]);
                     const uint64_t n = static_cast<uint64_t>(b - a);
                     sw::AppendPull(&req, id + a, n, rg.begin);
                     lens.push_back(sw::PullBytes(n));
                     out_lens.push_back(n * rb);
                   }
                   KVWorker::Callback finish = [out, want, rows, done](std::exception_ptr e) {
                     if (!e) {
                       try {
                         RowSparseNDArray o = out;
                         o.Assign(RowSparseNDArray::FromRows(o.shape(), want, rows));
                       } catch (...) {
                         e = std::current_exception();
                       }
                     }
                     done(e);
                   };
                   if (keys.empty()) return finish(nullptr);  // no rows asked for
                   auto track = obs::Track("row_sparse_pull", std::to_string(key),  // [observe]
                                           rows.nbytes(), obs_t, std::move(finish));
                   link_.worker()->PushPull(keys, Frame::FromString(std::move(req)), lens,
                                            static_cast<char*>(rows.raw()), out_lens,
                                            MakeCmd(Kind::kSparsePull, m->dtype), std::move(track),
                                            priority);
                 });
  }
}

}  // namespace pskv::dist
