// pskv-bench pushpull: one worker and one server (plus the scheduler) as threads
// of this process, talking over TCP on 127.0.0.1 through the full pskv stack
// (ZeroMQ transport, protocol, KV worker/server). The server adds every push into
// its stored value, as a sync server does. Ceiling, measured in the same run: a
// plain TCP socket pair on loopback moving the same bytes in the same directions
// (N out, N back) with reused, pre-faulted buffers.
#include "bench/pushpull_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
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

void WriteAll(int fd, const char* p, size_t n) {
  while (n) {
    ssize_t k = ::send(fd, p, n, 0);
    if (k <= 0) throw IOError("tcp ceiling: send failed");
    p += k;
    n -= static_cast<size_t>(k);
  }
}
void ReadAll(int fd, char* p, size_t n) {
  while (n) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) throw IOError("tcp ceiling: recv failed");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

class TcpPair {
 public:
  explicit TcpPair(size_t max_bytes) : cbuf_(max_bytes, 1), sbuf_(max_bytes, 2) {
    int ls = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
    ::listen(ls, 1);
    client_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(client_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw IOError("tcp connect");
    server_ = ::accept(ls, nullptr, nullptr);
    ::close(ls);
    for (int fd : {client_, server_}) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    echo_ = std::thread([this] {
      for (;;) {
        uint64_t n;
        ReadAll(server_, reinterpret_cast<char*>(&n), 8);
        if (n == 0) return;
        ReadAll(server_, sbuf_.data(), n);
        WriteAll(server_, sbuf_.data(), n);
      }
    });
  }
  ~TcpPair() {
    uint64_t zero = 0;
    WriteAll(client_, reinterpret_cast<char*>(&zero), 8);
    echo_.join();
    ::close(client_);
    ::close(server_);
  }
  // N bytes out, N bytes back.
  void RoundTrip(size_t n) {
    uint64_t len = n;
    WriteAll(client_, reinterpret_cast<char*>(&len), 8);
    WriteAll(client_, cbuf_.data(), n);
    ReadAll(client_, cbuf_.data(), n);
  }

 private:
  std::vector<char> cbuf_, sbuf_;
  int client_ = -1, server_ = -1;
  std::thread echo_;
};

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
        NDArray in =
            NDArray::Wrap(const_cast<char*>(p), {static_cast<int64_t>(bytes / 4)}, DType::kFloat32);
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

int BenchPushPull(int argc, char** argv) {
  bool json = false;
  for (int i = 0; i < argc; ++i) json |= std::strcmp(argv[i], "--json") == 0;
  const int64_t lo = ArgInt(argc, argv, "--min-bytes", 4 << 10);
  const int64_t hi = ArgInt(argc, argv, "--max-bytes", 64 << 20);

  const Options o = LoopbackJob(Options::FromEnv(), 1);
  auto with_role = [&](Role r) {
    Options x = o;
    x.role = r;
    return x;
  };
  Node sched(with_role(Role::kScheduler)), server(with_role(Role::kServer)),
      worker(with_role(Role::kWorker));
  AddServer add(&server);
  KVWorker kv(&worker);
  std::thread ts([&] { sched.Start(); }), tv([&] { server.Start(); });
  worker.Start();
  ts.join();
  tv.join();

  TcpPair tcp(static_cast<size_t>(hi));
  if (!json)
    std::printf(
        "pushpull: 1 worker, 1 server, 127.0.0.1; the server adds every push into its value\n"
        "ceiling: plain TCP socket pair moving the same bytes (N out, N back)\n"
        "%10s %10s %10s %12s %12s %12s %8s %10s\n",
        "bytes", "push GB/s", "pull GB/s", "pushpull GB/s", "ceiling GB/s", "ratio", "",
        "pp lat us");
  int rc = 0;
  for (int64_t bytes = lo; bytes <= hi; bytes *= 4) {
    const int reps = Reps(bytes);
    Payload pay(bytes);
    const auto &keys = pay.keys, &lens = pay.lens;
    const Frame& f = pay.frame;
    char* out = pay.out;
    const double t_push =
        Median(reps, [&] { Wait([&](auto cb) { kv.Push(keys, f, lens, 0, cb); }); });
    const double t_pull =
        Median(reps, [&] { Wait([&](auto cb) { kv.Pull(keys, out, lens, 0, cb); }); });
    const double t_pp =
        Median(reps, [&] { Wait([&](auto cb) { kv.PushPull(keys, f, lens, out, lens, 0, cb); }); });
    const double t_tcp = Median(reps, [&] { tcp.RoundTrip(static_cast<size_t>(bytes)); });
    const double b = static_cast<double>(bytes);
    const double push_g = b / t_push / 1e9, pull_g = b / t_pull / 1e9, pp_g = 2 * b / t_pp / 1e9,
                 ceil_g = 2 * b / t_tcp / 1e9;
    if (json)
      std::printf(
          "{\"bench\":\"pushpull\",\"bytes\":%lld,\"gbps\":%.4f,\"ceiling_gbps\":%.4f,\"ratio\":%."
          "3f,"
          "\"push_gbps\":%.4f,\"pull_gbps\":%.4f,\"push_us\":%.1f,\"pull_us\":%.1f,"
          "\"pushpull_us\":%.1f,\"ceiling_us\":%.1f}\n",
          static_cast<long long>(bytes), pp_g, ceil_g, pp_g / ceil_g, push_g, pull_g, t_push * 1e6,
          t_pull * 1e6, t_pp * 1e6, t_tcp * 1e6);
    else
      std::printf("%10lld %10.3f %10.3f %12.3f %12.3f %12.3f %8s %10.1f\n",
                  static_cast<long long>(bytes), push_g, pull_g, pp_g, ceil_g, pp_g / ceil_g, "",
                  t_pp * 1e6);
    std::fflush(stdout);
  }
  std::thread tf1([&] { sched.Finalize(30s); }), tf2([&] { server.Finalize(30s); });
  worker.Finalize(30s);
  tf1.join();
  tf2.join();
  return rc;
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
