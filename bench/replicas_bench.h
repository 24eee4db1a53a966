#pragma once
namespace pskv::bench {
/// pskv-bench replicas: step time of a dist_sync job with PSKV_REPLICAS=1 against 0.
int BenchReplicas(int argc, char** argv);
/// The worker side of BenchReplicas (a process started by pskv-launch).
int BenchReplicasWorker(int argc, char** argv);
}  // namespace pskv::bench
