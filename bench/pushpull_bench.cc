// pskv-bench pushpull: one worker (this process) and one server (plus the
// scheduler, in a child process) through the full pskv stack (transport,
// protocol, KV worker/server), twice: a job over TCP only and a job with shared
// memory, measured alternately. The server adds every push into its stored
// value, as a sync server does. Ceilings, measured in the same run: one thread's
// memcpy of the same bytes, and two loopback TCP streams moving the same bytes
// both ways at once (iperf3-like); the single-threaded TCP echo that was the
// ceiling before is reported too ("echo").
#include "bench/pushpull_bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <semaphore>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/tcp_loopback.h"
#include "common/net.h"
#include "kvstore/reduce.h"
#include "ps/kv_app.h"
#include "ps/node.h"
#include "pskv/error.h"

namespace pskv::bench {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

int Reps(int64_t bytes) {
  return std::clamp(static_cast<int>((256ll << 20) / std::max<int64_t>(bytes, 1)), 5, 200);
}

// ---------------------------------------------------------------- TCP ceiling

// ---------------------------------------------------------------- pskv

// Server: one float32 value per key; pushes are added in, pulls answered from it.
class AddServer {
 public:
  explicit AddServer(Node* node)
      : reducer_(node->options().bigarray_bound, node->options().reduction_threads),
        srv_(
            node, [this](KVRequest&& r, KVServer* s) { Handle(std::move(r), s); }, nullptr) {}

 private:
  void Handle(KVRequest&& r, KVServer* s) {
    const Message& m = r.msg;
    const uint64_t key = m.key_ptr()[0], len = m.len_ptr()[0];
    NDArray& v = store_[key];
    if (r.push) {
      const int64_t n = static_cast<int64_t>(len / 4);
      if (v.empty()) v = NDArray({n});
      if (v.size() != n) return s->RespondError(r, ErrorKind::kShape, "size changed");
      // Copy on write: a reply may still be sending the old value.
      if (token_.use_count() > 1) {
        v = v.Clone();
        token_ = std::make_shared<int>(0);
      }
      m.ForEachPiece(0, len, [&](const char* p, uint64_t bytes, uint64_t at) {
        const int64_t n = static_cast<int64_t>(bytes / 4);
        NDArray in;
        if (reinterpret_cast<uintptr_t>(p) % alignof(float) == 0) {
          in = NDArray::Wrap(const_cast<char*>(p), {n}, DType::kFloat32);
        } else {  // a receive buffer need not be aligned for float
          in = NDArray({n});
          std::memcpy(in.raw(), p, bytes);
        }
        NDArray part = v.Slice1D(static_cast<int64_t>(at / 4), static_cast<int64_t>(bytes / 4));
        reducer_.AddTo(in, &part);
      });
    }
    if (!r.pull) return s->Respond(r);
    Frame f;
    f.data = static_cast<const char*>(v.raw());
    f.size = v.nbytes();
    struct Hold {
      NDArray a;
      std::shared_ptr<int> t;
    };
    f.owner = std::make_shared<Hold>(Hold{v, token_});
    s->Respond(r, {key}, std::move(f), {v.nbytes()});
  }
  Reducer reducer_;
  std::map<uint64_t, NDArray> store_;
  std::shared_ptr<int> token_ = std::make_shared<int>(0);
  KVServer srv_;
};

void Wait(const std::function<void(KVWorker::Callback)>& op) {
  std::promise<void> p;
  auto f = p.get_future();
  op([&p](std::exception_ptr e) {
    if (e)
      p.set_exception(e);
    else
      p.set_value();
  });
  if (f.wait_for(60s) != std::future_status::ready)
    throw TimeoutError("benchmark request timed out");
  f.get();
}

// One key of `bytes` bytes (the key is the size, so each size has its own key),
// a source filled with ones sent without copying, and a destination.
struct Payload {
  explicit Payload(int64_t bytes)
      : keys{static_cast<uint64_t>(bytes)},
        lens{static_cast<uint64_t>(bytes)},
        src({bytes / 4}),
        dst({bytes / 4}) {
    src.Fill(1);
    frame.data = static_cast<const char*>(src.raw());
    frame.size = src.nbytes();
    frame.owner = std::make_shared<NDArray>(src);
    out = static_cast<char*>(dst.raw());
  }
  std::vector<uint64_t> keys, lens;
  NDArray src, dst;
  Frame frame;
  char* out = nullptr;
};

}  // namespace

namespace {

// ---------------------------------------------------------------- ceilings

// Single-thread memcpy of `n` bytes between two pre-faulted buffers: the
// bandwidth one core has for moving bytes at this size (the cache level the
// buffers fit in included).
class Memcpy {
 public:
  explicit Memcpy(size_t max_bytes) : src_(max_bytes, 1), dst_(max_bytes, 2) {}
  void Copy(size_t n) {
    std::memcpy(dst_.data(), src_.data(), n);
    sink_ = sink_ + static_cast<unsigned char>(dst_[n - 1]);  // keeps the copy
  }

