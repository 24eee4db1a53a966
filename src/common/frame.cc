#include "common/frame.h"

#include <algorithm>
#include <cstring>

#include "pskv/error.h"

namespace pskv {

Frame Frame::Of(const void* p, size_t n, std::shared_ptr<const void> owner) {
  Frame f;
  f.data = static_cast<const char*>(p);
  f.size = n;
  f.owner = std::move(owner);
  return f;
}

Frame Frame::Of(std::shared_ptr<char[]> buf, size_t n) {
  const char* p = buf.get();
  return Of(p, n, std::shared_ptr<const void>(std::move(buf), p));
}

Frame Frame::Copy(const void* p, size_t n) {
  auto buf = std::shared_ptr<char[]>(new char[n ? n : 1]);
  if (n) std::memcpy(buf.get(), p, n);
  return Of(std::move(buf), n);
}

Frame Frame::FromString(std::string s) {
  return Of(std::make_shared<std::string>(std::move(s)));
}

Frame Frame::Gather(std::vector<Piece> pieces, std::shared_ptr<const void> owner) {
  std::erase_if(pieces, [](const Piece& p) { return p.size == 0; });
  Frame f;
  for (const Piece& p : pieces) f.size += p.size;
  f.owner = std::move(owner);
  f.pieces = std::make_shared<const std::vector<Piece>>(std::move(pieces));
  return f;
}

Frame Frame::Slice(size_t offset, size_t n) const {
  if (offset > size || n > size - offset)
    throw InternalError("Frame::Slice: bytes [" + std::to_string(offset) + ", " +
                        std::to_string(offset + n) + ") of a frame of " + std::to_string(size));
  Frame f;
  f.owner = owner;
  f.size = n;
  if (!pieces) {
    f.data = data ? data + offset : nullptr;
    return f;
  }
  if (offset == 0 && n == size) {
    f.pieces = pieces;
    return f;
  }
  std::vector<Piece> out;
  size_t at = 0;  // offset of the current piece in this frame
  for (const Piece& p : *pieces) {
    if (n == 0 || at >= offset + n) break;
    if (at + p.size > offset) {
      const size_t from = offset > at ? offset - at : 0;
      const size_t to = std::min(p.size, offset + n - at);
      out.push_back({p.data + from, to - from});
    }
    at += p.size;
  }
  f.pieces = std::make_shared<const std::vector<Piece>>(std::move(out));
  return f;
}

void Frame::CopyTo(char* out) const {
  ForEachPart([&](const char* p, size_t n) {
    std::memcpy(out, p, n);
    out += n;
  });
}

Frame Frame::Flat() const {
  if (!pieces) return *this;
  auto buf = std::shared_ptr<char[]>(new char[size ? size : 1]);
  CopyTo(buf.get());
  return Of(std::move(buf), size);
}

}  // namespace pskv
