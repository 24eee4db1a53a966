// Process-wide settings that make pskv faster, applied only when a program asks:
// the library itself never changes process-wide state (pskv/process.h). pskv's own
// programs (pskv-server, pskv-bench, train_fmnist) call this; Python programs through
// pskv.configure_process(tune_allocator=True).
#pragma once

namespace pskv {

/// Makes glibc serve pskv's 1 MiB value chunks from its heaps and keep freed
/// memory for reuse instead of returning it to the kernel (M_MMAP_THRESHOLD 8 MiB,
/// M_TRIM_THRESHOLD 512 MiB), so a stream of large messages does not fault in
/// fresh pages on every message (this halved throughput at 64 MB). Idempotent.
void TuneAllocatorForLargeMessages();

}  // namespace pskv
