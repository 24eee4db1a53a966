// The receiving side of the upgrading transport (receiving.h): the Recv loop.
#include "transport/upgrade/receiving.h"

#include <sched.h>
#include <sys/epoll.h>

#include <algorithm>
#include <thread>

#include "transport/upgrade/negotiator.h"
#include "transport/zmq/zmq_transport.h"

namespace pskv::upgrade {

using namespace std::chrono_literals;

bool Receiver::Recv(Received* in, std::chrono::milliseconds timeout) {
  in->frames.clear();
  in->peer = 0;
  in->conn = 0;
  in->peer_addr.clear();
  const auto deadline = Clock::now() + timeout;
  std::lock_guard<std::mutex> lk(in_mu_);
  // Alternate which source is looked at first, so neither starves the other.
  zmq_first_ = !zmq_first_;
  // False right after ZeroMQ was found empty and nothing says it changed: skip
  // one look. Nothing is missed: its descriptor is in the epoll set, and each
  // sleep is preceded by a look.
  bool zmq_maybe = true;
  if (epfd_ < 0) {  // closed
    std::this_thread::sleep_for(std::min(timeout, 100ms));
    return false;
  }
  for (int pass = 0;; ++pass) {
    bool got = false;
    const bool look = zmq_maybe;
    if (zmq_first_ && look) got = control_.Recv(in, 0ms);
    if (!got && PumpAll(in)) return true;
    if (!got && !zmq_first_ && look) got = control_.Recv(in, 0ms);
    zmq_maybe = true;
    if (!got && zmq_fd_ >= 0 && SpinFor(deadline)) {
      zmq_maybe = spun_zmq_;
      continue;
    }
    if (!got) {
      // Nothing anywhere: ask the paths' writers for a wake-up, then sleep on
      // the epoll set.
      const bool data = incoming_.Arm();
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 && pass > 0) {
        incoming_.Disarm();
        return false;
      }
      if (data) {
        zmq_maybe = !look;  // looked at (and empty) in this pass: skip one look
        continue;
      }
      if (zmq_fd_ < 0) {  // not bound (a sender only): ZeroMQ's own wait
        got = control_.Recv(in, std::max(left, 0ms));
        incoming_.Disarm();
        if (!got) {
          if (Clock::now() >= deadline) return PumpAll(in);
          continue;
        }
      } else {
        epoll_event evs[64];
        const int n = ::epoll_wait(epfd_, evs, 64, static_cast<int>(std::max(left, 0ms).count()));
        incoming_.Disarm();
        zmq_maybe = HandleEvents(evs, std::max(n, 0));
        events_fresh_ = true;
        if (n <= 0 && Clock::now() >= deadline) {
          if (PumpAll(in)) return true;
          got = control_.Recv(in, 0ms);
          if (!got) return false;
        } else {
          continue;
        }
      }
    }
    NoteMessage(*in);
    if (incoming_.HandleControl(*in)) continue;
    incoming_.CameOverControl(*in);
    return true;
  }
}

bool Receiver::Watch(int fd, int op, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  return ::epoll_ctl(epfd_, op, fd, &ev) == 0;
}

void Receiver::Events() {
  epoll_event evs[64];
  HandleEvents(evs, std::max(0, ::epoll_wait(epfd_, evs, 64, 0)));
}

bool Receiver::HandleEvents(const epoll_event* evs, int n) {
  bool zmq = false;
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.fd == zmq_fd_) {
      zmq = true;
      continue;
    }
    if (evs[i].data.fd == rx_rd_) {
      Drain(rx_rd_);  // a ring writer's wake-up: the rings are looked at below
      continue;
    }
    incoming_.OnEvent(evs[i].data.fd, evs[i].events);
  }
  return zmq;
}

void Receiver::NoteMessage(const Received& m) {
  if (spin_.count() <= 0) return;
  uint64_t bytes = 0;
  for (const Frame& f : m.frames) bytes += f.size;
  if (bytes <= kSpinAfterBytes) last_small_msg_ = Clock::now();
}

bool Receiver::SpinFor(Clock::time_point deadline) {
  if (spin_.count() <= 0) return false;
  const auto now = Clock::now();
  if (now - last_small_msg_ > 20 * spin_) return false;  // idle: sleep at once
  const auto until = std::min(deadline, now + spin_);
  for (int i = 0; i < 100000 && Clock::now() < until; ++i) {
    epoll_event evs[64];
    const int n = ::epoll_wait(epfd_, evs, 64, 0);
    if (n > 0) {
      spun_zmq_ = HandleEvents(evs, n);
      events_fresh_ = true;
      return true;
    }
    if (incoming_.AnyReady()) {
      spun_zmq_ = false;
      return true;
    }
    ::sched_yield();
  }
  return false;
}

bool Receiver::PumpAll(Received* out) {
  if (incoming_.size() == 0) return false;
  if (!std::exchange(events_fresh_, false)) Events();
  if (!incoming_.Pump(out)) return false;
  NoteMessage(*out);
  return true;
}

void Receiver::WatchControl(Transport& zmq) {
  std::lock_guard<std::mutex> g(in_mu_);
  zmq_fd_ = ZmqReceiveFd(zmq);
  if (zmq_fd_ >= 0 && !Watch(zmq_fd_, EPOLL_CTL_ADD, EPOLLIN)) zmq_fd_ = -1;
}

void Receiver::Clear() {
  std::lock_guard<std::mutex> lk(in_mu_);
  incoming_.Clear();  // each path stops reading (a ring is marked closed)
}

}  // namespace pskv::upgrade
