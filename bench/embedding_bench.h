#pragma once
namespace pskv::bench {
/// pskv-bench embedding: server-side row updates per second of one dynamic embedding
/// table shard on one thread (Zipf batches), against OSDI 2014's 1.15 M key updates
/// per second per core and the same run's memcpy of the same gradient bytes.
int BenchEmbedding(int argc, char** argv);
}  // namespace pskv::bench
