#include "kvstore/distributed/worker/fusion.h"

#include <map>
#include <mutex>

#include "common/observe.h"  // [observe]
#include "kvstore/dist_protocol.h"

namespace pskv::dist {

namespace {

struct Part {
  int key;
  KeyMeta* m;
  uint64_t off;                               // in its fusion group's request
  size_t vals_first, nvals, dst_first, ndst;  // into Fused::vals and Fused::dst
};
struct Request {
  size_t first, count;  // parts[first, first + count)
  uint64_t total;       // value bytes
};
struct Fused {
  std::vector<Part> parts;
  std::vector<Request> reqs;
  std::vector<NDArray> vals, dst;  // held until the operation completes
  PrepareFn prepare;
  std::mutex mu;    // guards the fields below
  size_t left = 0;  // requests not answered yet
  std::exception_ptr error;
  Engine::Done done;
};

// A request of a fused operation is done; the last one completes the operation.
void FinishFused(const std::shared_ptr<Fused>& f, std::exception_ptr e) {
  Engine::Done done;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lk(f->mu);
    if (e && !f->error) f->error = e;
    if (--f->left > 0) return;
    done = std::move(f->done);
    error = f->error;
  }
  if (done) done(error);
}

// One request of a fused operation: its keys' values gathered, its answer scattered
// into their first outputs (then copied into their other outputs).
void IssueRequest(KVWorker* worker, const std::shared_ptr<Fused>& f, const Request& r, bool push,
                  bool pull, int priority) {
  const Part* parts = f->parts.data() + r.first;
  const size_t n = r.count;
  std::vector<uint64_t> ps_keys(n), lens(n);
  for (size_t i = 0; i < n; ++i) {
    ps_keys[i] = parts[i].m->ps_keys[0];
    lens[i] = parts[i].m->lens[0];
  }
  const int cmd = MakeCmd(Kind::kDense, parts[0].m->dtype);
  Frame frame;
  if (push) {
    // A gathered frame (transport.h): one piece per key, where its value is. The
    // values are held by `f` until the transport has sent them, as a single key's
    // frame holds its array; the caller does not modify a pushed array before the
    // operation completed, and the server answers (completing it) only after it
    // received the whole message.
    std::vector<Frame::Piece> pieces(n);
    std::vector<std::shared_ptr<const void>> reduced;  // owners of reduced values
    for (size_t i = 0; i < n; ++i) {
      const Part& p = parts[i];
      // One value is sent as it is (a fused key is whole on one server, so its bytes
      // are the key's); several are reduced first (into the key's merge buffer, not
      // reused before this operation completed: the engine runs one per key).
      if (p.nvals == 1) {
        pieces[i] = {static_cast<const char*>(f->vals[p.vals_first].raw()), p.m->lens[0]};
      } else {
        const std::vector<NDArray> v(f->vals.begin() + static_cast<long>(p.vals_first),
                                     f->vals.begin() + static_cast<long>(p.vals_first + p.nvals));
        Frame pf = f->prepare(*p.m, v);
        pieces[i] = {pf.data, pf.size};
        reduced.push_back(std::move(pf.owner));
      }
    }
    std::shared_ptr<const void> owner = f;
    if (!reduced.empty())
      owner = std::make_shared<
          std::pair<std::shared_ptr<Fused>, std::vector<std::shared_ptr<const void>>>>(
          f, std::move(reduced));
    frame = Frame::Gather(std::move(pieces), std::move(owner));
  }
  if (!pull) {
    worker->Push(
        ps_keys, frame, lens, cmd, [f](std::exception_ptr e) { FinishFused(f, e); }, priority);
    return;
  }
  std::vector<char*> dst(n);
  bool more = false;  // a key with several outputs
  for (size_t i = 0; i < n; ++i) {
    dst[i] = static_cast<char*>(f->dst[parts[i].dst_first].raw());
    more = more || parts[i].ndst > 1;
  }
  auto cb = [f, first = r.first, n, more](std::exception_ptr e) {
    if (!e && more) {
      try {  // the first output into the others
        for (size_t i = first; i < first + n; ++i) {
          const auto& p = f->parts[i];
          for (size_t j = 1; j < p.ndst; ++j) {
            NDArray o = f->dst[p.dst_first + j];
            o.CopyFrom(f->dst[p.dst_first]);
          }
        }
      } catch (...) {
        e = std::current_exception();
      }
    }
    FinishFused(f, e);
  };
  if (push)
    worker->PushPull(ps_keys, frame, lens, std::move(dst), lens, cmd, std::move(cb), priority);
  else
    worker->Pull(ps_keys, std::move(dst), lens, cmd, std::move(cb), priority);
}

}  // namespace

