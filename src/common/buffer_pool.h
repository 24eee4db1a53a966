// BufferPool: reusable byte buffers for messages built anew on every call — a fused
// message's packed values on the worker, its answer on the server.
//
// A buffer returns to the pool when the last owner of its shared_ptr lets it go (the
// transport, once it has sent the message), so steady-state calls allocate nothing
// and write into memory that is still in cache (a fresh buffer of 1 MiB is mmapped,
// faulted in page by page and unmapped again by malloc; freeing it also makes malloc
// consolidate its small free chunks).
//
// Bounded: at most `max_free` buffers of at most `max_keep` bytes each wait in the pool
// (bigger ones are freed when released); a buffer is only handed out for a request of
// at least half its size (so a few big buffers are not held by small requests).
// Thread-safe; buffers may outlive the pool.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace pskv {

class BufferPool {
 public:
  explicit BufferPool(size_t max_free = 8, size_t max_keep = size_t{16} << 20)
      : state_(std::make_shared<State>()) {
    state_->max_free = max_free;
    state_->max_keep = max_keep;
  }

  /// A buffer of at least `bytes` (uninitialised), back in the pool when released.
  std::shared_ptr<char> Get(size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);
    std::unique_ptr<char[]> buf;
    size_t cap = 0;
    {
      std::lock_guard<std::mutex> lk(state_->mu);
      auto& f = state_->free;
      auto best = f.end();
      for (auto it = f.begin(); it != f.end(); ++it)
        if (it->first >= bytes && it->first / 2 <= bytes &&
            (best == f.end() || it->first < best->first))
          best = it;
      if (best != f.end()) {
        cap = best->first;
        buf = std::move(best->second);
        f.erase(best);
      }
    }
    if (!buf) {
      cap = bytes;
      buf.reset(new char[cap]);
    }
    char* raw = buf.release();
    return std::shared_ptr<char>(raw, [state = state_, cap](char* p) { state->Put(p, cap); });
  }

  /// Buffers waiting in the pool.
  size_t free_count() const {
    std::lock_guard<std::mutex> lk(state_->mu);
    return state_->free.size();
  }

 private:
  struct State {
    std::mutex mu;
    size_t max_free = 0, max_keep = 0;
    std::vector<std::pair<size_t, std::unique_ptr<char[]>>> free;  // (capacity, buffer)

    void Put(char* p, size_t cap) {
      std::unique_ptr<char[]> buf(p);
      if (cap > max_keep) return;  // buf is freed
      std::lock_guard<std::mutex> lk(mu);
      if (free.size() >= max_free) {
        // Full: keep the bigger buffers (the smallest one goes).
        auto smallest = std::min_element(free.begin(), free.end(),
                                         [](auto& a, auto& b) { return a.first < b.first; });
        if (smallest == free.end() || smallest->first >= cap) return;  // buf is freed
        *smallest = {cap, std::move(buf)};
        return;
      }
      free.emplace_back(cap, std::move(buf));
    }
  };
  std::shared_ptr<State> state_;
};

}  // namespace pskv
