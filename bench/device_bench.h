#pragma once
namespace pskv::bench {
/// pskv-bench device: the device exchange's kernels and copies against ceilings measured
/// in the same run (a device-to-device copy; one pinned memcpy each way).
int BenchDevice(int argc, char** argv);
}  // namespace pskv::bench