 private:
  std::vector<char> src_, dst_;
  volatile unsigned sink_ = 0;
};

// iperf3-like: two loopback TCP connections streaming `n` bytes each way at
// the same time, with large non-blocking writes and reads, one thread per end
// (each end polls its outgoing and its incoming socket).
class TcpBidir {
 public:
  explicit TcpBidir(size_t max_bytes)
      : abuf_(max_bytes, 1), arecv_(max_bytes), bbuf_(max_bytes, 2), brecv_(max_bytes) {
    LoopbackPair(&a_out_, &b_in_, true);
    LoopbackPair(&b_out_, &a_in_, true);
    peer_ = std::thread([this] {
      for (;;) {
        go_.acquire();
        if (stop_) return;
        Pump(b_out_, b_in_, bbuf_.data(), brecv_.data(), n_);
        done_.release();
      }
    });
  }
  ~TcpBidir() {
    stop_ = true;
    go_.release();
    peer_.join();
    for (int fd : {a_out_, a_in_, b_out_, b_in_}) ::close(fd);
  }
  void Run(size_t n) {
    n_ = n;
    go_.release();
    Pump(a_out_, a_in_, abuf_.data(), arecv_.data(), n);
    done_.acquire();
  }

 private:
  static void Pump(int out, int in, const char* sbuf, char* rbuf, size_t n) {
    size_t sent = 0, got = 0;
    while (sent < n || got < n) {
      pollfd p[2] = {{out, static_cast<short>(sent < n ? POLLOUT : 0), 0},
                     {in, static_cast<short>(got < n ? POLLIN : 0), 0}};
      if (::poll(p, 2, 10000) <= 0) throw IOError("tcp ceiling: stalled");
      if (sent < n && (p[0].revents & POLLOUT)) {
        ssize_t k = ::send(out, sbuf + sent, n - sent, MSG_NOSIGNAL);
        if (k < 0 && errno != EAGAIN) throw IOError("tcp ceiling: send failed");
        if (k > 0) sent += static_cast<size_t>(k);
      }
      if (got < n && (p[1].revents & POLLIN)) {
        ssize_t k = ::recv(in, rbuf + got, n - got, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN)) throw IOError("tcp ceiling: recv failed");
        if (k > 0) got += static_cast<size_t>(k);
      }
    }
  }
  std::vector<char> abuf_, arecv_, bbuf_, brecv_;
  int a_out_ = -1, a_in_ = -1, b_out_ = -1, b_in_ = -1;
  size_t n_ = 0;
  std::atomic<bool> stop_{false};
  std::binary_semaphore go_{0}, done_{0};
  std::thread peer_;
};

// The scheduler and the server of one job, in a child process forked before
// any thread exists; exits once the worker has finalized.
[[noreturn]] void ServerSide(Options o) {
  int rc = 0;
  try {
    Options so = o, vo = o;
    so.role = Role::kScheduler;
    vo.role = Role::kServer;
    Node sched(so), server(vo);
    AddServer add(&server);
    std::thread ts([&] { sched.Start(); });
    server.Start();
    ts.join();
    std::thread tf([&] { sched.Finalize(1800s); });
    server.Finalize(1800s);
    tf.join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pskv-bench pushpull: server side: %s\n", e.what());
    rc = 1;
  }
  std::fflush(stderr);
  _exit(rc);
}

}  // namespace

