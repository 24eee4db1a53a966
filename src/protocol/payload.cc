#include "protocol/payload.h"

#include "common/byte_io.h"
#include "pskv/error.h"

namespace pskv::payload {
namespace {

constexpr size_t kMaxName = 1 << 16;  // names, types, shapes, hosts
constexpr size_t kMaxText = 1 << 20;  // messages

std::string Label(Kind k) {
  return std::string(KindName(k)) + " payload";
}

ByteWriter Begin(Kind k) {
  ByteWriter w;
  w.Put<uint8_t>(static_cast<uint8_t>(k));
  w.Put<uint8_t>(kVersion);
  return w;
}

// Reads a payload of kind `k`: checks the kind and version bytes, then `read` gets
// the fields; trailing bytes are an error. Errors name the payload.
class Reader {
 public:
  Reader(const std::string& body, Kind k)
      : label_(Label(k)), r_(body.data(), body.size(), label_.c_str()) {
    if (body.size() < 2) Fail("truncated: no kind and version bytes");
    const auto kind = r_.Get<uint8_t>();
    const auto version = r_.Get<uint8_t>();
    if (kind != static_cast<uint8_t>(k))
      Fail("wrong kind " + std::to_string(kind) + " (expected " +
           std::to_string(static_cast<int>(k)) + ")");
    if (version != kVersion)
      Fail("version " + std::to_string(version) +
           " is not understood (understood: " + std::to_string(kVersion) + ")");
  }
  template <typename T>
  T Get() {
    return r_.Get<T>();
  }
  bool GetBool() {
    const auto b = r_.Get<uint8_t>();
    if (b > 1) Fail("bad boolean " + std::to_string(b));
    return b == 1;
  }
  std::string GetString(size_t max_len) { return r_.GetString(max_len); }
  /// A list count; each element takes at least `min_bytes`, so a count the
  /// remaining bytes cannot hold is refused before anything is reserved.
  size_t GetCount(size_t min_bytes, const char* what) {
    const auto n = r_.Get<uint32_t>();
    if (static_cast<uint64_t>(n) * min_bytes > r_.remaining())
      Fail(std::to_string(n) + " " + what + " cannot fit in the " + std::to_string(r_.remaining()) +
           " bytes remaining");
    return n;
  }
  void End() {
    if (r_.remaining()) Fail(std::to_string(r_.remaining()) + " trailing bytes");
  }
  [[noreturn]] void Fail(const std::string& m) { throw ProtocolError(label_ + ": " + m); }

 private:
  std::string label_;
  ByteReader r_;
};

}  // namespace

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kNodeList:
      return "node list";
    case Kind::kOptimizer:
      return "optimizer config";
    case Kind::kCompression:
      return "compression setting";
    case Kind::kInitReport:
      return "init report";
    case Kind::kCheckInit:
      return "check-init ids";
    case Kind::kRoundStatus:
      return "round status";
    case Kind::kStatesSize:
      return "states size";
    case Kind::kMode:
      return "mode";
    case Kind::kHasOptimizer:
      return "has-optimizer reply";
    case Kind::kBarrierState:
      return "barrier state";
  }
  return "unknown";
}

// ---------------------------------------------------------------- node list

std::string EncodeNodeList(const std::vector<NodeDesc>& nodes) {
  ByteWriter w = Begin(Kind::kNodeList);
  w.Put<uint32_t>(static_cast<uint32_t>(nodes.size()));
  for (const auto& n : nodes) {
    w.Put<int32_t>(n.id);
    w.Put<int32_t>(n.role);
    w.Put<int32_t>(n.rank);
    w.PutString(n.host);
    w.Put<int32_t>(n.port);
    w.Put<uint64_t>(n.token);
    w.Put<int64_t>(n.rank_hint);
  }
  return w.Take();
}

std::vector<NodeDesc> DecodeNodeList(const std::string& body) {
  Reader r(body, Kind::kNodeList);
  const size_t n = r.GetCount(36, "nodes");
  if (n > 1u << 17) r.Fail(std::to_string(n) + " nodes is too many");
  std::vector<NodeDesc> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    NodeDesc d;
    d.id = r.Get<int32_t>();
    d.role = r.Get<int32_t>();
    d.rank = r.Get<int32_t>();
    d.host = r.GetString(1024);
    d.port = r.Get<int32_t>();
    d.token = r.Get<uint64_t>();
    d.rank_hint = r.Get<int64_t>();
    if (d.role < 0 || d.role > 2 || d.port < 0 || d.port > 65535 || d.id < 0)
      r.Fail("invalid node entry");
    out.push_back(std::move(d));
  }
  r.End();
  return out;
}

// ---------------------------------------------------------------- optimizer

namespace {
void PutMap(ByteWriter& w, const std::map<int64_t, double>& m) {
  w.Put<uint32_t>(static_cast<uint32_t>(m.size()));
  for (auto& [k, v] : m) {
    w.Put<int64_t>(k);
    w.Put<double>(v);
  }
}
std::map<int64_t, double> GetMap(Reader& r, const char* what) {
  std::map<int64_t, double> m;
  const size_t n = r.GetCount(16, what);
  for (size_t i = 0; i < n; ++i) {
    const auto k = r.Get<int64_t>();
    if (!m.emplace(k, r.Get<double>()).second)
      r.Fail(std::string(what) + ": key " + std::to_string(k) + " twice");
  }
  return m;
}
}  // namespace

