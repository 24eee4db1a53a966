#include "kvstore/distributed/wire/kv_payload.h"

#include "kvstore/optimizer_fields.h"
#include "pskv/error.h"

namespace pskv::payload {
namespace {

constexpr size_t kMaxName = 1 << 16;  // names, types, shapes, hosts
constexpr size_t kMaxText = 1 << 20;  // messages

// One space of kind numbers with the node-level kinds (protocol/payload.h).
constexpr bool NodeLevel(KvKind k) {
  const auto n = static_cast<uint8_t>(k);
  return n == static_cast<uint8_t>(Kind::kNodeList) ||
         n == static_cast<uint8_t>(Kind::kBarrierState) ||
         n == static_cast<uint8_t>(Kind::kRangeTable) || n > kMaxKind;
}
static_assert(!NodeLevel(KvKind::kOptimizer) && !NodeLevel(KvKind::kCompression) &&
                  !NodeLevel(KvKind::kInitReport) && !NodeLevel(KvKind::kCheckInit) &&
                  !NodeLevel(KvKind::kRoundStatus) && !NodeLevel(KvKind::kStatesSize) &&
                  !NodeLevel(KvKind::kMode) && !NodeLevel(KvKind::kHasOptimizer) &&
                  !NodeLevel(KvKind::kRangeStatesSizes) && !NodeLevel(KvKind::kEmbeddingTable),
              "a KV payload kind takes a node-level kind's number (protocol/payload.h)");
static_assert(static_cast<uint8_t>(Kind::kNodeList) < kMaxKind &&
                  static_cast<uint8_t>(Kind::kBarrierState) < kMaxKind &&
                  static_cast<uint8_t>(Kind::kRangeTable) < kMaxKind,
              "kMaxKind is the highest kind of either layer");

ByteWriter Begin(KvKind k) {
  return payload::Begin(static_cast<uint8_t>(k));
}

}  // namespace

const char* KindName(KvKind k) {
  switch (k) {
    case KvKind::kOptimizer:
      return "optimizer config";
    case KvKind::kCompression:
      return "compression setting";
    case KvKind::kInitReport:
      return "init report";
    case KvKind::kCheckInit:
      return "check-init ids";
    case KvKind::kRoundStatus:
      return "round status";
    case KvKind::kStatesSize:
      return "states size";
    case KvKind::kMode:
      return "mode";
    case KvKind::kHasOptimizer:
      return "has-optimizer reply";
    case KvKind::kRangeStatesSizes:
      return "range states sizes";
    case KvKind::kEmbeddingTable:
      return "embedding table";
  }
  return "unknown";
}

namespace {
Reader Read(const std::string& body, KvKind k) {
  return Reader(body, static_cast<uint8_t>(k), KindName(k));
}
}  // namespace

// The fields in the order of the table (kvstore/optimizer_fields.h): strings,
// doubles, int64s, booleans as one byte; lists and key sets as a u32 count then the
// int64s; per-key multipliers as a u32 count then (int64 key, double) pairs. Then,
// only when the config has any, the rule's own parameters: a u32 count then
// (string name, double) pairs; a config without them encodes as it did before they
// existed, so every such payload (and the fuzz seeds) keeps its bytes.
std::string EncodeOptimizer(const OptimizerConfig& c) {
  ByteWriter w = Begin(KvKind::kOptimizer);
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
  Reader r = Read(body, KvKind::kOptimizer);
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

std::string EncodeCompression(const CompressionConfig& c) {
  ByteWriter w = Begin(KvKind::kCompression);
  w.PutString(c.type);
  w.Put<float>(c.threshold);
  return w.Take();
}

CompressionConfig DecodeCompression(const std::string& body) {
  Reader r = Read(body, KvKind::kCompression);
  CompressionConfig c;
  c.type = r.GetString(kMaxName);
  c.threshold = r.Get<float>();
  r.End();
  return c;
}

// ---------------------------------------------------------------- init report

std::string EncodeInitReport(const InitReport& rep) {
  ByteWriter w = Begin(KvKind::kInitReport);
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
  Reader r = Read(body, KvKind::kInitReport);
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
  ByteWriter w = Begin(KvKind::kCheckInit);
  w.Put<uint32_t>(static_cast<uint32_t>(ids.size()));
  for (int64_t id : ids) w.Put<int64_t>(id);
  return w.Take();
}

std::vector<int64_t> DecodeCheckInit(const std::string& body) {
  Reader r = Read(body, KvKind::kCheckInit);
  const size_t n = r.GetCount(8, "ids");
  std::vector<int64_t> ids;
  ids.reserve(n);
  for (size_t i = 0; i < n; ++i) ids.push_back(r.Get<int64_t>());
  r.End();
  return ids;
}

// ---------------------------------------------------------------- round status

std::string EncodeRoundStatus(const RoundStatus& s) {
  ByteWriter w = Begin(KvKind::kRoundStatus);
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
  Reader r = Read(body, KvKind::kRoundStatus);
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
  ByteWriter w = Begin(KvKind::kStatesSize);
  w.Put<uint64_t>(bytes);
  return w.Take();
}

uint64_t DecodeStatesSize(const std::string& body) {
  Reader r = Read(body, KvKind::kStatesSize);
  const auto v = r.Get<uint64_t>();
  r.End();
  return v;
}

namespace {
std::string EncodeFlag(KvKind k, bool v) {
  ByteWriter w = Begin(k);
  w.Put<uint8_t>(v ? 1 : 0);
  return w.Take();
}
bool DecodeFlag(KvKind k, const std::string& body) {
  Reader r = Read(body, k);
  const bool v = r.GetBool();
  r.End();
  return v;
}
}  // namespace

std::string EncodeMode(bool sync) {
  return EncodeFlag(KvKind::kMode, sync);
}
bool DecodeMode(const std::string& body) {
  return DecodeFlag(KvKind::kMode, body);
}
std::string EncodeHasOptimizer(bool has) {
  return EncodeFlag(KvKind::kHasOptimizer, has);
}
bool DecodeHasOptimizer(const std::string& body) {
  return DecodeFlag(KvKind::kHasOptimizer, body);
}

// ---------------------------------------------------------------- range states sizes

std::string EncodeRangeStatesSizes(const RangeStatesSizes& sizes) {
  ByteWriter w = Begin(KvKind::kRangeStatesSizes);
  w.Put<uint32_t>(static_cast<uint32_t>(sizes.size()));
  for (const auto& [range, bytes] : sizes) {
    w.Put<int32_t>(range);
    w.Put<uint64_t>(bytes);
  }
  return w.Take();
}

RangeStatesSizes DecodeRangeStatesSizes(const std::string& body) {
  Reader r = Read(body, KvKind::kRangeStatesSizes);
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

// ---------------------------------------------------------------- embedding table

std::string EncodeEmbeddingTable(const EmbeddingConfig& c) {
  ByteWriter w = Begin(KvKind::kEmbeddingTable);
  w.PutString(c.name);
  w.Put<int64_t>(c.width);
  w.Put<uint8_t>(static_cast<uint8_t>(c.dtype));
  w.Put<uint64_t>(c.seed);
  w.Put<uint8_t>(static_cast<uint8_t>(c.init.kind));
  w.Put<double>(c.init.a);
  w.Put<double>(c.init.b);
  w.PutString(EncodeOptimizer(c.optimizer));
  w.Put<uint8_t>(static_cast<uint8_t>(c.admission.mode));
  w.Put<uint32_t>(c.admission.admit_after);
  w.Put<uint64_t>(c.admission.cbf_counters);
  w.Put<uint32_t>(c.admission.cbf_hashes);
  w.Put<uint8_t>(static_cast<uint8_t>(c.unadmitted_pull));
  w.Put<int64_t>(c.ttl_steps);
  w.Put<int64_t>(c.capacity);
  w.Put<uint64_t>(c.max_bytes);
  return w.Take();
}

EmbeddingConfig DecodeEmbeddingTable(const std::string& body) {
  Reader r = Read(body, KvKind::kEmbeddingTable);
  EmbeddingConfig c;
  auto small = [&](uint8_t max, const char* what) {
    const auto v = r.Get<uint8_t>();
    if (v > max) r.Fail(std::string("bad ") + what + " " + std::to_string(v));
    return v;
  };
  c.name = r.GetString(kMaxName);
  c.width = r.Get<int64_t>();
  const auto dtype = r.Get<uint8_t>();
  if (dtype != static_cast<uint8_t>(DType::kFloat32))  // the only rows' dtype so far
    r.Fail("rows of dtype code " + std::to_string(dtype) + " (only float32 is supported)");
  c.dtype = DType::kFloat32;
  c.seed = r.Get<uint64_t>();
  c.init.kind = static_cast<EmbeddingInitializer::Kind>(small(2, "initializer"));
  c.init.a = r.Get<double>();
  c.init.b = r.Get<double>();
  c.optimizer = DecodeOptimizer(r.GetString(kMaxText));
  c.admission.mode = static_cast<EmbeddingAdmission::Mode>(small(1, "admission mode"));
  c.admission.admit_after = r.Get<uint32_t>();
  c.admission.cbf_counters = r.Get<uint64_t>();
  c.admission.cbf_hashes = r.Get<uint32_t>();
  c.unadmitted_pull = static_cast<EmbeddingConfig::UnadmittedPull>(small(1, "unadmitted pull"));
  c.ttl_steps = r.Get<int64_t>();
  c.capacity = r.Get<int64_t>();
  c.max_bytes = r.Get<uint64_t>();
  r.End();
  return c;
}

void DecodeAny(const std::string& body) {
  if (body.empty()) throw ProtocolError("payload: empty");
  switch (static_cast<KvKind>(static_cast<uint8_t>(body[0]))) {
    case KvKind::kOptimizer:
      (void)DecodeOptimizer(body);
      return;
    case KvKind::kCompression:
      (void)DecodeCompression(body);
      return;
    case KvKind::kInitReport:
      (void)DecodeInitReport(body);
      return;
    case KvKind::kCheckInit:
      (void)DecodeCheckInit(body);
      return;
    case KvKind::kRoundStatus:
      (void)DecodeRoundStatus(body);
      return;
    case KvKind::kStatesSize:
      (void)DecodeStatesSize(body);
      return;
    case KvKind::kMode:
      (void)DecodeMode(body);
      return;
    case KvKind::kHasOptimizer:
      (void)DecodeHasOptimizer(body);
      return;
    case KvKind::kRangeStatesSizes:
      (void)DecodeRangeStatesSizes(body);
      return;
    case KvKind::kEmbeddingTable:
      (void)DecodeEmbeddingTable(body);
      return;
  }
  if (DecodeNodeLevel(body)) return;
  throw ProtocolError("payload: unknown kind " + std::to_string(static_cast<uint8_t>(body[0])) +
                      " (known: 1 to " + std::to_string(static_cast<int>(kMaxKind)) + ")");
}

}  // namespace pskv::payload
