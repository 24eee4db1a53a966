// The collective Init of a dist store's keys (dense and row_sparse alike).
//
// Every worker reports its keys' names, dtypes and shapes to server 0, rank 0
// initialises the servers (`push_rank0`, once per key, reporting any failure to
// server 0), all meet at the worker barrier, then all ask server 0 whether the
// reports agreed: a mismatch (shape, or string-key order) is then the same error on
// every worker instead of an error on one and a hang on the others. Rank 0 rethrows
// its first push failure after the check (at once if the store broke).
// With replicated servers (PSKV_REPLICAS >= 1) the reports and the check go to every
// live server instead (each runs them on every key range it holds), so that they
// outlive the death of any one server (docs/fault-tolerance.md).
#pragma once

#include <functional>

#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/distributed/worker/server_link.h"

namespace pskv::dist {

/// Runs the protocol above for `report.entries` (ids are wire keys); `push_rank0(i)`
/// initialises entry i on the servers and throws on failure (called on rank 0 only).
void CollectiveInit(ServerLink& link, const payload::InitReport& report,
                    const std::function<void(size_t)>& push_rank0);

}  // namespace pskv::dist