std::vector<std::vector<size_t>> FusionGroups(const std::vector<KeyMeta*>& metas, int64_t key_bytes,
                                              int64_t group_bytes, std::vector<char>* fused) {
  std::vector<std::vector<size_t>> out;
  if (key_bytes <= 0) return out;
  std::map<std::pair<int, int>, std::vector<size_t>> by;  // (server, dtype) -> groups
  for (size_t g = 0; g < metas.size(); ++g) {
    const KeyMeta* m = metas[g];
    if (m->slices.size() == 1 && m->lens[0] <= static_cast<uint64_t>(key_bytes))
      by[{m->slices[0].server, static_cast<int>(m->dtype)}].push_back(g);
  }
  for (auto& [where, keys] : by) {
    std::vector<size_t> cur;
    uint64_t bytes = 0;
    auto flush = [&] {
      if (cur.size() >= 2) {
        for (size_t g : cur) (*fused)[g] = 1;
        out.push_back(cur);
      }
      cur.clear();
      bytes = 0;
    };
    for (size_t k : keys) {
      const uint64_t b = metas[k]->lens[0];
      if (!cur.empty() && bytes + b > static_cast<uint64_t>(group_bytes)) flush();
      cur.push_back(k);
      bytes += b;
    }
    flush();
  }
  return out;
}

void IssueFused(const std::vector<std::vector<size_t>>& groups, const FusedCall& call,
                Engine* engine, KVWorker* worker, PrepareFn prepare) {
  if (groups.empty()) return;
  const Grouped* vg = call.vg;
  const Grouped* dg = call.dg;
  auto f = std::make_shared<Fused>();
  f->prepare = std::move(prepare);
  std::vector<int> ks;
  for (auto& members : groups) {
    Request req{f->parts.size(), members.size(), 0};
    for (size_t g : members) {
      Part p{dg ? dg->groups[g].key : vg->groups[g].key, (*call.metas)[g], req.total, 0, 0, 0, 0};
      if (call.vals) {
        p.vals_first = f->vals.size();
        p.nvals = vg->groups[g].count;
        for (size_t j = 0; j < p.nvals; ++j) f->vals.push_back(vg->At(g, j, *call.vals));
      }
      if (call.outs) {
        p.dst_first = f->dst.size();
        p.ndst = dg->groups[g].count;
        for (size_t j = 0; j < p.ndst; ++j) f->dst.push_back(dg->At(g, j, *call.outs));
      }
      req.total += p.m->lens[0];
      ks.push_back(p.key);
      f->parts.push_back(p);
    }
    f->reqs.push_back(req);
  }
  const uint64_t obs_t = obs::Enabled() ? obs::NowUs() : 0;  // [observe]
  const bool push = call.vals != nullptr, pull = call.outs != nullptr;
  const char* op = call.op;
  const int priority = call.priority;
  engine->Push(
      std::move(ks), priority, [worker, f, obs_t, op, push, pull, priority](Engine::Done done) {
        if (obs::Enabled()) {  // [observe] every key as usual, and each request
          for (auto& p : f->parts)
            done = obs::Track(op, std::to_string(p.key), p.m->lens[0], obs_t, std::move(done));
          for (auto& r : f->reqs)
            done = obs::Track("fused", std::to_string(r.count) + " keys", r.total, obs_t,
                              std::move(done));
        }
        {
          std::lock_guard<std::mutex> lk(f->mu);
          f->done = std::move(done);
          f->left = f->reqs.size();
        }
        for (auto& r : f->reqs) {
          try {
            IssueRequest(worker, f, r, push, pull, priority);
          } catch (...) {
            FinishFused(f, std::current_exception());  // not issued: failed
          }
        }
      });
}

}  // namespace pskv::dist
