#include "kvstore/states_file.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "common/byte_io.h"
#include "common/crc32c.h"
#include "pskv/error.h"
#include "pskv/optimizer.h"

namespace pskv::states {

namespace {

constexpr char kBlobMagic[] = "PSKVOPT1";
constexpr char kDumpedMagic[] = "PSKVOPT2";
constexpr char kDistMagic1[] = "PSKVDST1";
constexpr char kDistMagic2[] = "PSKVDST2";
constexpr char kSumMagic[] = "PSKVSUM1";
constexpr const char* kWhat = "optimizer states";

bool HasMagic(std::string_view bytes, const char* magic) {
  return bytes.size() >= 8 && std::memcmp(bytes.data(), magic, 8) == 0;
}

// The blob after a "PSKVDST3" head (whole keys), else the bytes as they are.
std::string_view InnerBlob(std::string_view bytes) {
  return HasMagic(bytes, kWholeKeysMagic.data()) ? bytes.substr(8) : bytes;
}

ArrayView GetArray(ByteReader& r) {
  const int64_t n = r.Get<int64_t>();
  if (n < 0) return ArrayView();
  if (static_cast<uint64_t>(n) > r.remaining() / 4)
    throw IOError("optimizer states: truncated array of " + std::to_string(n) + " elements");
  return {r.GetView(static_cast<size_t>(n) * 4), n};
}

NDArray Copy(const ArrayView& v) {
  if (v.n < 0) return NDArray();
  NDArray a(Shape{v.n}, DType::kFloat32);
  std::memcpy(a.raw(), v.data, a.nbytes());
  return a;
}

void PutArray(BlobWriter& w, const NDArray& a) {
  w.ArrayHead(a.empty() ? -1 : a.size());
  if (!a.empty()) w.Bytes(a.raw(), a.nbytes());
}

uint64_t U64At(std::string_view b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
uint32_t U32At(std::string_view b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}

// What a states file may hold: checked content ("PSKVSUM1"), or content of a file
// written before the checksum.
bool IsStatesContent(std::string_view b) {
  return HasMagic(b, kBlobMagic) || HasMagic(b, kDumpedMagic) ||
         HasMagic(b, kWholeKeysMagic.data()) || HasMagic(b, kDistMagic1) ||
         HasMagic(b, kDistMagic2);
}

IOError NotStates(const std::string& fname) {
  return IOError("'" + fname + "' is not a pskv optimizer-states file (bad magic)");
}

IOError Corrupt(const std::string& fname, const std::string& why) {
  return IOError("optimizer states file '" + fname + "' is corrupt: " + why +
                 " (a damaged or cut copy); load another copy, or save the states again");
}

// Checks the CRC32C of checked file `f` (`size` bytes, "PSKVSUM1" at its start),
// reading it in pieces.
void CheckSum(std::ifstream& f, uint64_t size, const std::string& fname) {
  if (size < 12) throw Corrupt(fname, "cut short");
  std::string buf(std::min<uint64_t>(size - 12, uint64_t{1} << 20), '\0');
  uint32_t crc = 0;
  f.seekg(8);
  for (uint64_t left = size - 12; left > 0;) {
    const auto n = static_cast<std::streamsize>(std::min<uint64_t>(left, buf.size()));
    if (!f.read(buf.data(), n)) throw IOError("cannot read optimizer states file '" + fname + "'");
    crc = Crc32c(buf.data(), static_cast<size_t>(n), crc);
    left -= static_cast<uint64_t>(n);
  }
  uint32_t saved = 0;
  if (!f.read(reinterpret_cast<char*>(&saved), 4))
    throw IOError("cannot read optimizer states file '" + fname + "'");
  if (saved != crc) throw Corrupt(fname, "its checksum does not match its content");
}

}  // namespace

void BlobWriter::Head(bool dumped, const std::string& config, int64_t num_update,
                      uint64_t num_keys) {
  out_(dumped ? kDumpedMagic : kBlobMagic, 8);
  Put<uint32_t>(static_cast<uint32_t>(config.size()));
  out_(config.data(), config.size());
  Put<int64_t>(num_update);
  Put<uint64_t>(num_keys);
}

void BlobWriter::Key(int64_t key, int64_t t, uint32_t num_slots) {
  Put<int64_t>(key);
  Put<int64_t>(t);
  Put<uint32_t>(num_slots);
}

void BlobWriter::ArrayHead(int64_t n) {
  Put<int64_t>(n);
}

std::string EncodeBlob(const Blob& blob) {
  std::string out;
  BlobWriter w([&out](const char* p, size_t n) { out.append(p, n); });
  w.Head(blob.dumped, blob.config, blob.num_update, blob.keys.size());
  for (const KeyStates& k : blob.keys) {
    w.Key(k.key, k.t, static_cast<uint32_t>(k.slots.size()));
    for (const NDArray& s : k.slots) PutArray(w, s);
    PutArray(w, k.master);
  }
  return out;
}

BlobView IndexBlob(std::string_view all) {
  const std::string_view bytes = InnerBlob(all);
  ByteReader r(bytes.data(), bytes.size(), kWhat);
  char magic[8];
  r.GetBytes(magic, 8);
  BlobView b;
  b.dumped = std::memcmp(magic, kDumpedMagic, 8) == 0;
  if (!b.dumped && std::memcmp(magic, kBlobMagic, 8) != 0)
    throw IOError("not a pskv optimizer-states file (bad magic)");
  b.config = r.GetString();
  b.num_update = r.Get<int64_t>();
  const uint64_t count = r.Get<uint64_t>();
  // A key takes at least 28 bytes (key, t, slot count, master's count).
  if (count > r.remaining() / 28)
    throw IOError("optimizer states: " + std::to_string(count) + " keys cannot fit in " +
                  std::to_string(r.remaining()) + " bytes");
  b.keys.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    KeyView k;
    k.key = r.Get<int64_t>();
    k.t = r.Get<int64_t>();
    const uint32_t ns = r.Get<uint32_t>();
    if (ns > r.remaining() / 8)
      throw IOError("optimizer states: key " + std::to_string(k.key) + " claims " +
                    std::to_string(ns) + " state buffers");
    k.slots.reserve(ns);
    for (uint32_t s = 0; s < ns; ++s) k.slots.push_back(GetArray(r));
    k.master = GetArray(r);
    b.keys.push_back(std::move(k));
  }
  if (r.remaining() != 0) throw IOError("optimizer states: trailing bytes");
  return b;
}

Blob DecodeBlob(std::string_view bytes) {
  BlobView v = IndexBlob(bytes);
  Blob b;
  b.dumped = v.dumped;
  b.config = std::move(v.config);
  b.num_update = v.num_update;
  b.keys.reserve(v.keys.size());
  for (const KeyView& k : v.keys) {
    KeyStates ks;
    ks.key = k.key;
    ks.t = k.t;
    for (const ArrayView& s : k.slots) ks.slots.push_back(Copy(s));
    ks.master = Copy(k.master);
    b.keys.push_back(std::move(ks));
  }
  return b;
}

void MarkDumped(std::string* blob) {
  if (HasMagic(*blob, kBlobMagic)) std::memcpy(blob->data(), kDumpedMagic, 8);
}

std::string EncodeDistHeader(const std::vector<uint64_t>& sizes) {
  ByteWriter w;
  w.PutBytes(kDistMagic2, 8);
  w.Put<uint32_t>(static_cast<uint32_t>(sizes.size()));
  for (uint64_t s : sizes) w.Put<uint64_t>(s);
  return w.Take();
}

bool IsPerServerDistFile(std::string_view bytes) {
  return HasMagic(bytes, kDistMagic1) || HasMagic(bytes, kDistMagic2);
}

DistFile DecodeDistFile(std::string_view bytes, const std::string& name) {
  auto bad = [&](const std::string& why) {
    return IOError("'" + name + "' is not a pskv dist optimizer-states file: " + why);
  };
  const uint64_t size = bytes.size();
  if (size < 12) throw bad("too short");
  const uint32_t n = U32At(bytes, 8);
  DistFile f;
  if (HasMagic(bytes, kDistMagic2)) {
    f.version = 2;
    uint64_t at = 12;
    if (size < at + 8ull * n) throw bad("truncated");
    std::vector<uint64_t> sizes(n);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; ++i) {
      sizes[i] = U64At(bytes, at + 8ull * i);
      if (sizes[i] > size - sum) throw bad("bad size");  // the sum never exceeds size
      sum += sizes[i];
    }
    at += 8ull * n;
    if (sum != size - at) throw bad("sizes do not add up");
    for (uint64_t s : sizes) {
      f.blobs.push_back(bytes.substr(at, s));
      at += s;
    }
  } else if (HasMagic(bytes, kDistMagic1)) {
    f.version = 1;
    uint64_t at = 12;
    if (n > (size - at) / 4) throw bad("truncated");  // each blob has a 4-byte size
    for (uint32_t i = 0; i < n; ++i) {
      if (size - at < 4) throw bad("truncated");
      const uint32_t s = U32At(bytes, at);
      at += 4;
      if (s > size - at) throw bad("truncated");
      f.blobs.push_back(bytes.substr(at, s));
      at += s;
    }
    if (at != size) throw bad("trailing bytes");
  } else {
    throw bad("bad magic");
  }
  return f;
}

