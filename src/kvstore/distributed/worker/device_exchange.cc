// DeviceExchange: DistWorkerStore's operations on values that live on devices
// (device_exchange.h).
//
// Threads: the operations start on the engine's thread (one at a time per key). The
// pieces of PushPull are issued from host callbacks on the home device's d2h
// stream (they call only the KV layer, never the device runtime); the copies to the
// outputs are enqueued from the node's receive thread (the last answer's callback), and
// the operation completes from a host callback once they finished
// (CopyToOutputsAsync).
#include <atomic>
#include <mutex>

#include "device/runtime.h"
#include "kvstore/distributed/worker/device_exchange.h"
#include "pskv/error.h"

namespace pskv::dist {

namespace {

using cuda::StreamKind;

NDArray& Pinned(NDArray& buf, const KeyMeta& m) {
  if (buf.empty()) buf = NDArray(m.shape, m.dtype, Device::Pinned());
  return buf;
}

// The completion of a request's answer: the pulled bytes in `st.recv` go to the outputs.
// `st` lives as long as the key (a raw pointer: no callback of a backend thread may hold
// the last handle of device memory).
KVWorker::Callback ToOutputs(DeviceKeyState* st, bool fan_out, Engine::Done done) {
  return [st, fan_out, done = std::move(done)](std::exception_ptr e) {
    if (e) return done(e);
    try {
      CopyToOutputsAsync(st->recv, st->outs, fan_out, st->slot.home, done);
    } catch (...) {
      done(std::current_exception());
    }
  };
}

}  // namespace

void DeviceExchange::Prepare(const std::vector<KeyMeta*>& metas, const Grouped& groups,
                             const std::vector<NDArray>& arrays, bool pushed) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Placement::Request> requests;
  for (size_t g = 0; g < metas.size(); ++g) {
    KeyMeta* m = metas[g];
    std::vector<int> devices;
    for (size_t j = 0; j < groups.groups[g].count; ++j) {
      const Device d = groups.At(g, j, arrays).device();
      if (d.is_cuda()) devices.push_back(d.id);
    }
    if (devices.empty()) continue;
    if (!m->dev) m->dev = std::make_shared<DeviceKeyState>();
    if (reduce_on_device_ && pushed && m->dev->slot.home < 0)
      requests.push_back({m->key, static_cast<size_t>(m->size) * DTypeSize(m->dtype), devices});
  }
  if (requests.empty()) return;
  const std::map<int, int> homes = placement_.Place(std::move(requests));
  for (KeyMeta* m : metas)
    if (auto it = homes.find(m->key); it != homes.end()) m->dev->slot.home = it->second;
}

NDArray DeviceExchange::StagedSum(KeyMeta& m, const std::vector<NDArray>& vals) {
  DeviceKeyState& st = *m.dev;
  if (reduce_on_device_ && st.slot.home >= 0) {
    // dist_*_device with compression: the device sum, copied to the host whole (the
    // quantisation reads all of it).
    const int home = st.slot.home;
    const NDArray merged = EnqueueReduceOnDevice(st.slot, vals);
    NDArray& send = Pinned(st.send, m);
    cuda::Stream s = cuda::GetStream(home, StreamKind::kCompute);
    cuda::CopyAsync(send.raw(), send.device(), merged.raw(), merged.device(), merged.nbytes(), s);
    cuda::StreamSync(s);
    return send;
  }
  const std::vector<NDArray> host = StageOnHost(vals);
  return host.size() == 1 ? host[0] : reducer_.Reduce(host, &m.merge);
}

