#include "kvstore/device_values.h"

#include <algorithm>
#include <atomic>
#include <set>

#include "device/runtime.h"
#include "pskv/error.h"

namespace pskv {

namespace {

using cuda::StreamKind;

// Enqueues on `s` (of logical device `id`) a wait for the work queued on a's ready stream.
void WaitReady(int id, cuda::Stream s, const NDArray& a) {
  if (a.ready_stream()) cuda::WaitStream(id, s, a.ready_stream());
}

}  // namespace

bool AnyOnDevice(const std::vector<NDArray>& values) {
  return std::any_of(values.begin(), values.end(),
                     [](const NDArray& v) { return v.device().is_cuda(); });
}

std::map<int, int> Placement::Place(std::vector<Request> requests) {
  std::stable_sort(requests.begin(), requests.end(),
                   [](const Request& a, const Request& b) { return a.bytes > b.bytes; });
  std::map<int, int> home;
  for (const Request& r : requests) {
    int best = -1;
    for (int d : std::set<int>(r.devices.begin(), r.devices.end())) {
      if (best < 0 || load_[d] < load_[best]) best = d;
    }
    load_[best] += r.bytes;
    home[r.key] = best;
  }
  return home;
}

std::vector<NDArray> StageOnHost(const std::vector<NDArray>& values) {
  // Each device source goes to a pinned buffer on its device's d2h stream.
  std::vector<NDArray> host(values.size());
  std::vector<cuda::Stream> used;
  for (size_t i = 0; i < values.size(); ++i) {
    const NDArray& v = values[i];
    if (!v.device().is_cuda()) {
      host[i] = v;
      continue;
    }
    host[i] = NDArray(v.shape(), v.dtype(), Device::Pinned());
    const int id = v.device().id;
    cuda::Stream s = cuda::GetStream(id, StreamKind::kD2H);
    WaitReady(id, s, v);
    cuda::CopyAsync(host[i].raw(), host[i].device(), v.raw(), v.device(), v.nbytes(), s);
    if (std::find(used.begin(), used.end(), s) == used.end()) used.push_back(s);
  }
  for (cuda::Stream s : used) cuda::StreamSync(s);
  return host;
}

NDArray ReduceOnHost(Reducer& reducer, const std::vector<NDArray>& values, NDArray* merge) {
  if (!AnyOnDevice(values) && values.size() == 1) return values[0];
  const std::vector<NDArray> host = StageOnHost(values);
  if (merge->empty()) *merge = NDArray(values[0].shape(), values[0].dtype());
  reducer.Sum(host, merge);
  return *merge;
}

NDArray EnqueueReduceOnDevice(DeviceSlot& slot, const std::vector<NDArray>& values) {
  const int home = slot.home;
  const Device hd = Device::CUDA(home);
  cuda::Stream s = cuda::GetStream(home, StreamKind::kCompute);
  std::vector<NDArray> srcs(values.size());
  slot.staged.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const NDArray& v = values[i];
    WaitReady(home, s, v);
    if (v.device() == hd) {
      srcs[i] = v;
      continue;
    }
    NDArray& st = slot.staged[i];
    if (st.empty()) st = NDArray(v.shape(), v.dtype(), hd);
    cuda::CopyAsync(st.raw(), hd, v.raw(), v.device(), v.nbytes(), s);
    srcs[i] = st;
  }
  if (srcs.size() == 1) return srcs[0];
  if (slot.merge.empty()) slot.merge = NDArray(values[0].shape(), values[0].dtype(), hd);
  cuda::Sum(srcs, &slot.merge, s);
  return slot.merge;
}

NDArray ReduceOnDevice(DeviceSlot& slot, const NDArray& host_value,
                       const std::vector<NDArray>& values) {
  if (slot.weight.empty()) slot.weight = host_value.To(Device::CUDA(slot.home));  // one h2d
  NDArray merged = EnqueueReduceOnDevice(slot, values);
  cuda::StreamSync(cuda::GetStream(slot.home, StreamKind::kCompute));
  return merged;
}

