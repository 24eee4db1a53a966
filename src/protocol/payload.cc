#include "protocol/payload.h"

#include "pskv/error.h"

namespace pskv::payload {

ByteWriter Begin(uint8_t kind) {
  return BeginPayload(kind, kVersion);
}

Reader::Reader(const std::string& body, uint8_t kind, const char* name)
    : PayloadReader(body.data(), body.size(), std::string(name) + " payload") {
  Header(kind, 0, kVersion);
}

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kNodeList:
      return "node list";
    case Kind::kBarrierState:
      return "barrier state";
    case Kind::kRangeTable:
      return "range table";
  }
  return nullptr;
}

namespace {
ByteWriter Begin(Kind k) {
  return payload::Begin(static_cast<uint8_t>(k));
}
Reader Read(const std::string& body, Kind k) {
  return Reader(body, static_cast<uint8_t>(k), KindName(k));
}
}  // namespace

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
  Reader r = Read(body, Kind::kNodeList);
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

// ---------------------------------------------------------------- barrier state

std::string EncodeBarrierState(bool enter) {
  ByteWriter w = Begin(Kind::kBarrierState);
  w.Put<uint8_t>(enter ? 1 : 0);
  return w.Take();
}

bool DecodeBarrierState(const std::string& body) {
  Reader r = Read(body, Kind::kBarrierState);
  const bool v = r.GetBool();
  r.End();
  return v;
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
  Reader r = Read(body, Kind::kRangeTable);
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

bool DecodeNodeLevel(const std::string& body) {
  if (body.empty()) return false;
  switch (static_cast<Kind>(static_cast<uint8_t>(body[0]))) {
    case Kind::kNodeList:
      (void)DecodeNodeList(body);
      return true;
    case Kind::kBarrierState:
      (void)DecodeBarrierState(body);
      return true;
    case Kind::kRangeTable:
      (void)DecodeRangeTable(body);
      return true;
  }
  return false;
}

}  // namespace pskv::payload
