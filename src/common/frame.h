// Frame: a view of bytes plus whatever keeps them alive. The unit every layer
// hands around (transport, protocol, kvstore): it lives at the bottom so that
// the protocol does not depend on the transport for it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace pskv {

/// A view of bytes plus whatever keeps them alive.
///
/// An outgoing frame may be *gathered* instead: its bytes are the concatenation of
/// `pieces` (each piece's memory kept alive by `owner`, like a plain frame's), `data`
/// is null and `size` is the pieces' total. It saves packing values that live apart
/// (the keys of a fused message) into one buffer: the transport reads the pieces
/// where they are. Frames a transport delivers are never gathered. Code reading an
/// outgoing frame's bytes must go through ForEachPart/CopyTo/Flat, never `data`.
struct Frame {
  struct Piece {
    const char* data = nullptr;
    size_t size = 0;
  };
  const char* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
  /// Set for a gathered frame: its pieces, in order (shared: copying a frame is cheap).
  std::shared_ptr<const std::vector<Piece>> pieces;

  bool gathered() const { return pieces != nullptr; }

  /// The `n` bytes at `p`, kept alive by `owner` (no copy).
  static Frame Of(const void* p, size_t n, std::shared_ptr<const void> owner);
  /// The bytes of a contiguous container (std::string, std::vector<T>, ...), which
  /// the frame keeps alive (no copy).
  template <typename C>
  static Frame Of(std::shared_ptr<C> c) {
    const void* p = c->data();
    const size_t n = c->size() * sizeof(*c->data());
    return Of(p, n, std::shared_ptr<const void>(std::move(c)));
  }
  /// The `n` bytes of an array, which the frame keeps alive (no copy).
  static Frame Of(std::shared_ptr<char[]> buf, size_t n);
  /// A frame owning a copy of `s`.
  static Frame Copy(const void* p, size_t n);
  static Frame FromString(std::string s);
  /// A gathered frame of `pieces` (empty pieces are dropped), kept alive by `owner`.
  static Frame Gather(std::vector<Piece> pieces, std::shared_ptr<const void> owner);

  /// Bytes [offset, offset + n) (within size), sharing the owner, without copying: a
  /// slice of a gathered frame is gathered (the pieces it covers, cut to the range).
  Frame Slice(size_t offset, size_t n) const;
  /// Calls fn(ptr, bytes) for the frame's contiguous parts, in order (one for a plain
  /// frame; none for an empty one).
  template <typename F>
  void ForEachPart(F&& fn) const {
    if (!pieces) {
      if (size) fn(data, size);
      return;
    }
    for (const Piece& p : *pieces) fn(p.data, p.size);
  }
  /// Copies the frame's `size` bytes to `out`.
  void CopyTo(char* out) const;
  /// The frame with its bytes contiguous: itself if it is not gathered, else a copy.
  Frame Flat() const;
};

}  // namespace pskv