std::string EncodeOptimizer(const OptimizerConfig& c) {
  ByteWriter w = Begin(Kind::kOptimizer);
  w.PutString(c.type);
  for (double d : {c.learning_rate, c.wd, c.rescale_grad, c.clip_gradient, c.momentum, c.beta1,
                   c.beta2, c.epsilon, c.rho})
    w.Put<double>(d);
  w.Put<uint8_t>(c.centered ? 1 : 0);
  w.Put<uint8_t>(c.multi_precision ? 1 : 0);
  w.Put<uint8_t>(c.lazy_update ? 1 : 0);
  const LRSchedule& s = c.lr_schedule;
  w.PutString(s.type);
  w.Put<int64_t>(s.step);
  w.Put<uint32_t>(static_cast<uint32_t>(s.steps.size()));
  for (int64_t v : s.steps) w.Put<int64_t>(v);
  w.Put<double>(s.factor);
  w.Put<double>(s.stop_factor_lr);
  w.Put<int64_t>(s.max_update);
  w.Put<double>(s.final_lr);
  w.Put<int64_t>(s.warmup_steps);
  w.Put<double>(s.warmup_begin_lr);
  PutMap(w, c.lr_mult);
  PutMap(w, c.wd_mult);
  w.Put<uint32_t>(static_cast<uint32_t>(c.sum_keys.size()));
  for (int64_t k : c.sum_keys) w.Put<int64_t>(k);
  return w.Take();
}

OptimizerConfig DecodeOptimizer(const std::string& body) {
  Reader r(body, Kind::kOptimizer);
  OptimizerConfig c;
  c.type = r.GetString(kMaxName);
  for (double* d : {&c.learning_rate, &c.wd, &c.rescale_grad, &c.clip_gradient, &c.momentum,
                    &c.beta1, &c.beta2, &c.epsilon, &c.rho})
    *d = r.Get<double>();
  c.centered = r.GetBool();
  c.multi_precision = r.GetBool();
  c.lazy_update = r.GetBool();
  LRSchedule& s = c.lr_schedule;
  s.type = r.GetString(kMaxName);
  s.step = r.Get<int64_t>();
  const size_t nsteps = r.GetCount(8, "lr steps");
  s.steps.reserve(nsteps);
  for (size_t i = 0; i < nsteps; ++i) s.steps.push_back(r.Get<int64_t>());
  s.factor = r.Get<double>();
  s.stop_factor_lr = r.Get<double>();
  s.max_update = r.Get<int64_t>();
  s.final_lr = r.Get<double>();
  s.warmup_steps = r.Get<int64_t>();
  s.warmup_begin_lr = r.Get<double>();
  c.lr_mult = GetMap(r, "lr_mult entries");
  c.wd_mult = GetMap(r, "wd_mult entries");
  const size_t nsum = r.GetCount(8, "sum keys");
  for (size_t i = 0; i < nsum; ++i) {
    const auto k = r.Get<int64_t>();
    if (!c.sum_keys.insert(k).second) r.Fail("sum key " + std::to_string(k) + " twice");
  }
  r.End();
  return c;
}

// ---------------------------------------------------------------- compression

std::string EncodeCompression(const CompressionConfig& c) {
  ByteWriter w = Begin(Kind::kCompression);
  w.PutString(c.type);
  w.Put<float>(c.threshold);
  return w.Take();
}

CompressionConfig DecodeCompression(const std::string& body) {
  Reader r(body, Kind::kCompression);
  CompressionConfig c;
  c.type = r.GetString(kMaxName);
  c.threshold = r.Get<float>();
  r.End();
  return c;
}

// ---------------------------------------------------------------- init report

std::string EncodeInitReport(const InitReport& rep) {
  ByteWriter w = Begin(Kind::kInitReport);
  w.Put<uint32_t>(static_cast<uint32_t>(rep.entries.size()));
  for (const auto& e : rep.entries) {
    w.Put<int64_t>(e.id);
    w.PutString(e.name);
    w.PutString(e.dtype);
    w.PutString(e.shape);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(rep.failures.size()));
  for (const auto& f : rep.failures) {
    w.Put<int64_t>(f.id);
    w.PutString(f.message);
  }
  return w.Take();
}

InitReport DecodeInitReport(const std::string& body) {
  Reader r(body, Kind::kInitReport);
  InitReport rep;
  const size_t ne = r.GetCount(8 + 3 * 4, "entries");
  rep.entries.reserve(ne);
  for (size_t i = 0; i < ne; ++i) {
    InitEntry e;
    e.id = r.Get<int64_t>();
    e.name = r.GetString(kMaxName);
    e.dtype = r.GetString(kMaxName);
    e.shape = r.GetString(kMaxName);
    rep.entries.push_back(std::move(e));
  }
  const size_t nf = r.GetCount(8 + 4, "failures");
  rep.failures.reserve(nf);
  for (size_t i = 0; i < nf; ++i) {
    InitFailure f;
    f.id = r.Get<int64_t>();
    f.message = r.GetString(kMaxText);
    rep.failures.push_back(std::move(f));
  }
  r.End();
  return rep;
}

