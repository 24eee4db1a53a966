// Bounds-checked little-endian serialisation helpers (host order on x86/ARM,
// which are little-endian; pskv refuses to build on big-endian hosts).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "pskv/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "pskv needs a little-endian host");

namespace pskv {

class ByteWriter {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    PutBytes(&v, sizeof v);
  }
  void PutBytes(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    PutBytes(s.data(), s.size());
  }
  std::string Take() { return std::move(buf_); }
  size_t size() const { return buf_.size(); }

 private:
  std::string buf_;
};

/// Reads from a byte range; every read past the end throws ProtocolError (or the
/// error type given) naming `what`.
class ByteReader {
 public:
  ByteReader(const void* p, size_t n, const char* what)
      : p_(static_cast<const char*>(p)), n_(n), what_(what) {}
  template <typename T>
  T Get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    GetBytes(&v, sizeof v);
    return v;
  }
  void GetBytes(void* out, size_t n) {
    Need(n);
    std::memcpy(out, p_ + pos_, n);
    pos_ += n;
  }
  /// The next n bytes in place (valid while the underlying range is), skipped.
  const char* GetView(size_t n) {
    Need(n);
    const char* at = p_ + pos_;
    pos_ += n;
    return at;
  }
  std::string GetString(size_t max_len = 1 << 24) {
    uint32_t len = Get<uint32_t>();
    if (len > max_len) Fail("string of " + std::to_string(len) + " bytes is too long");
    Need(len);
    std::string s(p_ + pos_, len);
    pos_ += len;
    return s;
  }
  size_t remaining() const { return n_ - pos_; }

 private:
  void Need(size_t n) {
    if (n > n_ - pos_)
      Fail("truncated: needs " + std::to_string(n) + " more bytes, has " +
           std::to_string(n_ - pos_));
  }
  [[noreturn]] void Fail(const std::string& m) {
    throw ProtocolError(std::string(what_) + ": " + m);
  }
  const char* p_;
  size_t n_;
  size_t pos_ = 0;
  const char* what_;
};

}  // namespace pskv
