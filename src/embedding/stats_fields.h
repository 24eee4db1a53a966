// The counters of a table part (TableStats, table.h), defined once: their order on the
// wire (kEmbeddingAdmin's stats reply, embedding_admin_codec.h), the EmbeddingStats
// field each one sums into (include/pskv/embedding.h), and their metric names and help
// texts (the servers' gauges, docs/observability.md). Every copy between the three
// goes through ForEachStat, so a counter added here reaches all of them.
#pragma once

#include <cstddef>
#include <type_traits>

#include "embedding/table.h"
#include "pskv/embedding.h"

namespace pskv::embedding {

/// Calls f(name, help, &TableStats::x, &EmbeddingStats::x) for each counter, in wire
/// order. `name` is the metric's suffix (pskv_embedding_<name>).
template <typename F>
constexpr void ForEachStat(F&& f) {
  f("live_rows", "rows now", &TableStats::live, &EmbeddingStats::live);
  f("admitted_rows", "rows created (restored rows count as admitted)", &TableStats::admitted,
    &EmbeddingStats::admitted);
  f("evicted_ttl_rows", "rows removed by the TTL", &TableStats::evicted_ttl,
    &EmbeddingStats::evicted_ttl);
  f("evicted_capacity_rows", "rows removed to stay under the capacity",
    &TableStats::evicted_capacity, &EmbeddingStats::evicted_capacity);
  f("dropped_grads", "gradient rows dropped: ids not admitted yet", &TableStats::dropped_grads,
    &EmbeddingStats::dropped_grads);
  f("pulled_rows", "pulled ids that had a row", &TableStats::pulled_rows,
    &EmbeddingStats::pulled_rows);
  f("pulled_defaults", "pulled ids that read the initializer or zeros",
    &TableStats::pulled_defaults, &EmbeddingStats::pulled_defaults);
  f("pending_ids", "ids counted by the exact admission counter", &TableStats::pending_ids,
    &EmbeddingStats::pending_ids);
  f("memory_bytes", "bytes allocated: row blocks, index, admission", &TableStats::memory_bytes,
    &EmbeddingStats::memory_bytes);
}

/// The number of counters ForEachStat lists.
constexpr size_t StatCount() {
  size_t n = 0;
  ForEachStat([&](const char*, const char*, auto, auto) { ++n; });
  return n;
}

/// The wire index of counter `field` (its place in ForEachStat), StatCount() if none.
template <typename T>
constexpr size_t StatIndex(T TableStats::*field) {
  size_t i = 0, at = StatCount();
  ForEachStat([&](const char*, const char*, auto f, auto) {
    if constexpr (std::is_same_v<decltype(f), T TableStats::*>)
      if (f == field && at == StatCount()) at = i;
    ++i;
  });
  return at;
}

/// Adds (sums) a part's counters `t` into `out`.
inline void AddStats(const TableStats& t, EmbeddingStats* out) {
  ForEachStat([&](const char*, const char*, auto tf, auto ef) {
    out->*ef += static_cast<std::remove_reference_t<decltype(out->*ef)>>(t.*tf);
  });
}

}  // namespace pskv::embedding