void CopyToOutputs(const NDArray& src, const std::vector<NDArray>& outs) {
  std::vector<cuda::Stream> used;
  for (const NDArray& o : outs) {
    if (o.SameData(src)) continue;
    if (!o.device().is_cuda() && !src.device().is_cuda()) {
      NDArray dst = o;
      dst.CopyFrom(src);
      continue;
    }
    // Device to device: the destination's compute stream; to the host: the source's
    // d2h stream; from the host: the destination's h2d stream.
    const bool both = o.device().is_cuda() && src.device().is_cuda();
    const int id = o.device().is_cuda() ? o.device().id : src.device().id;
    const StreamKind kind =
        both ? StreamKind::kCompute : (o.device().is_cuda() ? StreamKind::kH2D : StreamKind::kD2H);
    cuda::Stream s = cuda::GetStream(id, kind);
    WaitReady(id, s, o);  // earlier readers of the output finish first
    cuda::CopyAsync(o.raw(), o.device(), src.raw(), src.device(), src.nbytes(), s);
    if (std::find(used.begin(), used.end(), s) == used.end()) used.push_back(s);
  }
  for (cuda::Stream s : used) cuda::StreamSync(s);
}

void CopyToOutputsAsync(const NDArray& src, const std::vector<NDArray>& outs, bool fan_out,
                        int prefer, std::function<void(std::exception_ptr)> done) {
  // Device outputs, the landing one first when fanning out.
  std::vector<const NDArray*> dev;
  for (const NDArray& o : outs) {
    if (o.device().is_cuda()) {
      dev.push_back(&o);
    } else if (!o.SameData(src)) {
      NDArray h = o;
      h.CopyFrom(src);
    }
  }
  if (dev.empty()) return done(nullptr);
  if (fan_out) {
    auto it = std::find_if(dev.begin(), dev.end(),
                           [&](const NDArray* o) { return o->device().id == prefer; });
    if (it != dev.end()) std::rotate(dev.begin(), it, it + 1);
  }
  std::vector<cuda::Stream> used;
  auto use = [&](cuda::Stream s) {
    if (std::find(used.begin(), used.end(), s) == used.end()) used.push_back(s);
  };
  try {
    const NDArray* landing = dev[0];
    for (const NDArray* o : dev) {
      const int id = o->device().id;
      if (!fan_out || o == landing) {
        // From the host: the output's device's h2d stream.
        cuda::Stream s = cuda::GetStream(id, StreamKind::kH2D);
        WaitReady(id, s, *o);  // earlier readers of the output finish first
        cuda::CopyAsync(o->raw(), o->device(), src.raw(), src.device(), src.nbytes(), s);
        use(s);
        continue;
      }
      if (o->SameData(*landing)) continue;
      // Device to device: the destination's compute stream, after the landing copy.
      cuda::Stream s = cuda::GetStream(id, StreamKind::kCompute);
      WaitReady(id, s, *o);
      cuda::WaitStream(id, s, cuda::GetStream(landing->device().id, StreamKind::kH2D));
      cuda::CopyAsync(o->raw(), o->device(), landing->raw(), landing->device(), src.nbytes(), s);
      use(s);
    }
  } catch (...) {
    for (cuda::Stream s : used) cuda::StreamSync(s);  // nothing in flight reads `src` after
    return done(std::current_exception());
  }
  // One host callback per stream used; the last one to run completes.
  struct Join {
    std::atomic<size_t> left;
    std::function<void(std::exception_ptr)> done;
  };
  auto join = std::make_shared<Join>();
  join->left = used.size();
  join->done = std::move(done);
  for (cuda::Stream s : used)
    cuda::OnStreamDone(s, [join] {
      if (join->left.fetch_sub(1) == 1) join->done(nullptr);
    });
}

}  // namespace pskv
