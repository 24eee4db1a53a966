#pragma once
namespace pskv::bench {
/// pskv-bench priority: latency of a small high-priority push+pull while a big
/// low-priority one is in flight, with send scheduling and wire chunks on and off.
int BenchPriority(int argc, char** argv);
/// The worker side of BenchPriority (a process started by pskv-launch).
int BenchPriorityWorker(int argc, char** argv);
}  // namespace pskv::bench
