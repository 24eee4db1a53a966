#pragma once
namespace pskv::bench {
/// pskv-bench fusion: 1,000 small keys in one call vs one big key; fused vs unfused.
int BenchFusion(int argc, char** argv);
/// The worker side of BenchFusion (a process started by pskv-launch).
int BenchFusionWorker(int argc, char** argv);
}  // namespace pskv::bench
