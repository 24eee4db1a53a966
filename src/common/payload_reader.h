// The reader of every payload that starts `u8 kind, u8 version` and continues with
// fields written with ByteWriter (common/byte_io.h): the control payloads of the
// protocol layer (protocol/payload.h) and of the KV store
// (kvstore/distributed/wire/kv_payload.h), and the path upgrade's control messages
// and offer details (transport/upgrade/control_codec.h). Written once: every read is
// bounded by the bytes remaining, a list count that those bytes cannot hold is refused
// before anything is reserved, trailing bytes are refused, and every error is a
// ProtocolError that names the payload (`label`) and the problem.
#pragma once

#include <cstdint>
#include <string>

#include "common/byte_io.h"
#include "pskv/error.h"

namespace pskv {

/// A writer with the kind and version bytes already written.
inline ByteWriter BeginPayload(uint8_t kind, uint8_t version) {
  ByteWriter w;
  w.Put<uint8_t>(kind);
  w.Put<uint8_t>(version);
  return w;
}

class PayloadReader {
 public:
  PayloadReader(const void* p, size_t n, std::string label)
      : label_(std::move(label)), r_(p, n, label_.c_str()) {}
  PayloadReader(const PayloadReader&) = delete;  // r_ points into label_
  PayloadReader& operator=(const PayloadReader&) = delete;

  /// Reads the kind and version bytes and returns the kind. `max_kind` > 0: a kind
  /// outside 1..max_kind is an unknown kind; `kind` > 0: any other kind is the wrong
  /// one; a version other than `version` is not understood.
  uint8_t Header(uint8_t kind, uint8_t max_kind, uint8_t version) {
    if (r_.remaining() < 2) Fail("truncated: no kind and version bytes");
    const auto got = r_.Get<uint8_t>();
    const auto got_version = r_.Get<uint8_t>();
    if (max_kind > 0 && (got == 0 || got > max_kind))
      Fail("unknown kind " + std::to_string(got) + " (understood: 1-" + std::to_string(max_kind) +
           ")");
    if (kind > 0 && got != kind)
      Fail("wrong kind " + std::to_string(got) + " (expected " + std::to_string(kind) + ")");
    if (got_version != version)
      Fail("version " + std::to_string(got_version) +
           " is not understood (understood: " + std::to_string(version) + ")");
    return got;
  }

  template <typename T>
  T Get() {
    return r_.Get<T>();
  }
  void GetBytes(void* out, size_t n) { r_.GetBytes(out, n); }
  /// One byte that must be 0 or 1.
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
  /// Refuses trailing bytes.
  void End() {
    if (r_.remaining()) Fail(std::to_string(r_.remaining()) + " trailing bytes");
  }
  [[noreturn]] void Fail(const std::string& m) { throw ProtocolError(label_ + ": " + m); }

 private:
  std::string label_;
  ByteReader r_;
};

}  // namespace pskv
