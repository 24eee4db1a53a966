#include "pskv/tuning.h"

#include <malloc.h>

namespace pskv {

void TuneAllocatorForLargeMessages() {
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 8 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    return true;
  }();
  (void)done;
}

}  // namespace pskv
