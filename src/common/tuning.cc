#include "pskv/tuning.h"

#include <malloc.h>

#include <atomic>

#include "common/process.h"

namespace pskv {

namespace {
std::atomic<bool> g_tuned{false};
}  // namespace

void TuneAllocatorForLargeMessages() {
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 8 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    return true;
  }();
  (void)done;
  g_tuned.store(true, std::memory_order_release);
}

bool AllocatorTuned() {
  return g_tuned.load(std::memory_order_acquire);
}

}  // namespace pskv