// ---------------------------------------------------------------- check init

std::string EncodeCheckInit(const std::vector<int64_t>& ids) {
  ByteWriter w = Begin(Kind::kCheckInit);
  w.Put<uint32_t>(static_cast<uint32_t>(ids.size()));
  for (int64_t id : ids) w.Put<int64_t>(id);
  return w.Take();
}

std::vector<int64_t> DecodeCheckInit(const std::string& body) {
  Reader r(body, Kind::kCheckInit);
  const size_t n = r.GetCount(8, "ids");
  std::vector<int64_t> ids;
  ids.reserve(n);
  for (size_t i = 0; i < n; ++i) ids.push_back(r.Get<int64_t>());
  r.End();
  return ids;
}

// ---------------------------------------------------------------- round status

std::string EncodeRoundStatus(const RoundStatus& s) {
  ByteWriter w = Begin(Kind::kRoundStatus);
  w.Put<uint32_t>(static_cast<uint32_t>(s.deadlocks.size()));
  for (const auto& d : s.deadlocks) {
    w.Put<int64_t>(d.key);
    w.PutString(d.message);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(s.lines.size()));
  for (const auto& l : s.lines) w.PutString(l);
  return w.Take();
}

RoundStatus DecodeRoundStatus(const std::string& body) {
  Reader r(body, Kind::kRoundStatus);
  RoundStatus s;
  const size_t nd = r.GetCount(8 + 4, "deadlocks");
  s.deadlocks.reserve(nd);
  for (size_t i = 0; i < nd; ++i) {
    Deadlock d;
    d.key = r.Get<int64_t>();
    d.message = r.GetString(kMaxText);
    s.deadlocks.push_back(std::move(d));
  }
  const size_t nl = r.GetCount(4, "lines");
  s.lines.reserve(nl);
  for (size_t i = 0; i < nl; ++i) s.lines.push_back(r.GetString(kMaxText));
  r.End();
  return s;
}

// ---------------------------------------------------------------- scalars

std::string EncodeStatesSize(uint64_t bytes) {
  ByteWriter w = Begin(Kind::kStatesSize);
  w.Put<uint64_t>(bytes);
  return w.Take();
}

uint64_t DecodeStatesSize(const std::string& body) {
  Reader r(body, Kind::kStatesSize);
  const auto v = r.Get<uint64_t>();
  r.End();
  return v;
}

namespace {
std::string EncodeFlag(Kind k, bool v) {
  ByteWriter w = Begin(k);
  w.Put<uint8_t>(v ? 1 : 0);
  return w.Take();
}
bool DecodeFlag(Kind k, const std::string& body) {
  Reader r(body, k);
  const bool v = r.GetBool();
  r.End();
  return v;
}
}  // namespace

std::string EncodeMode(bool sync) {
  return EncodeFlag(Kind::kMode, sync);
}
bool DecodeMode(const std::string& body) {
  return DecodeFlag(Kind::kMode, body);
}
std::string EncodeHasOptimizer(bool has) {
  return EncodeFlag(Kind::kHasOptimizer, has);
}
bool DecodeHasOptimizer(const std::string& body) {
  return DecodeFlag(Kind::kHasOptimizer, body);
}
std::string EncodeBarrierState(bool enter) {
  return EncodeFlag(Kind::kBarrierState, enter);
}
bool DecodeBarrierState(const std::string& body) {
  return DecodeFlag(Kind::kBarrierState, body);
}

void DecodeAny(const std::string& body) {
  if (body.empty()) throw ProtocolError("payload: empty");
  switch (static_cast<Kind>(static_cast<uint8_t>(body[0]))) {
    case Kind::kNodeList:
      (void)DecodeNodeList(body);
      return;
    case Kind::kOptimizer:
      (void)DecodeOptimizer(body);
      return;
    case Kind::kCompression:
      (void)DecodeCompression(body);
      return;
    case Kind::kInitReport:
      (void)DecodeInitReport(body);
      return;
    case Kind::kCheckInit:
      (void)DecodeCheckInit(body);
      return;
    case Kind::kRoundStatus:
      (void)DecodeRoundStatus(body);
      return;
    case Kind::kStatesSize:
      (void)DecodeStatesSize(body);
      return;
    case Kind::kMode:
      (void)DecodeMode(body);
      return;
    case Kind::kHasOptimizer:
      (void)DecodeHasOptimizer(body);
      return;
    case Kind::kBarrierState:
      (void)DecodeBarrierState(body);
      return;
  }
  throw ProtocolError("payload: unknown kind " + std::to_string(static_cast<uint8_t>(body[0])) +
                      " (known: 1 to " + std::to_string(static_cast<int>(Kind::kMaxKind)) + ")");
}

}  // namespace pskv::payload
