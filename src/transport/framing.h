// How a message travels over a byte stream of the direct data paths (a
// shared-memory ring, a direct TCP socket): a u64 prefix (kMsgMagic in the low
// half, the frame count in the high half), then per frame a u64 size and its
// bytes. Both ends are pskv nodes, both little-endian x86-64/aarch64.
//
// The reading side trusts nothing: Parser checks the magic, the frame count and
// every frame size (against max_frame) before it reserves memory for a frame.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "common/frame.h"

namespace pskv::framing {

constexpr uint32_t kMsgMagic = 0x4d4b5350;  // "PSKM"
constexpr uint32_t kMaxFramesPerMessage = 1 << 16;

// A message waiting to be written: pieces are the 8-byte prefix, then per frame
// its 8-byte size and its bytes (a gathered frame's pieces, in order). The frames
// keep their owners (no copy until the bytes go into the stream).
struct OutMsg {
  OutMsg() = default;
  OutMsg(OutMsg&&) = default;  // `parts` point into `words`' buffer, which a move keeps
  OutMsg& operator=(OutMsg&&) = default;
  OutMsg(const OutMsg&) = delete;
  OutMsg& operator=(const OutMsg&) = delete;

  std::vector<Frame> frames;
  std::vector<uint64_t> words;  // [0] prefix, [1 + i] size of frame i
  std::vector<Frame::Piece> parts;
  size_t piece = 0;
  uint64_t offset = 0;  // within the current piece

  static OutMsg Make(std::vector<Frame> f) {
    OutMsg m;
    m.words.resize(1 + f.size());
    m.words[0] = kMsgMagic | (static_cast<uint64_t>(f.size()) << 32);
    for (size_t i = 0; i < f.size(); ++i) m.words[1 + i] = f[i].size;
    m.frames = std::move(f);
    m.Index();
    return m;
  }
  size_t pieces() const { return parts.size(); }
  std::pair<const char*, uint64_t> Piece(size_t p) const { return {parts[p].data, parts[p].size}; }
  /// `n` bytes of this message went out; true when all of it did.
  bool Advance(uint64_t& n) {
    while (piece < pieces()) {
      const uint64_t left = Piece(piece).second - offset;
      if (n < left) {
        offset += n;
        n = 0;
        return false;
      }
      n -= left;
      offset = 0;
      ++piece;
    }
    return true;
  }
  /// Replaces the frames without an owner (valid only during the Send call that
  /// queued them) by copies; the bytes already written stay written.
  void OwnAll() {
    bool any = false;
    for (Frame& f : frames)
      if (!f.owner && f.size) {
        f = f.Flat();
        if (!f.owner) f = Frame::Copy(f.data, f.size);
        any = true;
      }
    if (!any) return;
    uint64_t done = offset;
    for (size_t p = 0; p < piece; ++p) done += parts[p].size;
    Index();
    piece = 0;
    offset = 0;
    Advance(done);
  }

 private:
  // Builds `parts` from words and frames (empty pieces left out).
  void Index() {
    parts.clear();
    parts.push_back({reinterpret_cast<const char*>(&words[0]), 8});
    for (size_t i = 0; i < frames.size(); ++i) {
      parts.push_back({reinterpret_cast<const char*>(&words[1 + i]), 8});
      frames[i].ForEachPart([&](const char* p, size_t n) { parts.push_back({p, n}); });
    }
  }
};

/// Pops the messages `n` written bytes completed (releasing their frames' owners).
inline void Consume(std::deque<OutMsg>& q, uint64_t n) {
  while (!q.empty() && q.front().Advance(n)) q.pop_front();
}

/// The incremental reader of one stream. The caller asks Want() where the next
/// bytes go (never more than it says), stores them there and reports them to Got().
class Parser {
 public:
  explicit Parser(uint64_t max_frame) : max_frame_(max_frame) {}

  std::pair<char*, uint64_t> Want() {
    if (st_ == kBody) return {buf_.get() + got_, size_ - got_};
    return {word_ + have_, 8 - have_};
  }

  /// `n` bytes were stored at Want().first. True when a message is complete (take
  /// it with Take()); *bad says why the stream is invalid (it must then be dropped).
  bool Got(uint64_t n, const char** bad) {
    if (st_ == kBody) {
      got_ += n;
      msg_bytes_ += n;
      return got_ == size_ && EndFrame();
    }
    have_ += static_cast<uint32_t>(n);
    if (have_ < 8) return false;
    have_ = 0;
    uint64_t v;
    std::memcpy(&v, word_, 8);
    if (st_ == kPrefix) {
      nframes_ = static_cast<uint32_t>(v >> 32);
      if (static_cast<uint32_t>(v) != kMsgMagic || nframes_ == 0 ||
          nframes_ > kMaxFramesPerMessage) {
        *bad = "malformed message";
        return false;
      }
      frames_.clear();
      msg_bytes_ = 0;
      st_ = kSize;
      return false;
    }
    if (v > max_frame_) {
      *bad = "frame larger than the limit";
      return false;
    }
    size_ = v;
    got_ = 0;
    buf_ = v ? std::shared_ptr<char[]>(new char[v]) : nullptr;
    st_ = kBody;
    return v == 0 && EndFrame();
  }

  std::vector<Frame> Take() { return std::exchange(frames_, {}); }
  /// Between two messages (nothing of a message read yet).
  bool Idle() const { return st_ == kPrefix && have_ == 0; }
  /// Inside a frame's body (Want() then says how much of it is still to come).
  bool InBody() const { return st_ == kBody; }
  /// Bytes of the current message's frames stored so far (0 between messages).
  uint64_t MessageBytes() const { return msg_bytes_; }

 private:
  bool EndFrame() {
    static const char kEmpty[1] = {0};
    const char* p = size_ ? buf_.get() : kEmpty;
    std::shared_ptr<const void> owner(buf_, buf_.get());
    buf_.reset();
    frames_.push_back(Frame::Of(p, size_, std::move(owner)));
    st_ = kSize;
    if (frames_.size() < nframes_) return false;
    st_ = kPrefix;
    msg_bytes_ = 0;
    return true;
  }

  const uint64_t max_frame_;
  enum { kPrefix, kSize, kBody } st_ = kPrefix;
  char word_[8];
  uint32_t have_ = 0, nframes_ = 0;
  std::vector<Frame> frames_;
  std::shared_ptr<char[]> buf_;
  uint64_t size_ = 0, got_ = 0, msg_bytes_ = 0;
};

}  // namespace pskv::framing
