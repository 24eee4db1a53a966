// Values on devices in the local stores (docs/gpu.md, "The local and device stores"):
// how `local` and `device` move, reduce and hand out values that live on devices, with
// MXNet's observable contract.
//
//  * `local` (CommCPU): every device source is copied to a pinned host buffer (k·M
//    bytes d2h per push of k sources of M bytes), summed on the CPU by the Reducer,
//    updated there; a pull copies the host weight to each output (M bytes h2d each).
//  * `device` (CommDevice): each key has a home device, chosen at its first push with
//    device values among its sources' devices (the least loaded by bytes, largest keys
//    first, as MXNet's InitMergeBuffer); its merge buffer, weight and optimizer state
//    live there. Sources on other devices are copied to home (peer copies, or through
//    pinned host memory with MXNET_ENABLE_GPU_P2P=0), summed with pskv's kernels in the
//    Reducer's order, updated with the device kernels of the built-in optimizers; a pull
//    copies the weight to each output. After a key's first push nothing moves between
//    host and device (with peer copies).
//
// Streams: every input is read only after the work queued on its ready stream (the
// producer's, NDArray::Wrap) at the call; every output is written only after the work
// queued on its ready stream (its earlier readers). Each function returns once its
// device work finished (the engine's completion means the data is there), so a caller's
// stream never waits for pskv's.
//
// Thread model: called on the engine's thread for one key at a time; Placement is
// called under the store's metadata lock.
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <vector>

#include "kvstore/reduce.h"
#include "pskv/ndarray.h"

namespace pskv {

/// True when any array lives on a device (kCUDA).
bool AnyOnDevice(const std::vector<NDArray>& values);

/// The device-side state of one key of a `device` store.
struct DeviceSlot {
  int home = -1;                // logical device; -1 until the first device push
  NDArray weight;               // on home, once placed (the key's value from then on)
  NDArray merge;                // on home: the sum of several sources
  std::vector<NDArray> staged;  // on home: copies of sources from other devices
};

/// Chooses home devices for keys of a `device` store: balanced by bytes over the
/// devices of each key's sources, largest keys first, ties to the lowest device.
class Placement {
 public:
  struct Request {
    int key;
    size_t bytes;
    std::vector<int> devices;  // the logical devices of the key's sources
  };
  /// Home device per key of `requests`.
  std::map<int, int> Place(std::vector<Request> requests);
  /// Bytes placed on each device so far.
  const std::map<int, size_t>& load() const { return load_; }

 private:
  std::map<int, size_t> load_;
};

/// Copies every device source to its own pinned host buffer (each on its device's d2h
/// stream, after the source's ready stream) and waits for the copies; host sources are
/// returned as they are. k device sources of M bytes: k·M bytes d2h.
std::vector<NDArray> StageOnHost(const std::vector<NDArray>& values);

/// `local`: stages device sources through pinned host buffers (StageOnHost) and sums on
/// the CPU into `merge` (a host array, allocated on first use); host sources are used as
/// they are. Returns the sum (a source itself when there is one host source).
NDArray ReduceOnHost(Reducer& reducer, const std::vector<NDArray>& values, NDArray* merge);

/// Enqueues on the compute stream of `slot.home` (cuda::GetStream(home, kCompute)): the
/// waits for the sources' ready streams, the copies of sources on other devices (or on
/// the host) into `slot.staged`, and their sum into `slot.merge`. Returns the sum on home
/// (a source itself when there is one source on home) without waiting: work queued on
/// that stream later sees it. Leaves `slot.weight` alone.
NDArray EnqueueReduceOnDevice(DeviceSlot& slot, const std::vector<NDArray>& values);

/// `device`: moves the key's weight to its home at the first call (`host_value`), copies
/// sources to home and sums them there (EnqueueReduceOnDevice). Returns the sum on home
/// (a source itself when there is one source on home). The work is finished when it
/// returns.
NDArray ReduceOnDevice(DeviceSlot& slot, const NDArray& host_value,
                       const std::vector<NDArray>& values);

/// Copies `src` (host or device) into every output (host or device), honouring the
/// outputs' ready streams; returns when every copy finished.
void CopyToOutputs(const NDArray& src, const std::vector<NDArray>& outs);

/// Copies `src` (host memory, pinned for full speed) into every output without waiting,
/// then calls `done` exactly once: with nullptr once every copy finished, or with the
/// error. Host outputs are filled at once. Device outputs:
///  * `fan_out` (the dist_*_device stores): ONE host-to-device copy, into the output on
///    device `prefer` if there is one, else into the first device output; every other
///    device output is copied from that one, device to device (peer, or through the host
///    where peer copies are off);
///  * otherwise (the plain dist stores, as MXNet's CommCPU): one host-to-device copy per
///    device output.
/// Each output is written after the work queued on its ready stream at this call.
/// `done` runs on a backend thread (a host callback) when device copies were made, else
/// on the calling thread; it must not call the device runtime. The outputs and `src`
/// must stay alive until `done` ran (the caller keeps handles: a host callback dropping
/// the last handle of device memory would call the runtime).
void CopyToOutputsAsync(const NDArray& src, const std::vector<NDArray>& outs, bool fan_out,
                        int prefer, std::function<void(std::exception_ptr)> done);

}  // namespace pskv
