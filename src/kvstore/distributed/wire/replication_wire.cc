#include "kvstore/distributed/wire/replication_wire.h"

#include <algorithm>
#include <cstring>

#include "common/byte_io.h"
#include "pskv/error.h"

namespace pskv::dist::replication_wire {

namespace {

constexpr size_t kPushCountBytes = 4 + 8;
constexpr size_t kAnswerBytes = 4 + 8 + 4 + 4;
constexpr size_t kAsyncPushBytes = 8 + 8 + 8;
constexpr size_t kCopyHeadBytes = 8 + 1 + 4;

// A reader of one body that refuses counts beyond the bytes left and trailing bytes.
class Reader : public ByteReader {
 public:
  Reader(std::string_view body, const char* what)
      : ByteReader(body.data(), body.size(), what), what_(what) {}
  /// A count of items of `item_bytes` each, at most as many as the bytes left hold.
  uint64_t Count(uint64_t n, size_t item_bytes) {
    if (n > remaining() / item_bytes)
      Fail(std::to_string(n) + " items of " + std::to_string(item_bytes) + " bytes in " +
           std::to_string(remaining()) + " bytes");
    return n;
  }
  void End() {
    if (remaining() != 0) Fail(std::to_string(remaining()) + " bytes after its last field");
  }
  [[noreturn]] void Fail(const std::string& why) {
    throw ProtocolError(std::string(what_) + ": " + why);
  }

