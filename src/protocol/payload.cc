#include "protocol/payload.h"

#include "common/byte_io.h"
#include "protocol/optimizer_fields.h"
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
  size_t Remaining() const { return r_.remaining(); }
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
    case Kind::kRangeTable:
      return "range table";
    case Kind::kRangeStatesSizes:
      return "range states sizes";
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
    w.PutString(n.layout);
  }
  return w.Take();
}

std::vector<NodeDesc> DecodeNodeList(const std::string& body) {
  Reader r(body, Kind::kNodeList);
  const size_t n = r.GetCount(40, "nodes");
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
    d.layout = r.GetString(1024);
    if (d.role < 0 || d.role > 2 || d.port < 0 || d.port > 65535 || d.id < 0)
      r.Fail("invalid node entry");
    out.push_back(std::move(d));
  }
  r.End();
  return out;
}

// ---------------------------------------------------------------- optimizer

// The fields in the order of the table (protocol/optimizer_fields.h): strings,
// doubles, int64s, booleans as one byte; lists and key sets as a u32 count then the
// int64s; per-key multipliers as a u32 count then (int64 key, double) pairs. Then,
// only when the config has any, the rule's own parameters: a u32 count then
// (string name, double) pairs; a config without them encodes as it did before they
// existed, so every such payload (and the fuzz seeds) keeps its bytes.
std::string EncodeOptimizer(const OptimizerConfig& c) {
  ByteWriter w = Begin(Kind::kOptimizer);
  for (const OptimizerField& f : OptimizerFields())
    std::visit(FieldVisitor{
                   [&](std::string* x) { w.PutString(*x); },
                   [&](double* x) { w.Put<double>(*x); },
                   [&](int64_t* x) { w.Put<int64_t>(*x); },
                   [&](bool* x) { w.Put<uint8_t>(*x ? 1 : 0); },
                   [&](std::vector<int64_t>* x) {
                     w.Put<uint32_t>(static_cast<uint32_t>(x->size()));
                     for (int64_t v : *x) w.Put<int64_t>(v);
                   },
                   [&](std::map<int64_t, double>* x) {
                     w.Put<uint32_t>(static_cast<uint32_t>(x->size()));
                     for (auto& [k, v] : *x) {
                       w.Put<int64_t>(k);
                       w.Put<double>(v);
                     }
                   },
                   [&](std::set<int64_t>* x) {
                     w.Put<uint32_t>(static_cast<uint32_t>(x->size()));
                     for (int64_t k : *x) w.Put<int64_t>(k);
                   },
               },
               f.Of(c));
  if (!c.rule_params.empty()) {
    w.Put<uint32_t>(static_cast<uint32_t>(c.rule_params.size()));
    for (auto& [name, v] : c.rule_params) {
      w.PutString(name);
      w.Put<double>(v);
    }
  }
  return w.Take();
}