void WriteStatesFile(const std::string& fname,
                     const std::function<void(const BlobWriter::Sink&)>& write) {
  const std::string tmp = fname + ".tmp" + std::to_string(::getpid());
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  if (!f) throw IOError("cannot write optimizer states to '" + fname + "'");
  uint32_t crc = 0;
  f.write(kSumMagic, 8);
  try {
    write([&](const char* p, size_t n) {
      crc = Crc32c(p, n, crc);
      f.write(p, static_cast<std::streamsize>(n));
    });
  } catch (...) {
    f.close();
    std::remove(tmp.c_str());
    throw;
  }
  f.write(reinterpret_cast<const char*>(&crc), 4);
  f.close();
  if (!f || std::rename(tmp.c_str(), fname.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw IOError("cannot write optimizer states to '" + fname + "'");
  }
}

std::string ReadStatesFile(const std::string& fname) {
  std::ifstream f(fname, std::ios::binary | std::ios::ate);
  if (!f) throw IOError("cannot open optimizer states file '" + fname + "'");
  const auto size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  char magic[8] = {};
  if (size < 8 || !f.read(magic, 8)) throw NotStates(fname);
  const std::string_view head(magic, 8);
  const bool checked = HasMagic(head, kSumMagic);
  if (!checked && !IsStatesContent(head)) throw NotStates(fname);
  if (checked && size < 12) throw Corrupt(fname, "cut short");
  std::string content(checked ? size - 12 : size, '\0');
  if (!checked) {
    std::memcpy(content.data(), magic, 8);
    if (!f.read(content.data() + 8, static_cast<std::streamsize>(size - 8)))
      throw IOError("cannot read optimizer states file '" + fname + "'");
    return content;
  }
  uint32_t saved = 0;
  if (!f.read(content.data(), static_cast<std::streamsize>(content.size())) ||
      !f.read(reinterpret_cast<char*>(&saved), 4))
    throw IOError("cannot read optimizer states file '" + fname + "'");
  if (Crc32c(content.data(), content.size()) != saved)
    throw Corrupt(fname, "its checksum does not match its content");
  // Checked content is what a writer wrote: a blob or a whole-keys file.
  if (IsPerServerDistFile(content) || !IsStatesContent(content)) throw NotStates(fname);
  return content;
}

std::optional<std::string> ReadDumpedConfigText(const std::string& fname) {
  std::ifstream f(fname, std::ios::binary | std::ios::ate);
  if (!f) throw IOError("cannot open optimizer states file '" + fname + "'");
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  auto read = [&](uint64_t at, uint64_t n) {
    std::string s;
    if (at >= size) return s;
    s.resize(std::min(n, size - at));
    f.seekg(static_cast<std::streamoff>(at));
    f.read(s.data(), static_cast<std::streamsize>(s.size()));
    if (!f) throw IOError("cannot read optimizer states file '" + fname + "'");
    return s;
  };
  // A checked file: its content (after the magic, before the checksum) once checked.
  uint64_t base = 0, end = size;
  const std::string magic = read(0, 8);
  if (!HasMagic(magic, kSumMagic) && !IsStatesContent(magic)) throw NotStates(fname);
  if (HasMagic(magic, kSumMagic)) {
    CheckSum(f, size, fname);
    f.clear();
    base = 8;
    end = size - 4;
  }
  // Where the first blob starts: 0 for a blob, after the dist header otherwise.
  const std::string head = read(base, std::min<uint64_t>(12, end - base));
  uint64_t at = base;
  if (HasMagic(head, kWholeKeysMagic.data()))
    at += 8;
  else if (HasMagic(head, kDistMagic1))
    at += 16;
  else if (head.size() == 12 && HasMagic(head, kDistMagic2))
    at += 12 + 8ull * U32At(head, 8);
  const std::string blob = at < end ? read(at, std::min<uint64_t>(12, end - at)) : std::string();
  if (blob.size() < 12 || !HasMagic(blob, kDumpedMagic)) return std::nullopt;
  const uint32_t len = U32At(blob, 8);
  if (end - at - 12 < len) throw IOError("optimizer states file '" + fname + "' is truncated");
  return read(at + 12, len);
}

}  // namespace pskv::states

namespace pskv {

std::optional<OptimizerConfig> ReadDumpedOptimizerConfig(const std::string& fname) {
  auto text = states::ReadDumpedConfigText(fname);
  if (!text) return std::nullopt;
  return OptimizerConfig::Deserialize(*text);
}

void WriteOptimizerStatesFile(const std::string& fname, const std::string& blob) {
  states::WriteStatesFile(
      fname, [&blob](const states::BlobWriter::Sink& out) { out(blob.data(), blob.size()); });
}

std::string ReadOptimizerStatesFile(const std::string& fname) {
  return states::ReadStatesFile(fname);
}

}  // namespace pskv
