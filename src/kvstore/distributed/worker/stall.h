// A dist store's Wait: waits for its engine with the stall-report policy of
// common/stall.h (first after PSKV_STALL_WARNING, then each time the wait doubled);
// each report logs what this worker waits for (its pending requests, the servers'
// open sync rounds); the TimeoutError names the same. A server reporting a round of a
// waited key as waiting for a worker that is in Barrier() is a deadlock: TimeoutError
// at once. Timeouts and failures break the store (ServerLink).
#pragma once

#include <chrono>
#include <vector>

#include "kvstore/distributed/wire/kv_payload.h"
#include "kvstore/distributed/worker/server_link.h"
#include "kvstore/engine.h"

namespace pskv::dist {

/// The servers' kRoundStatus replies (KVWorker::Command, one per server) joined into
/// one. An empty reply is a server that left the job during the command (counted as
/// answered; the live copies of its ranges answered for them) and is skipped; a
/// malformed one is an error.
payload::RoundStatus JoinRoundStatus(const std::vector<std::string>& replies);

/// Blocks until every operation on `keys` (null: all keys) completed, then rethrows a
/// recorded failure; TimeoutError after `timeout`.
void WaitWithStallReports(Engine& engine, ServerLink& link, const std::vector<int>* keys,
                          std::chrono::milliseconds timeout);

}  // namespace pskv::dist
