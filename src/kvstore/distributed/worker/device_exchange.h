// The dist stores with values on devices (docs/gpu.md, "The dist stores on devices"):
// the per-key state DistWorkerStore's device operations keep (device_exchange.cc).
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
#pragma once

#include <vector>

#include "kvstore/device_values.h"
#include "pskv/ndarray.h"

namespace pskv::dist {

struct DeviceKeyState {
  DeviceSlot slot;            // home device (dist_*_device), merge and staged buffers
  NDArray send, recv;         // pinned host buffers of the key's shape and dtype
  std::vector<NDArray> outs;  // the latest operation's outputs (see above)
};

}  // namespace pskv::dist
