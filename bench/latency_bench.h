#pragma once

namespace pskv::bench {
int BenchLatency(int argc, char** argv);
int BenchLatencyWorker(int argc, char** argv);
}  // namespace pskv::bench