 private:
  const char* what_;
};

void PutCounts(ByteWriter& w, const std::vector<PushCount>& counts) {
  w.Put<uint32_t>(static_cast<uint32_t>(counts.size()));
  for (const PushCount& c : counts) {
    w.Put<int32_t>(c.worker);
    w.Put<uint64_t>(c.count);
  }
}

std::vector<PushCount> GetCounts(Reader& r) {
  const uint64_t n = r.Count(r.Get<uint32_t>(), kPushCountBytes);
  std::vector<PushCount> out(n);
  for (PushCount& c : out) {
    c.worker = r.Get<int32_t>();
    c.count = r.Get<uint64_t>();
  }
  return out;
}

void PutHead(ByteWriter& w, const CopyHead& h) {
  w.Put<uint64_t>(h.version);
  w.Put<uint8_t>(static_cast<uint8_t>(h.part));
  w.Put<int32_t>(h.range);
}

CopyHead GetHead(Reader& r) {
  CopyHead h;
  h.version = r.Get<uint64_t>();
  const uint8_t part = r.Get<uint8_t>();
  if (part > static_cast<uint8_t>(CopyPart::kEnd))
    r.Fail("an unknown part " + std::to_string(part));
  h.part = static_cast<CopyPart>(part);
  h.range = r.Get<int32_t>();
  return h;
}

void ExpectPart(Reader& r, CopyPart want) {
  if (GetHead(r).part != want) r.Fail("another part");
}

}  // namespace

uint64_t ParseVersion(std::string_view body) {
  Reader r(body, "replicated change");
  return r.Get<uint64_t>();
}

std::string WithVersion(std::string_view body, uint64_t version) {
  ParseVersion(body);
  std::string out(body);
  std::memcpy(out.data(), &version, sizeof version);
  return out;
}

std::string EncodeRound(const Round& x) {
  ByteWriter w;
  w.Put<uint64_t>(x.version);
  w.Put<int64_t>(x.round);
  PutCounts(w, x.counts);
  w.Put<uint32_t>(static_cast<uint32_t>(x.answers.size()));
  for (const DelegatedAnswer& a : x.answers) {
    w.Put<int32_t>(a.worker);
    w.Put<uint64_t>(a.timestamp);
    w.Put<int32_t>(a.priority);
    w.Put<int32_t>(a.cmd);
  }
  return w.Take();
}

Round ParseRound(std::string_view body) {
  Reader r(body, "replicated round");
  Round x;
  x.version = r.Get<uint64_t>();
  x.round = r.Get<int64_t>();
  x.counts = GetCounts(r);
  x.answers.resize(r.Count(r.Get<uint32_t>(), kAnswerBytes));
  for (DelegatedAnswer& a : x.answers) {
    a.worker = r.Get<int32_t>();
    a.timestamp = r.Get<uint64_t>();
    a.priority = r.Get<int32_t>();
    a.cmd = r.Get<int32_t>();
  }
  r.End();
  return x;
}

std::string RoundAgain(std::string_view body, uint64_t version) {
  Round x = ParseRound(body);
  x.version = version;
  x.answers.clear();
  return EncodeRound(x);
}

std::string EncodeSparseRound(const SparseRound& x) {
  ByteWriter w;
  w.Put<uint64_t>(x.version);
  w.Put<int64_t>(x.round);
  w.Put<int64_t>(x.schedule_at);
  PutCounts(w, x.counts);
  return w.Take();
}

SparseRound ParseSparseRound(std::string_view body) {
  Reader r(body, "replicated row_sparse round");
  SparseRound x;
  x.version = r.Get<uint64_t>();
  x.round = r.Get<int64_t>();
  x.schedule_at = r.Get<int64_t>();
  x.counts = GetCounts(r);
  r.End();
  return x;
}

std::string EncodeEmbeddingRound(const EmbeddingRound& x) {
  ByteWriter w;
  w.Put<uint64_t>(x.version);
  w.Put<int64_t>(x.seq);
  PutCounts(w, x.counts);
  w.PutString(x.restore);
  return w.Take();
}

EmbeddingRound ParseEmbeddingRound(std::string_view body) {
  Reader r(body, "replicated embedding update");
  EmbeddingRound x;
  x.version = r.Get<uint64_t>();
  x.seq = r.Get<int64_t>();
  x.counts = GetCounts(r);
  x.restore = r.GetString(kMaxRestorePath);
  if (x.restore.find('\0') != std::string::npos) r.Fail("a restore path holding a NUL byte");
  r.End();
  return x;
}

std::string EncodeAsyncPushes(const AsyncPushes& x) {
  ByteWriter w;
  w.Put<uint64_t>(x.version);
  w.Put<int32_t>(x.worker);
  for (const AsyncPush& p : x.keys) {
    w.Put<int64_t>(p.seq);
    w.Put<int64_t>(p.schedule_at);
    w.Put<uint64_t>(p.count);
  }
  return w.Take();
}

AsyncPushes ParseAsyncPushes(std::string_view body, uint64_t num_keys) {
  Reader r(body, "replicated async push");
  AsyncPushes x;
  x.version = r.Get<uint64_t>();
  x.worker = r.Get<int32_t>();
  x.keys.resize(r.Count(num_keys, kAsyncPushBytes));
  for (AsyncPush& p : x.keys) {
    p.seq = r.Get<int64_t>();
    p.schedule_at = r.Get<int64_t>();
    p.count = r.Get<uint64_t>();
  }
  r.End();
  return x;
}

std::string EncodeForwardedInit(uint64_t version, int32_t worker, std::string_view counts) {
  std::string out(reinterpret_cast<const char*>(&version), sizeof version);
  out.append(reinterpret_cast<const char*>(&worker), sizeof worker);
  out += counts;
  return out;
}

std::string EncodeForwardedStates(uint64_t version) {
  return std::string(reinterpret_cast<const char*>(&version), sizeof version);
}

ForwardedInit ParseForwardedInit(std::string_view body, uint64_t num_keys) {
  Reader r(body, "forwarded init");
  ForwardedInit x;
  x.version = r.Get<uint64_t>();
  x.worker = r.Get<int32_t>();
  x.counts.resize(r.Count(num_keys, sizeof(uint64_t)));
  for (uint64_t& c : x.counts) c = r.Get<uint64_t>();
  r.End();
  return x;
}

CopyHead ParseCopyHead(std::string_view body) {
  Reader r(body.substr(0, std::min(body.size(), kCopyHeadBytes)), "range copy");
  return GetHead(r);
}

std::string EncodeCopyBegin(CopyHead head, const CopyBegin& b) {
  head.part = CopyPart::kBegin;
  ByteWriter w;
  PutHead(w, head);
  w.Put<uint8_t>(b.sync ? 1 : 0);
  w.Put<uint64_t>(b.keys);
  w.Put<uint64_t>(b.value_bytes);
  w.Put<uint32_t>(static_cast<uint32_t>(b.states.size()));
  for (const auto& [store, bytes] : b.states) {
    w.Put<int32_t>(store);
    w.Put<uint64_t>(bytes);
  }
  return w.Take();
}

CopyBegin ParseCopyBegin(std::string_view body) {
  Reader r(body, "range copy (begin)");
  ExpectPart(r, CopyPart::kBegin);
  CopyBegin b;
  const uint8_t sync = r.Get<uint8_t>();
  if (sync > 1) r.Fail("a sync mode of " + std::to_string(sync));
  b.sync = sync == 1;
  b.keys = r.Get<uint64_t>();
  b.value_bytes = r.Get<uint64_t>();
  b.states.resize(r.Count(r.Get<uint32_t>(), 4 + 8));
  for (auto& [store, bytes] : b.states) {
    store = r.Get<int32_t>();
    bytes = r.Get<uint64_t>();
  }
  r.End();
  return b;
}

std::string EncodeCopyKeys(CopyHead head, const std::vector<CopyKey>& keys) {
  head.part = CopyPart::kKeys;
  ByteWriter w;
  PutHead(w, head);
  for (const CopyKey& k : keys) {
    w.Put<int64_t>(k.key);
    w.Put<int32_t>(k.dtype);
    w.Put<int64_t>(k.rows);
    w.Put<int64_t>(k.round);
    PutCounts(w, k.applied);
  }
  return w.Take();
}

std::vector<CopyKey> ParseCopyKeys(std::string_view body, uint64_t num_keys) {
  Reader r(body, "range copy (keys)");
  ExpectPart(r, CopyPart::kKeys);
  std::vector<CopyKey> keys(r.Count(num_keys, 8 + 4 + 8 + 8 + 4));
  for (CopyKey& k : keys) {
    k.key = r.Get<int64_t>();
    k.dtype = r.Get<int32_t>();
    k.rows = r.Get<int64_t>();
    k.round = r.Get<int64_t>();
    k.applied = GetCounts(r);
  }
  r.End();
  return keys;
}

std::string EncodeCopyStates(CopyHead head, const CopyStates& s) {
  head.part = CopyPart::kStates;
  ByteWriter w;
  PutHead(w, head);
  w.Put<int32_t>(s.store);
  w.Put<uint64_t>(s.offset);
  return w.Take();
}

CopyStates ParseCopyStates(std::string_view body) {
  Reader r(body, "range copy (states)");
  ExpectPart(r, CopyPart::kStates);
  CopyStates s;
  s.store = r.Get<int32_t>();
  s.offset = r.Get<uint64_t>();
  r.End();
  return s;
}

std::string EncodeCopyEnd(CopyHead head) {
  head.part = CopyPart::kEnd;
  ByteWriter w;
  PutHead(w, head);
  return w.Take();
}

void ParseCopyEnd(std::string_view body) {
  Reader r(body, "range copy (end)");
  ExpectPart(r, CopyPart::kEnd);
  r.End();
}

}  // namespace pskv::dist::replication_wire
