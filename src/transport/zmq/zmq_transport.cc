#include "transport/zmq/zmq_transport.h"

#include <malloc.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "pskv/error.h"

namespace pskv {

namespace {

std::string ZmqErr() {
  return zmq_strerror(zmq_errno());
}

void SetInt(void* sock, int opt, int v) {
  zmq_setsockopt(sock, opt, &v, sizeof v);
}

// ZeroMQ's free callback: drops our reference to the frame's owner.
void ReleaseOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

// ZeroMQ allocates every received message with malloc. Values arrive in 1 MiB
// chunks (protocol/message.h); these settings make glibc serve such chunks from
// its heaps and keep freed memory for reuse instead of returning it to the kernel,
// so a stream of large messages does not fault in fresh pages every time (this
// halved ps-lite's throughput at 64 MB). Process-wide, done once.
void TuneAllocatorOnce() {
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 8 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    return true;
  }();
  (void)done;
}

class ZmqTransport final : public Transport {
 public:
  ZmqTransport() {
    TuneAllocatorOnce();
    ctx_ = zmq_ctx_new();
    if (!ctx_) throw IOError("zmq_ctx_new failed: " + ZmqErr());
    zmq_ctx_set(ctx_, ZMQ_MAX_SOCKETS, 65536);
    zmq_ctx_set(ctx_, ZMQ_IO_THREADS, 1);
  }
  ~ZmqTransport() override { Close(std::chrono::milliseconds(0)); }

  std::string Bind(const std::string& host, int port) override {
    if (router_) throw UsageError("transport already bound");
    router_ = zmq_socket(ctx_, ZMQ_ROUTER);
    SetInt(router_, ZMQ_RCVHWM, 0);
    SetInt(router_, ZMQ_LINGER, 0);
    std::string addr = "tcp://" + host + ":" + (port > 0 ? std::to_string(port) : "*");
    if (zmq_bind(router_, addr.c_str()) != 0) {
      std::string err = ZmqErr();
      zmq_close(router_);
      router_ = nullptr;
      throw IOError("cannot bind " + addr + ": " + err +
                    (port > 0 ? " (is another job using this port?)" : ""));
    }
    char buf[256];
    size_t len = sizeof buf;
    zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, buf, &len);
    std::string ep(buf);  // tcp://127.0.0.1:45678
    auto colon = ep.rfind(':');
    return host + ":" + ep.substr(colon + 1);
  }

  void Connect(int peer, const std::string& endpoint) override {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    auto it = peers_.find(peer);
    if (it != peers_.end()) {
      if (it->second->endpoint == endpoint) return;
      CloseSocket(it->second->sock, 0);
      peers_.erase(it);
    }
    void* s = zmq_socket(ctx_, ZMQ_DEALER);
    SetInt(s, ZMQ_SNDHWM, 0);  // never block: a dead peer is detected by heartbeats
    SetInt(s, ZMQ_LINGER, 0);
    SetInt(s, ZMQ_RECONNECT_IVL, 100);
    SetInt(s, ZMQ_RECONNECT_IVL_MAX, 2000);
    std::string addr = "tcp://" + endpoint;
    if (zmq_connect(s, addr.c_str()) != 0) {
      std::string err = ZmqErr();
      zmq_close(s);
      throw IOError("cannot connect to " + addr + ": " + err);
    }
    auto p = std::make_unique<Peer>();
    p->sock = s;
    p->endpoint = endpoint;
    peers_.emplace(peer, std::move(p));
  }

  void Disconnect(int peer) override {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return;
    CloseSocket(it->second->sock, 0);
    peers_.erase(it);
  }

  void Send(int peer, std::vector<Frame> frames) override {
    std::shared_lock<std::shared_mutex> lk(peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) throw IOError("no connection to node " + std::to_string(peer));
    Peer& p = *it->second;
    std::lock_guard<std::mutex> plk(p.mu);
    for (size_t i = 0; i < frames.size(); ++i) {
      Frame& f = frames[i];
      zmq_msg_t msg;
      if (f.owner && f.size >= 256) {
        auto* hint = new std::shared_ptr<const void>(std::move(f.owner));
        zmq_msg_init_data(&msg, const_cast<char*>(f.data), f.size, ReleaseOwner, hint);
      } else {
        zmq_msg_init_size(&msg, f.size);
        if (f.size) std::memcpy(zmq_msg_data(&msg), f.data, f.size);
      }
      int flags = (i + 1 < frames.size() ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT;
      while (zmq_msg_send(&msg, p.sock, flags) < 0) {
        if (zmq_errno() == EINTR) continue;
        std::string err = ZmqErr();
        zmq_msg_close(&msg);
        throw IOError("send to node " + std::to_string(peer) + " at " + p.endpoint +
                      " failed: " + err);
      }
    }
  }

  bool Recv(std::vector<Frame>* frames, std::chrono::milliseconds timeout) override {
    frames->clear();
    zmq_pollitem_t item{router_, 0, ZMQ_POLLIN, 0};
    int rc = zmq_poll(&item, 1, static_cast<long>(timeout.count()));
    if (rc <= 0) return false;
    bool first = true;
    for (;;) {
      auto* msg = new zmq_msg_t;
      zmq_msg_init(msg);
      while (zmq_msg_recv(msg, router_, 0) < 0) {
        if (zmq_errno() == EINTR) continue;
        std::string err = ZmqErr();
        zmq_msg_close(msg);
        delete msg;
        throw IOError("receive failed: " + err);
      }
      int more = zmq_msg_more(msg);
      if (first) {  // the ROUTER's identity frame: not ours
        first = false;
        zmq_msg_close(msg);
        delete msg;
      } else {
        Frame f;
        f.data = static_cast<const char*>(zmq_msg_data(msg));
        f.size = zmq_msg_size(msg);
        f.owner = std::shared_ptr<const void>(msg, [](const void* m) {
          auto* zm = static_cast<zmq_msg_t*>(const_cast<void*>(m));
          zmq_msg_close(zm);
          delete zm;
        });
        frames->push_back(std::move(f));
      }
      if (!more) break;
    }
    return true;
  }

  void Close(std::chrono::milliseconds linger) override {
    std::unique_lock<std::shared_mutex> lk(peers_mu_);
    if (!ctx_) return;
    for (auto& [id, p] : peers_) CloseSocket(p->sock, static_cast<int>(linger.count()));
    peers_.clear();
    if (router_) CloseSocket(router_, 0);
    router_ = nullptr;
    zmq_ctx_term(ctx_);
    ctx_ = nullptr;
  }

  std::string Name() const override { return "zmq"; }

 private:
  struct Peer {
    void* sock = nullptr;
    std::string endpoint;
    std::mutex mu;
  };
  static void CloseSocket(void* s, int linger) {
    SetInt(s, ZMQ_LINGER, linger);
    zmq_close(s);
  }

  void* ctx_ = nullptr;
  void* router_ = nullptr;
  std::shared_mutex peers_mu_;
  std::map<int, std::unique_ptr<Peer>> peers_;
};

}  // namespace

std::unique_ptr<Transport> CreateZmqTransport() {
  return std::make_unique<ZmqTransport>();
}

}  // namespace pskv
