#include "ps/resender.h"

#include <algorithm>

namespace pskv {

namespace {
// Floor of the bandwidth assumed to estimate when a queued message has left:
// deliberately low (100 MB/s) so that slow links do not cause spurious resends.
constexpr double kFloorBytesPerSecond = 100e6;

std::chrono::microseconds TransferTime(size_t bytes) {
  return std::chrono::microseconds(
      static_cast<int64_t>(static_cast<double>(bytes) / kFloorBytesPerSecond * 1e6));
}
}  // namespace

Resender::Resender(std::chrono::milliseconds base, std::chrono::milliseconds max_backoff)
    : base_(base), max_backoff_(std::max(base, max_backoff)) {}

uint64_t Resender::NextSeq(int to) {
  std::lock_guard<std::mutex> lk(mu_);
  return ++next_seq_[to];
}

void Resender::Track(int to, uint64_t seq, const std::vector<Frame>& frames) {
  size_t bytes = 0;
  for (auto& f : frames) bytes += f.size;
  // A private copy: the frames point at the caller's arrays (or gather pieces of
  // them and of a server's stored values), which may be reused or freed once the
  // operation completed — and an acknowledgement can come later than the reply.
  std::vector<Frame> kept;
  kept.reserve(frames.size());
  for (const Frame& f : frames)
    kept.push_back(f.gathered() ? f.Flat() : Frame::Copy(f.data, f.size));
  std::lock_guard<std::mutex> lk(mu_);
  size_t& queued = queued_bytes_[to];
  queued += bytes;
  // The timer starts when the message can have left: after the bytes queued
  // before it (and itself) at the floor bandwidth.
  unacked_[{to, seq}] =
      Unacked{std::move(kept), bytes, Clock::now() + base_ + TransferTime(queued), 0};
}

void Resender::Ack(int from, uint64_t seq) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = unacked_.find({from, seq});
  if (it == unacked_.end()) return;
  queued_bytes_[from] -= std::min(queued_bytes_[from], it->second.bytes);
  unacked_.erase(it);
  if (unacked_.empty()) cv_.notify_all();
}

Resender::Arrival Resender::Accept(int from, uint64_t seq) {
  std::lock_guard<std::mutex> lk(mu_);
  Seen& s = seen_[from];
  if (seq <= s.low || s.above.count(seq)) return Arrival::kDuplicate;
  if (seq == s.low + 1) {
    ++s.low;
    return Arrival::kNext;
  }
  if (s.above.size() >= kMaxHeld) return Arrival::kFull;
  s.above.insert(seq);
  return Arrival::kHold;
}

uint64_t Resender::TakeNext(int from) {
  std::lock_guard<std::mutex> lk(mu_);
  Seen& s = seen_[from];
  if (s.above.empty() || *s.above.begin() != s.low + 1) return 0;
  s.above.erase(s.above.begin());
  return ++s.low;
}

std::vector<std::pair<int, std::vector<Frame>>> Resender::Due(Clock::time_point now) {
  std::vector<std::pair<int, std::vector<Frame>>> out;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [key, u] : unacked_) {
    if (now < u.due) continue;
    ++u.retries;
    // Exponential backoff from `base`, capped; plus the message's own transfer time.
    auto wait = base_ * (int64_t{1} << std::min(u.retries, 20));
    u.due = now + std::min<std::chrono::milliseconds>(wait, max_backoff_) + TransferTime(u.bytes);
    out.emplace_back(key.first, u.frames);
  }
  return out;
}

void Resender::Forget(int peer) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = unacked_.begin(); it != unacked_.end();)
    it = it->first.first == peer ? unacked_.erase(it) : std::next(it);
  queued_bytes_.erase(peer);
  if (unacked_.empty()) cv_.notify_all();
}

void Resender::Reset(int peer) {
  Forget(peer);
  std::lock_guard<std::mutex> lk(mu_);
  next_seq_.erase(peer);
  seen_.erase(peer);
}

bool Resender::WaitAllAcked(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return unacked_.empty(); });
}

size_t Resender::Pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return unacked_.size();
}

}  // namespace pskv