int BenchPushPull(int argc, char** argv) {
  const bool json = HasFlag(argc, argv, "--json");
  const int64_t lo = ArgInt(argc, argv, "--min-bytes", 4 << 10);
  const int64_t hi = ArgInt(argc, argv, "--max-bytes", 64 << 20);

  // Two jobs, worker here and scheduler + server in a child process each: one
  // over TCP only, one with shared memory (co-located processes).
  Options jobs[2];
  pid_t kids[2] = {-1, -1};
  for (int j = 0; j < 2; ++j) {
    jobs[j] = LoopbackJob(Options::FromEnv(), 1);
    jobs[j].shm = j == 0 ? "0" : "auto";
    kids[j] = ::fork();
    if (kids[j] < 0) throw IOError("fork failed");
    if (kids[j] == 0) ServerSide(jobs[j]);
  }
  struct Reap {
    pid_t* kids;
    bool ok = false;
    ~Reap() {
      for (int j = 0; j < 2; ++j) {
        if (kids[j] <= 0) continue;
        if (!ok) ::kill(kids[j], SIGKILL);
        ::waitpid(kids[j], nullptr, 0);
      }
    }
  } reap{kids};
  std::unique_ptr<Node> workers[2];
  std::unique_ptr<KVWorker> kv[2];
  for (int j = 0; j < 2; ++j) {
    jobs[j].role = Role::kWorker;
    workers[j] = std::make_unique<Node>(jobs[j]);
    kv[j] = std::make_unique<KVWorker>(workers[j].get());
    workers[j]->Start();
  }

  // What the shm job measures: its worker's messages to the server must travel
  // through shared memory (a fallback to TCP would be measured as "shm"). The
  // switch to the ring happens on a send once the server attached it: small
  // push+pulls until then (bounded: 5 s).
  const int server = workers[1]->ServerIds().at(0);
  {
    Payload warm(4096);
    for (int i = 0; i < 500 && workers[1]->DataPathTo(server) != "shm"; ++i) {
      Wait([&](auto cb) {
        kv[1]->PushPull(warm.keys, warm.frame, warm.lens, warm.out, warm.lens, 0, cb);
      });
      std::this_thread::sleep_for(10ms);
    }
  }
  std::string shm_path = workers[1]->DataPathTo(server);
  Memcpy mem(static_cast<size_t>(hi));
  TcpBidir bidir(static_cast<size_t>(hi));
  TcpPair echo(static_cast<size_t>(hi));
  // Memory bandwidth of one core: memcpy of buffers twice the size of a large
  // last-level cache, so that every byte comes from and goes to DRAM.
  double bw_g = 0;
  {
    constexpr size_t kBig = size_t{64} << 20;
    Memcpy big(kBig);
    bw_g = static_cast<double>(kBig) / Median(5, [&] { big.Copy(kBig); }) / 1e9;
  }
  if (!json)
    std::printf(
        "pushpull: 1 worker + 1 server in separate processes on this host, the server adds "
        "every push into its value; GB/s = 2 x bytes / push+pull time (median)\n"
        "jobs measured alternately: tcp (PSKV_SHM=0) and shm (shared memory)\n"
        "ceilings, same run: mem = one thread's memcpy of the same bytes (cache-resident "
        "when they fit); bw = one thread's memcpy bandwidth from DRAM (64 MiB buffers): "
        "%.3f GB/s; bidir = two TCP streams on 127.0.0.1, one each way at once "
        "(iperf3-like); echo = the old ceiling, a TCP echo\n"
        "%10s %7s %7s %7s %7s %7s | %7s %7s %7s %7s %7s %7s %7s | %8s %8s\n",
        bw_g, "bytes", "tcp", "shm", "mem", "bidir", "echo", "tcp/mem", "shm/mem", "tcp/bw",
        "shm/bw", "tcp/bid", "shm/bid", "shm/tcp", "tcp us", "shm us");
  for (int64_t bytes = lo; bytes <= hi; bytes *= 4) {
    const int reps = Reps(bytes);
    const auto n = static_cast<size_t>(bytes);
    Payload pay(bytes);
    std::vector<double> t[2];
    for (int r = -1; r < reps; ++r)  // r = -1: warm-up; alternate so drift hits both
      for (int j = 0; j < 2; ++j) {
        const auto t0 = Clock::now();
        Wait([&](auto cb) {
          kv[j]->PushPull(pay.keys, pay.frame, pay.lens, pay.out, pay.lens, 0, cb);
        });
        if (r >= 0) t[j].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    double tj[2];
    for (int j = 0; j < 2; ++j) {
      std::sort(t[j].begin(), t[j].end());
      tj[j] = t[j][t[j].size() / 2];
    }
    const double t_mem = Median(std::max(reps, 20), [&] { mem.Copy(n); });
    const double t_bid = Median(reps, [&] { bidir.Run(n); });
    const double t_echo = Median(reps, [&] { echo.RoundTrip(n); });
    const double b = static_cast<double>(bytes);
    const double tcp_g = 2 * b / tj[0] / 1e9, shm_g = 2 * b / tj[1] / 1e9, mem_g = b / t_mem / 1e9,
                 bid_g = 2 * b / t_bid / 1e9, echo_g = 2 * b / t_echo / 1e9;
    if (json)
      std::printf(
          "{\"bench\":\"pushpull\",\"bytes\":%lld,\"gbps\":%.4f,\"ceiling_gbps\":%.4f,"
          "\"ratio\":%.3f,\"tcp_gbps\":%.4f,\"shm_gbps\":%.4f,\"memcpy_gbps\":%.4f,"
          "\"memcpy_bw_gbps\":%.4f,\"bidir_gbps\":%.4f,\"echo_gbps\":%.4f,\"tcp_us\":%.1f,"
          "\"shm_us\":%.1f,\"shm_path\":\"%s\"}\n",
          static_cast<long long>(bytes), shm_g, mem_g, shm_g / mem_g, tcp_g, shm_g, mem_g, bw_g,
          bid_g, echo_g, tj[0] * 1e6, tj[1] * 1e6, shm_path.c_str());
    else
      std::printf(
          "%10lld %7.3f %7.3f %7.2f %7.3f %7.3f | %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f | "
          "%8.1f %8.1f\n",
          static_cast<long long>(bytes), tcp_g, shm_g, mem_g, bid_g, echo_g, tcp_g / mem_g,
          shm_g / mem_g, tcp_g / bw_g, shm_g / bw_g, tcp_g / bid_g, shm_g / bid_g, shm_g / tcp_g,
          tj[0] * 1e6, tj[1] * 1e6);
    std::fflush(stdout);
  }
  if (workers[1]->DataPathTo(server) != "shm") shm_path = workers[1]->DataPathTo(server);
  if (shm_path != "shm")
    std::fprintf(stderr, "pskv-bench pushpull: the shm job's worker sends through %s, not shm\n",
                 shm_path.c_str());
  for (int j = 0; j < 2; ++j) workers[j]->Finalize(60s);
  int rc = 0;
  for (int j = 0; j < 2; ++j) {
    int status = 0;
    ::waitpid(kids[j], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
    kids[j] = -1;
  }
  reap.ok = true;
  return shm_path == "shm" ? rc : 1;
}

// What authentication and encryption cost: three 1-worker 1-server jobs in
// this process — open (no secret), authenticated (secret), encrypted (CURVE) —
// measured alternately, one repetition each in turn, so that drift of the
// machine affects all three alike. Ratios are against the open job.
namespace {
struct MiniJob {
  Node sched, server, worker;
  AddServer add;
  KVWorker kv;
  MiniJob(Options o, const std::string& secret, bool encrypt)
      : sched(With(o, Role::kScheduler, secret, encrypt)),
        server(With(o, Role::kServer, secret, encrypt)),
        worker(With(o, Role::kWorker, secret, encrypt)),
        add(&server),
        kv(&worker) {
    std::thread ts([&] { sched.Start(); }), tv([&] { server.Start(); });
    worker.Start();
    ts.join();
    tv.join();
  }
  ~MiniJob() {
    std::thread tf1([&] { sched.Finalize(30s); }), tf2([&] { server.Finalize(30s); });
    worker.Finalize(30s);
    tf1.join();
    tf2.join();
  }
  static Options With(Options o, Role r, const std::string& secret, bool encrypt) {
    o.role = r;
    o.job_secret = secret;
    o.encrypt = encrypt;
    o.shm = "0";  // the network path is what is measured
    return o;
  }
};

double Seconds(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int BenchSecurity(int argc, char** argv) {
  const int64_t lo = ArgInt(argc, argv, "--min-bytes", 4 << 10);
  const int64_t hi = ArgInt(argc, argv, "--max-bytes", 64 << 20);
  const Options env = Options::FromEnv();
  std::vector<std::unique_ptr<MiniJob>> jobs;
  for (int j = 0; j < 3; ++j)
    jobs.push_back(std::make_unique<MiniJob>(LoopbackJob(env, 1), j ? "bench-secret" : "", j == 2));
  std::printf(
      "security: push+pull through 1 worker + 1 server on 127.0.0.1, three jobs measured "
      "alternately\n%10s %12s %12s %12s %10s %10s\n",
      "bytes", "open GB/s", "secret GB/s", "curve GB/s", "secret/open", "curve/open");
  for (int64_t bytes = lo; bytes <= hi; bytes *= 4) {
    const int reps = Reps(bytes);
    Payload pay(bytes);
    const auto &keys = pay.keys, &lens = pay.lens;
    const Frame& f = pay.frame;
    char* out = pay.out;
    std::vector<double> t[3];
    for (int r = -1; r < reps; ++r)  // r = -1: warm-up
      for (int j = 0; j < 3; ++j) {
        KVWorker& kv = jobs[static_cast<size_t>(j)]->kv;
        double s =
            Seconds([&] { Wait([&](auto cb) { kv.PushPull(keys, f, lens, out, lens, 0, cb); }); });
        if (r >= 0) t[j].push_back(s);
      }
    double g[3];
    for (int j = 0; j < 3; ++j) {
      std::sort(t[j].begin(), t[j].end());
      g[j] = 2.0 * static_cast<double>(bytes) / t[j][t[j].size() / 2] / 1e9;
    }
    std::printf("%10lld %12.3f %12.3f %12.3f %10.3f %10.3f\n", static_cast<long long>(bytes), g[0],
                g[1], g[2], g[1] / g[0], g[2] / g[0]);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace pskv::bench