OptimizerConfig DecodeOptimizer(const std::string& body) {
  Reader r(body, Kind::kOptimizer);
  OptimizerConfig c;
  for (const OptimizerField& f : OptimizerFields()) {
    const std::string what(f.elements);
    std::visit(FieldVisitor{
                   [&](std::string* x) { *x = r.GetString(kMaxName); },
                   [&](double* x) { *x = r.Get<double>(); },
                   [&](int64_t* x) { *x = r.Get<int64_t>(); },
                   [&](bool* x) { *x = r.GetBool(); },
                   [&](std::vector<int64_t>* x) {
                     const size_t n = r.GetCount(8, what.c_str());
                     x->reserve(n);
                     for (size_t i = 0; i < n; ++i) x->push_back(r.Get<int64_t>());
                   },
                   [&](std::map<int64_t, double>* x) {
                     const size_t n = r.GetCount(16, what.c_str());
                     for (size_t i = 0; i < n; ++i) {
                       const auto k = r.Get<int64_t>();
                       if (!x->emplace(k, r.Get<double>()).second)
                         r.Fail(what + ": key " + std::to_string(k) + " twice");
                     }
                   },
                   [&](std::set<int64_t>* x) {
                     const size_t n = r.GetCount(8, what.c_str());
                     for (size_t i = 0; i < n; ++i) {
                       const auto k = r.Get<int64_t>();
                       if (!x->insert(k).second)
                         r.Fail(std::string(f.element) + " " + std::to_string(k) + " twice");
                     }
                   },
               },
               f.Of(c));
  }
  if (r.Remaining() >= 4) {  // the section's count; fewer bytes are trailing bytes
    const size_t n = r.GetCount(4 + 8, "rule parameters");
    for (size_t i = 0; i < n; ++i) {
      std::string name = r.GetString(kMaxName);
      if (!c.rule_params.emplace(name, r.Get<double>()).second)
        r.Fail("rule parameter '" + name + "' twice");
    }
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

// ---------------------------------------------------------------- range table

std::string EncodeRangeTable(const RangeTableData& t) {
  ByteWriter w = Begin(Kind::kRangeTable);
  w.Put<uint64_t>(t.version);
  w.Put<uint32_t>(static_cast<uint32_t>(t.ranges.size()));
  for (const auto& r : t.ranges) {
    w.Put<int32_t>(r.primary);
    w.Put<uint32_t>(static_cast<uint32_t>(r.replicas.size()));
    for (int32_t id : r.replicas) w.Put<int32_t>(id);
    w.Put<uint32_t>(static_cast<uint32_t>(r.joining.size()));
    for (int32_t id : r.joining) w.Put<int32_t>(id);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(t.spares.size()));
  for (int32_t id : t.spares) w.Put<int32_t>(id);
  return w.Take();
}

RangeTableData DecodeRangeTable(const std::string& body) {
  Reader r(body, Kind::kRangeTable);
  RangeTableData t;
  t.version = r.Get<uint64_t>();
  const size_t n = r.GetCount(8, "ranges");
  t.ranges.resize(n);
  for (auto& range : t.ranges) {
    range.primary = r.Get<int32_t>();
    const size_t k = r.GetCount(4, "replicas");
    range.replicas.reserve(k);
    for (size_t i = 0; i < k; ++i) range.replicas.push_back(r.Get<int32_t>());
    const size_t j = r.GetCount(4, "joining servers");
    range.joining.reserve(j);
    for (size_t i = 0; i < j; ++i) range.joining.push_back(r.Get<int32_t>());
  }
  const size_t n_spares = r.GetCount(4, "spare servers");
  t.spares.reserve(n_spares);
  for (size_t i = 0; i < n_spares; ++i) t.spares.push_back(r.Get<int32_t>());
  r.End();
  return t;
}

// ---------------------------------------------------------------- range states sizes

std::string EncodeRangeStatesSizes(const RangeStatesSizes& sizes) {
  ByteWriter w = Begin(Kind::kRangeStatesSizes);
  w.Put<uint32_t>(static_cast<uint32_t>(sizes.size()));
  for (const auto& [range, bytes] : sizes) {
    w.Put<int32_t>(range);
    w.Put<uint64_t>(bytes);
  }
  return w.Take();
}

RangeStatesSizes DecodeRangeStatesSizes(const std::string& body) {
  Reader r(body, Kind::kRangeStatesSizes);
  const size_t n = r.GetCount(12, "ranges");
  RangeStatesSizes out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t range = r.Get<int32_t>();
    out.emplace_back(range, r.Get<uint64_t>());
  }
  r.End();
  return out;
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
    case Kind::kRangeTable:
      (void)DecodeRangeTable(body);
      return;
    case Kind::kRangeStatesSizes:
      (void)DecodeRangeStatesSizes(body);
      return;
  }
  throw ProtocolError("payload: unknown kind " + std::to_string(static_cast<uint8_t>(body[0])) +
                      " (known: 1 to " + std::to_string(static_cast<int>(Kind::kMaxKind)) + ")");
}

}  // namespace pskv::payload
