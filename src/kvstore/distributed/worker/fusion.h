// Fusion (PSKV_FUSION_KEY_BYTES, PSKV_FUSION_BYTES): within one Push, Pull or
// PushPull call, the small keys (held whole by one server, dense) of the same server
// and dtype travel together: one engine operation over those keys (so each key's
// order with its other operations is kept) sends one message of up to
// PSKV_FUSION_BYTES, its values gathered from the keys' arrays (no packing copy); the
// server handles each key as if it had come alone and answers the message once all
// its keys' rounds completed (range_store.h), gathering the answer from the stored
// values; the answer is copied out per key. Nothing waits for later calls: fusion adds
// no delay (calls issued one key at a time are not fused).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kvstore/distributed/worker/key_table.h"
#include "kvstore/engine.h"
#include "ps/kv_app.h"

namespace pskv::dist {

/// The fusion groups of a call's keys (`metas`, ascending; groups given by index into
/// it): 2+ keys each, of one server and dtype, whole on that server with at most
/// `key_bytes` each, at most `group_bytes` together. Sets (*fused)[g] for the keys
/// fused. No groups when `key_bytes` <= 0.
std::vector<std::vector<size_t>> FusionGroups(const std::vector<KeyMeta*>& metas, int64_t key_bytes,
                                              int64_t group_bytes, std::vector<char>* fused);

/// A call whose fusion groups are issued together: push (values: `vg`'s groups of
/// `*vals`), pull (into `dg`'s groups of `*outs`) or both (push-pull).
struct FusedCall {
  const std::vector<KeyMeta*>* metas = nullptr;
  const Grouped* vg = nullptr;
  const std::vector<NDArray>* vals = nullptr;
  const Grouped* dg = nullptr;
  const std::vector<NDArray>* outs = nullptr;
  int priority = 0;
  const char* op = "";  // "push", "pull", "pushpull" (observability)
};

/// Sends one key's several values as one frame (the store's local reduce).
using PrepareFn = std::function<Frame(KeyMeta&, const std::vector<NDArray>&)>;

/// One engine operation over all fusion `groups` of `call`: each group is one request
/// to its server, issued in turn (values not packed: a gathered frame points at them);
/// the answer is scattered from the receive buffer straight into each key's first
/// output, then copied into its other outputs. The operation completes when every
/// request has (with the first failure). One operation per call, not per group: each
/// costs its keys' bookkeeping, a wake-up of the engine's thread and a completion.
/// `worker` and `prepare` must outlive the operation.
void IssueFused(const std::vector<std::vector<size_t>>& groups, const FusedCall& call,
                Engine* engine, KVWorker* worker, PrepareFn prepare);

}  // namespace pskv::dist
