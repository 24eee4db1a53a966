// The dist stores with values on devices (docs/gpu.md, "The dist stores on devices"):
// DeviceExchange, DistWorkerStore's part for values and outputs on devices, and the
// per-key state it keeps (device_exchange.cc).
//
// The d2l chapter's step, per worker and key of M bytes pushed from k devices:
//  * dist_*_device (MXNet's CommDevice under a dist store): the k values are summed on
//    the key's home device (Placement: balanced by bytes over the values' devices); the
//    sum is copied to the key's pinned `send` buffer in pieces, one per wire chunk, and
//    each piece is pushed from a host callback as soon as its copy landed, so the d2h
//    copy of the next piece overlaps the network; a pull lands in the pinned `recv`
//    buffer, goes to one device (the home device's output if any) in one h2d copy and
//    from there device to device to the other outputs. M bytes d2h and M h2d per
//    push-pull whatever k is (with peer copies; (k-1)·M peer bytes each way).
//  * dist_sync / dist_async (MXNet's CommCPU): every device value is staged through
//    pinned memory (k·M d2h) and summed on the CPU; a pull lands in `recv` and goes to
//    each device output in its own h2d copy (k·M h2d).
// The servers never see a device: they get host bytes as from a CPU worker, so results
// are those of a CPU job (bitwise: the device sum adds in the CPU reducer's order).
//
// Ownership: the buffers live as long as the key (no allocation per step, and a host
// callback never drops the last handle of memory, which would call the runtime from a
// backend thread). `outs` holds the outputs of the key's latest operation until its
// next one, so they stay alive while the copies into them run.
//
// Threads: Prepare may be called from any thread (the store's callers); it guards the
// placement and the creation of the keys' DeviceKeyState with its own mutex. The other
// operations run on the engine's thread, one at a time per key (device_exchange.cc).
#pragma once

#include <mutex>
#include <tuple>
#include <vector>

#include "kvstore/device_values.h"
#include "kvstore/distributed/worker/key_table.h"
#include "kvstore/distributed/worker/local_reducer.h"
#include "kvstore/distributed/worker/server_link.h"
#include "kvstore/distributed/worker/wire_shape.h"
#include "kvstore/engine.h"
#include "pskv/ndarray.h"

namespace pskv::dist {

struct DeviceKeyState {
  DeviceSlot slot;            // home device (dist_*_device), merge and staged buffers
  NDArray send, recv;         // pinned host buffers of the key's shape and dtype
  std::vector<NDArray> outs;  // the latest operation's outputs (see above)
};

class DeviceExchange {
 public:
  /// `reduce_on_device`: dist_*_device (sums on a home device per key); else every
  /// device value is staged through pinned memory and summed by `reducer` on the CPU.
  /// `reducer` and `link` belong to the store and outlive this.
  DeviceExchange(bool reduce_on_device, LocalReducer& reducer, ServerLink& link, WireShape wire)
      : reduce_on_device_(reduce_on_device), reducer_(reducer), link_(link), wire_(wire) {}

  /// Before a call's operations are scheduled: the device state of every key with
  /// arrays on devices, and on dist_*_device the home devices of the keys pushed with
  /// device values for the first time (Placement, as the `device` store).
  void Prepare(const std::vector<KeyMeta*>& metas, const Grouped& groups,
               const std::vector<NDArray>& arrays, bool pushed);
  /// Whether a key's push of `vals` takes PushPull below (not with compression: the
  /// quantisation reads the whole sum on the host).
  bool ReducesOnDevice(const std::vector<NDArray>& vals, bool compressed) const {
    return reduce_on_device_ && !compressed && AnyOnDevice(vals);
  }
  /// The sum of a key's values as a host array when some are on devices: on
  /// dist_*_device (placed keys) the device sum copied to the key's pinned send buffer;
  /// otherwise every device value staged through pinned memory and summed on the CPU
  /// (MXNet's CommCPU). Waits for the device work.
  NDArray StagedSum(KeyMeta& m, const std::vector<NDArray>& vals);

  /// Engine operations of one key:
  ///  * PushPull (dist_*_device, no compression, device values): the sum on the key's
  ///    home device, its d2h copy in pieces (one per wire chunk), each piece pushed (or
  ///    push-pulled into the key's pinned receive buffer) from a host callback as soon
  ///    as it landed; with `outs`, then one h2d and device-to-device copies.
  ///  * Pull: into the key's pinned receive buffer, then to `outs` (CopyToOutputsAsync:
  ///    one h2d and a fan-out on dist_*_device, one h2d per device output otherwise).
  ///  * PushPullPrepared: a push-pull of values prepared by the store (which staged
  ///    device values: StagedSum) into the pinned receive buffer, then to `outs` as Pull.
  void PushPull(KeyMeta& m, const std::vector<NDArray>& vals, const std::vector<NDArray>& outs,
                int priority, Engine::Done done);
  void Pull(KeyMeta& m, const std::vector<NDArray>& outs, int priority, Engine::Done done);
  void PushPullPrepared(KeyMeta& m, const std::tuple<Frame, std::vector<uint64_t>, int>& prepared,
                        const std::vector<NDArray>& outs, int priority, Engine::Done done);

 private:
  const bool reduce_on_device_;  // dist_sync_device, dist_async_device
  LocalReducer& reducer_;
  ServerLink& link_;
  const WireShape wire_;
  std::mutex mu_;        // placement_ and the creation of KeyMeta::dev
  Placement placement_;  // home devices of dist_*_device keys
};

}  // namespace pskv::dist