void DeviceExchange::PushPull(KeyMeta& m, const std::vector<NDArray>& vals,
                              const std::vector<NDArray>& outs, int priority, Engine::Done done) {
  DeviceKeyState* st = m.dev.get();
  const int home = st->slot.home;
  const bool pull = !outs.empty();
  st->outs = outs;
  NDArray merged;
  try {
    merged = EnqueueReduceOnDevice(st->slot, vals);
    Pinned(st->send, m);
    if (pull) Pinned(st->recv, m);
  } catch (...) {
    return done(std::current_exception());
  }
  // Every piece's answer counts down; the last one (with the first error, if any)
  // completes the operation: with a pull, after the copies to the outputs.
  struct Pieces {
    std::mutex mu;
    size_t left = 0;
    std::exception_ptr error;
    KVWorker::Callback finish;
    void Answer(std::exception_ptr e) {
      {
        std::lock_guard<std::mutex> lk(mu);
        if (e && !error) error = e;
        if (--left > 0) return;
      }
      finish(error);
    }
  };
  const size_t n = m.ps_keys.size();
  auto pieces = std::make_shared<Pieces>();
  pieces->left = n;
  pieces->finish = pull ? ToOutputs(st, true, std::move(done)) : std::move(done);
  const int cmd = MakeCmd(Kind::kDense, m.dtype);
  cuda::Stream d2h = cuda::GetStream(home, StreamKind::kD2H);
  size_t i = 0;
  try {
    cuda::WaitStream(home, d2h, cuda::GetStream(home, StreamKind::kCompute));  // the sum
    uint64_t off = 0;
    for (; i < n; off += m.lens[i], ++i) {
      char* send = static_cast<char*>(st->send.raw()) + off;
      cuda::CopyAsync(send, st->send.device(), static_cast<const char*>(merged.raw()) + off,
                      merged.device(), m.lens[i], d2h);
      char* recv = pull ? static_cast<char*>(st->recv.raw()) + off : nullptr;
      // Runs once this piece's copy landed (a backend thread: no runtime calls here).
      cuda::OnStreamDone(d2h, [this, mp = &m, i, send, recv, cmd, priority, pieces] {
        try {
          const KeyMeta& k = *mp;
          // No owner: the buffer lives as long as the key, and the operation (hence the
          // store) ends only after every piece was sent and answered.
          const Frame f = Frame::Of(send, k.lens[i], nullptr);
          KVWorker::Callback cb = [pieces](std::exception_ptr e) { pieces->Answer(e); };
          if (recv)
            link_.worker()->PushPull({k.ps_keys[i]}, f, {k.lens[i]}, recv, {k.lens[i]}, cmd,
                                     std::move(cb), priority, wire_.push_ahead,
                                     wire_.MessageBytes());
          else
            link_.worker()->Push({k.ps_keys[i]}, f, {k.lens[i]}, cmd, std::move(cb), priority,
                                 wire_.push_ahead, wire_.MessageBytes());
        } catch (...) {
          pieces->Answer(std::current_exception());
        }
      });
    }
  } catch (...) {
    // Pieces not enqueued fail; those enqueued still go (their servers' rounds expect
    // them) and answer as usual.
    const std::exception_ptr e = std::current_exception();
    for (; i < n; ++i) pieces->Answer(e);
  }
}

void DeviceExchange::Pull(KeyMeta& m, const std::vector<NDArray>& outs, int priority,
                          Engine::Done done) {
  DeviceKeyState* st = m.dev.get();
  st->outs = outs;
  char* recv = static_cast<char*>(Pinned(st->recv, m).raw());
  link_.worker()->Pull(m.ps_keys, recv, m.lens, MakeCmd(Kind::kDense, m.dtype),
                       ToOutputs(st, reduce_on_device_, std::move(done)), priority);
}

void DeviceExchange::PushPullPrepared(KeyMeta& m,
                                      const std::tuple<Frame, std::vector<uint64_t>, int>& prepared,
                                      const std::vector<NDArray>& outs, int priority,
                                      Engine::Done done) {
  const auto& [frame, lens, cmd] = prepared;
  DeviceKeyState* st = m.dev.get();
  st->outs = outs;
  char* recv = static_cast<char*>(Pinned(st->recv, m).raw());
  link_.worker()->PushPull(m.ps_keys, frame, lens, recv, m.lens, cmd,
                           ToOutputs(st, reduce_on_device_, std::move(done)), priority,
                           wire_.push_ahead, wire_.MessageBytes());
}

}  // namespace pskv::dist
