#pragma once

namespace pskv::bench {
/// pskv-bench metrics-flood: latency of counting an operation (what every push,
/// pull and request does when metrics are on) with and without a flood of scrapes.
int BenchMetricsFlood(int argc, char** argv);
}  // namespace pskv::bench
