// ServerCommands: optimizer states as data. kStatesSize snapshots a store's states; a
// pull of the store's key 0 (Kind::kStates) returns the snapshot and drops it; a push
// to it loads states after checking them against the stored weights (on a replicated
// range's primary, then on its replicas, before the answer).
#include <climits>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/commands.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "pskv/error.h"

namespace pskv {

namespace {
const char kNoOptimizer[] = "no optimizer is set on the servers (call SetOptimizer first)";
}  // namespace

std::string ServerCommands::StatesSize(const Call& c) {
  Optimizer* optimizer = store_->config().OptimizerOf(dist::WireKey(c.store, 0));
  if (!optimizer) throw UsageError(kNoOptimizer);
  states_snapshot_ = std::make_shared<const std::string>(optimizer->SaveStates());
  states_store_ = c.store;
  return payload::EncodeStatesSize(states_snapshot_->size());
}

// In an exclusive section (DistServer::Handle).
void ServerCommands::HandleStates(KVRequest&& req) {
  const Message& m = req.msg;
  auto fail = [&](ErrorKind k, const std::string& msg) { store_->answers().Error(req, {k, msg}); };
  // The request's key is the store's key 0 (WireKey(store, 0)): it names the store.
  int64_t key = 0;
  if (m.num_keys() != 1 || !store_->range().keys().WireKeyOf(m.key_ptr()[0], &key) ||
      key != dist::WireKey(dist::StoreOf(key), 0))
    return fail(ErrorKind::kInvalid, "malformed optimizer-states request");
  const int store = dist::StoreOf(key);
  Optimizer* optimizer = store_->config().OptimizerOf(key);
  if (!optimizer) return fail(ErrorKind::kUsage, kNoOptimizer);
  if (req.pull) {
    if (states_store_ != store)
      return fail(ErrorKind::kUsage, "optimizer states requested for another store's snapshot");
    auto snap = std::move(states_snapshot_);
    states_snapshot_.reset();
    if (!snap) return fail(ErrorKind::kUsage, "optimizer states requested without a snapshot");
    return store_->answers().Blob(req, m.key_ptr()[0], std::move(snap));
  }
  std::string blob(m.h.vals_len, '\0');
  m.CopyVals(0, m.h.vals_len, blob.data());
  try {
    optimizer->LoadStates(
        blob, [this, store](int64_t key) { return store_->StatesKeyWeight(store, key); });
  } catch (const std::exception& e) {
    return fail(KindOf(e),
                node_->Tag() + ": cannot load the optimizer states: " + e.what() +
                    " (a per-server states file (PSKVDST1/2) saved with another "
                    "PSKV_WIRE_CHUNK_BYTES or another split of big keys over the servers "
                    "(PSKV_SERVER_WEIGHTS) does not fit: load it with the settings it was "
                    "saved with)");
  }
  // Replicated: every copy of the range loads the same states before the answer.
  if (events_ && events_->OnInitApplied(req)) return;
  store_->answers().Ack(req);
}

}  // namespace pskv
