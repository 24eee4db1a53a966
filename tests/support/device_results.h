// Per-test result checksums and copy counters of the device suites, for comparing a run on
// the simulator with a run on a real GPU (scripts/gpu-check.sh, scripts/gpu-compare.py).
//
// With PSKV_TEST_RESULTS_JSON=path set, the test binary writes one JSON object per test:
// its outcome, an FNV-1a 64 checksum over every device result the test compared (in the
// order compared: RecordDeviceResult), and the copy counters (cuda::Stats(), reset when
// the test starts). Without the variable nothing is recorded and nothing is written.
#pragma once

#include <cstddef>

namespace pskv::test {

/// Folds `bytes` bytes of a device result, already copied to the host, into the current
/// test's checksum. Called by the suites' comparison helpers (SameBits).
void RecordDeviceResult(const void* data, size_t bytes);

}  // namespace pskv::test
