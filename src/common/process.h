// What a program changed of the process-wide settings (pskv/process.h,
// pskv/tuning.h): read by tests that check the library changes none of them.
#pragma once

namespace pskv {

/// Whether TuneAllocatorForLargeMessages has run in this process.
bool AllocatorTuned();

}  // namespace pskv
