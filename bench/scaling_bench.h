#pragma once
namespace pskv::bench {
/// pskv-bench scaling: W workers x S servers as processes, servers at 1 and N threads.
int BenchScaling(int argc, char** argv);
/// The worker side of BenchScaling (a process started by pskv-launch).
int BenchScalingWorker(int argc, char** argv);
}  // namespace pskv::bench
