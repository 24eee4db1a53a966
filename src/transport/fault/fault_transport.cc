#include "transport/fault/fault_transport.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

namespace pskv {

namespace {

class FaultTransport final : public Transport {
 public:
  FaultTransport(std::unique_ptr<Transport> inner, FaultConfig cfg)
      : inner_(std::move(inner)), cfg_(cfg), rng_(cfg.seed) {
    delayer_ = std::thread([this] { DelayLoop(); });
  }
  ~FaultTransport() override { Close(std::chrono::milliseconds(0)); }

  std::string Bind(const std::string& host, int port) override { return inner_->Bind(host, port); }
  void Connect(int peer, const std::string& ep, uint64_t token) override {
    inner_->Connect(peer, ep, token);
  }
  void Disconnect(int peer) override { inner_->Disconnect(peer); }
  bool Recv(Received* in, std::chrono::milliseconds t) override { return inner_->Recv(in, t); }
  std::string RefusedBy(int peer) override { return inner_->RefusedBy(peer); }
  std::chrono::steady_clock::time_point DownSince(int peer) override {
    if (cfg_.partition_reports_down && Partitioned(peer)) return cfg_.partition_from;
    return inner_->DownSince(peer);
  }
  std::chrono::steady_clock::time_point GoneSince(int peer) override {
    return inner_->GoneSince(peer);
  }
  void SetPacingRate(int peer, uint64_t bytes_per_s) override {
    inner_->SetPacingRate(peer, bytes_per_s);
  }
  bool SendStats(int peer, TcpSendStats* out) override { return inner_->SendStats(peer, out); }
  std::string Name() const override { return "fault(" + inner_->Name() + ")"; }

  void Send(int peer, std::vector<Frame> frames) override {
    if (Partitioned(peer)) return;
    if (cfg_.also_send)
      if (auto extra = cfg_.also_send(frames)) inner_->Send(peer, std::move(*extra));
    if (!cfg_.disturb || !cfg_.disturb(frames)) return inner_->Send(peer, std::move(frames));
    double r_drop, r_dup, r_delay;
    {
      std::lock_guard<std::mutex> lk(mu_);
      std::uniform_real_distribution<double> u(0, 1);
      r_drop = u(rng_);
      r_dup = u(rng_);
      r_delay = u(rng_);
    }
    if (r_drop < cfg_.drop) return;
    if (r_delay < cfg_.delay) {
      std::lock_guard<std::mutex> lk(mu_);
      delayed_.push_back({std::chrono::steady_clock::now() + cfg_.delay_time, peer, frames});
      cv_.notify_all();
      if (r_dup < cfg_.duplicate) inner_->Send(peer, frames);
      return;
    }
    if (r_dup < cfg_.duplicate) inner_->Send(peer, frames);
    inner_->Send(peer, std::move(frames));
  }

  void Close(std::chrono::milliseconds linger) override {
    const auto end = std::chrono::steady_clock::now() + linger;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
      stop_ = true;
      stop_by_ = end;
    }
    cv_.notify_all();
    delayer_.join();
    inner_->Close(std::max(std::chrono::milliseconds(0),
                           std::chrono::duration_cast<std::chrono::milliseconds>(
                               end - std::chrono::steady_clock::now())));
  }

 private:
  bool Partitioned(int peer) const {
    if (cfg_.cut && cfg_.cut(peer)) return true;
    if (!cfg_.partition_peers.count(peer)) return false;
    const auto now = std::chrono::steady_clock::now();
    return now >= cfg_.partition_from && now < cfg_.partition_from + cfg_.partition_for;
  }
  void DelayLoop() {
    std::unique_lock<std::mutex> lk(mu_);
    // Messages are due in the order queued (one delay_time for all). After Close:
    // only those due by stop_by_ are still sent.
    while (!stop_ || (!delayed_.empty() && delayed_.front().due <= stop_by_)) {
      if (delayed_.empty()) {
        cv_.wait(lk);
        continue;
      }
      auto due = delayed_.front().due;
      if (std::chrono::steady_clock::now() < due) {
        cv_.wait_until(lk, due);
        continue;
      }
      Delayed d = std::move(delayed_.front());
      delayed_.pop_front();
      lk.unlock();
      try {
        inner_->Send(d.peer, std::move(d.frames));
      } catch (...) {
        // the peer went away meanwhile: a delayed message may be lost, like on a network
      }
      lk.lock();
    }
  }

  struct Delayed {
    std::chrono::steady_clock::time_point due;
    int peer;
    std::vector<Frame> frames;
  };
  std::unique_ptr<Transport> inner_;
  FaultConfig cfg_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::mt19937_64 rng_;
  std::deque<Delayed> delayed_;
  bool stop_ = false;
  std::chrono::steady_clock::time_point stop_by_{};  // Close's linger ends
  std::thread delayer_;
};

}  // namespace

std::unique_ptr<Transport> CreateFaultTransport(std::unique_ptr<Transport> inner, FaultConfig cfg) {
  return std::make_unique<FaultTransport>(std::move(inner), cfg);
}

}  // namespace pskv
