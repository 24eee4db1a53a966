// A worker program for the distributed KVStore tests, started by pskv-launch.
// MXNet's dist_sync/dist_async kvstore tests re-expressed with the update
// w <- w + rate*g (SGD with learning rate -rate). Exit status 0 = all checks passed.
//
//   dist_worker SCENARIO [ROUNDS]
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/options.h"
#include "pskv/process.h"
#include "pskv/row_sparse.h"
#include "pskv/tuning.h"
#include "support/env_fail_points.h"
#include "support/worker_checks.h"

using namespace pskv;

namespace {

using ::pskv::test::g_failures;
using ::pskv::test::g_tag;
using ::pskv::test::Throws;

NDArray Full(const Shape& s, double v, DType t = DType::kFloat32) {
  NDArray a(s, t);
  a.Fill(v);
  return a;
}

bool AllEqual(const NDArray& a, double v, double tol = 0) {
  for (int64_t i = 0; i < a.size(); ++i)
    if (std::abs(a.At(i) - v) > tol) {
      std::fprintf(stderr, "%s: element %lld is %.9g, expected %.9g\n", g_tag.c_str(),
                   static_cast<long long>(i), a.At(i), v);
      return false;
    }
  return true;
}

const Shape kSmall = {3, 3};
const Shape kBig = {50, 40};  // 2000 elements: above the test's bound of 1000, sliced
const double kRate = 2;

OptimizerConfig AddRate(double rate) {
  return OptimizerConfig::FromParams("sgd", {{"learning_rate", std::to_string(-rate)}});
}

// ---------------------------------------------------------------- scenarios

void Sync(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  const double tri = n * (n + 1) / 2.0;
  kv.SetOptimizer(AddRate(kRate));
  // int keys, one at a time
  kv.Init(3, Full(kSmall, 1));
  kv.Init(99, Full(kBig, 1));
  for (int i = 0; i < rounds; ++i) {
    kv.Push(3, {Full(kSmall, r + 1)});
    kv.Push(99, {Full(kBig, r + 1)});
    NDArray a(kSmall), b(kBig);
    kv.Pull(3, {a});
    kv.Pull(99, {b});
    kv.WaitAll();
    const double want = 1 + kRate * (i + 1) * tri;
    CHECK_TRUE(AllEqual(a, want), "small key round " + std::to_string(i));
    CHECK_TRUE(AllEqual(b, want), "big key round " + std::to_string(i));
  }
  // lists of keys, several values per key per worker (summed locally first)
  const std::vector<int> keys = {5, 7, 1000};
  kv.Init(keys, {Full(kSmall, 1), Full(kBig, 1), Full(kSmall, 1)});
  for (int i = 0; i < rounds; ++i) {
    std::vector<int> pk;
    std::vector<NDArray> pv;
    for (int k : keys)
      for (int d = 0; d < 2; ++d) {
        pk.push_back(k);
        pv.push_back(Full(k == 7 ? kBig : kSmall, r + 1));
      }
    kv.Push(pk, pv);
    std::vector<NDArray> outs = {NDArray(kSmall), NDArray(kBig), NDArray(kSmall)};
    kv.Pull(keys, outs);
    kv.WaitAll();
    for (auto& o : outs) CHECK_TRUE(AllEqual(o, 1 + kRate * (i + 1) * tri * 2), "list keys");
  }
  // push-pull in one round trip, in place on two "devices"
  kv.Init(11, Full(kBig, 1));
  for (int i = 0; i < rounds; ++i) {
    NDArray d0 = Full(kBig, r + 1), d1 = Full(kBig, r + 1);
    kv.PushPull(11, {d0, d1}, {});
    kv.WaitAll();
    CHECK_TRUE(AllEqual(d0, 1 + kRate * (i + 1) * tri * 2) && AllEqual(d1, d0.At(0)), "pushpull");
  }
  // push-pull in place of one value (sent without a copy, the answer written over
  // it), a key big enough to be sliced over the servers and streamed in pieces
  const Shape huge = {1024, 1024};
  kv.Init(12, Full(huge, 1));
  for (int i = 0; i < rounds; ++i) {
    NDArray d = Full(huge, r + 1);
    kv.PushPull(12, {d}, {});
    kv.WaitAll();
    CHECK_TRUE(AllEqual(d, 1 + kRate * (i + 1) * tri), "pushpull in place, one value");
  }
  kv.Barrier();
}

void SyncStringKeys(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  const double tri = n * (n + 1) / 2.0;
  kv.SetOptimizer(AddRate(kRate));
  const std::vector<std::string> keys = {"fc1_weight", "fc1_bias", "conv_big"};
  kv.Init(keys, {Full(kSmall, 1), Full(kSmall, 1), Full(kBig, 1)});
  for (int i = 0; i < rounds; ++i) {
    kv.Push(keys, {Full(kSmall, r + 1), Full(kSmall, r + 1), Full(kBig, r + 1)});
    std::vector<NDArray> outs = {NDArray(kSmall), NDArray(kSmall), NDArray(kBig)};
    kv.Pull(keys, outs);
    kv.WaitAll();
    for (auto& o : outs) CHECK_TRUE(AllEqual(o, 1 + kRate * (i + 1) * tri), "string keys");
  }
}

void Async(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  kv.SetOptimizer(AddRate(1));
  kv.Init(3, Full(kSmall, 1));
  kv.Init(99, Full(kBig, 1));
  for (int i = 0; i < rounds; ++i) {
    kv.Push(3, {Full(kSmall, r + 1)});
    kv.Push(99, {Full(kBig, r + 1)});
  }
  kv.WaitAll();
  kv.Barrier();
  NDArray a(kSmall), b(kBig);
  kv.Pull(3, {a});
  kv.Pull(99, {b});
  kv.WaitAll();
  const double want = 1 + rounds * n * (n + 1) / 2.0;
  CHECK_TRUE(AllEqual(a, want), "async small key");
  CHECK_TRUE(AllEqual(b, want), "async big key");
  kv.Barrier();
}

// MXNet's 2-bit formulas, simulated here independently for one worker's stream.
struct TwoBitSim {
  float t, r = 0;
  float Step(float g) {
    r += g;
    if (r >= t) {
      r -= t;
      return t;
    }
    if (r <= -t) {
      r += t;
      return -t;
    }
    return 0;
  }
};

void Compression(KVStore& kv, int) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  kv.SetGradientCompression(
      CompressionConfig::FromParams({{"type", "2bit"}, {"threshold", "0.5"}}));
  kv.SetOptimizer(AddRate(1));
  kv.Init(3, Full(kSmall, 0));
  kv.Init(99, Full(kBig, 0));
  // Below, at and above the threshold, negative; residuals carry over.
  const float pushes[] = {0.4f, 0.1f, 0.5f, 0.7f, -0.3f, -0.3f, -2.0f, 0.25f};
  std::vector<TwoBitSim> sims(static_cast<size_t>(n), TwoBitSim{0.5f});
  double expect = 0;
  int round = 0;
  for (float base : pushes) {
    // worker w pushes base * (w + 1)
    for (int w = 0; w < n; ++w)
      expect += sims[static_cast<size_t>(w)].Step(base * static_cast<float>(w + 1));
    kv.Push(3, {Full(kSmall, base * static_cast<float>(r + 1))});
    NDArray a(kSmall);
    kv.Pull(3, {a});
    // the big key with push-pull (MXNet refused push-pull with compression)
    NDArray b = Full(kBig, base * static_cast<float>(r + 1));
    kv.PushPull(99, {b}, {});
    kv.WaitAll();
    CHECK_TRUE(AllEqual(a, expect), "2bit small key round " + std::to_string(round));
    CHECK_TRUE(AllEqual(b, expect), "2bit big key round " + std::to_string(round));
    ++round;
  }
  CHECK_TRUE(Throws([&] { kv.Init(1, Full(kSmall, 0, DType::kFloat16)); }, "float32"),
             "fp16 + compression");
}

void NoOptimizer(KVStore& kv, int rounds) {
  // update_on_kvstore = false: servers sum, workers pull the exact sums.
  const int n = kv.NumWorkers(), r = kv.Rank();
  kv.Init(3, Full(kSmall, 0));
  kv.Init(99, Full(kBig, 0));
  for (int i = 0; i < rounds; ++i) {
    NDArray a = Full(kSmall, (r + 1) * (i + 1)), b = Full(kBig, (r + 1) * (i + 1));
    kv.PushPull(std::vector<int>{3, 99}, {a, b}, std::vector<int>{3, 99}, {a, b});
    kv.WaitAll();
    const double want = (i + 1) * n * (n + 1) / 2.0;
    CHECK_TRUE(AllEqual(a, want) && AllEqual(b, want), "sum round " + std::to_string(i));
  }
}

void MultiPrecision(KVStore& kv, int) {
  const int n = kv.NumWorkers();
  kv.SetOptimizer(
      OptimizerConfig::FromParams("sgd", {{"learning_rate", "-1e-4"}, {"multi_precision", "1"}}));
  kv.Init(0, Full(kSmall, 1, DType::kFloat16));
  kv.Init(1, Full(kBig, 1, DType::kBFloat16));
  for (int i = 0; i < 20; ++i) {
    kv.Push(0, {Full(kSmall, 1, DType::kFloat16)});
    kv.Push(1, {Full(kBig, 1, DType::kBFloat16)});
  }
  NDArray a(kSmall, DType::kFloat16), b(kBig, DType::kBFloat16);
  kv.Pull(0, {a});
  kv.Pull(1, {b});
  kv.WaitAll();
  const float master = 1.0f + 20 * n * 1e-4f;
  CHECK_TRUE(AllEqual(a, HalfToFloat(FloatToHalf(master)), 1e-6), "fp16 master weights");
  CHECK_TRUE(AllEqual(b, BFloat16ToFloat(FloatToBFloat16(master)), 1e-6), "bf16 master weights");
  CHECK_TRUE(a.At(0) > 1.0, "fp16 weight moved");
}

void Misuse(KVStore& kv, int) {
  NDArray out(kSmall);
  CHECK_TRUE(Throws(
                 [&] {
                   kv.Pull(42, {out});
                   kv.WaitAll();
                 },
                 "has not been inited"),
             "pull uninit");
  kv.Init(1, Full(kSmall, 1));
  CHECK_TRUE(Throws([&] { kv.Init(1, Full(kSmall, 1)); }, "duplicate init"), "double init");
  CHECK_TRUE(Throws([&] { kv.Push(1, {Full({2, 2}, 1)}); }, "cannot change"), "size change");
  CHECK_TRUE(Throws([&] { kv.Push(1, {Full(kSmall, 1, DType::kFloat64)}); }, "dtype"),
             "dtype change");
  CHECK_TRUE(Throws([&] { kv.Init("s", Full(kSmall, 1)); }, "Mixed key types"), "mixed keys");
  CHECK_TRUE(Throws([&] { kv.SetUpdater([](int, const NDArray&, NDArray*) {}); }, "SetOptimizer"),
             "updater");
  CHECK_TRUE(
      Throws(
          [&] { kv.PushPull(std::vector<int>{1}, {Full(kSmall, 1)}, std::vector<int>{2}, {out}); },
          "must be the same"),
      "pushpull keys");
  CHECK_TRUE(Throws(
                 [&] {
                   kv.SetGradientCompression(CompressionConfig::FromParams({{"type", "2bit"}}));
                 },
                 "before the first Init"),
             "compression after init");
  CHECK_TRUE(Throws([&] { kv.SaveOptimizerStates("/tmp/pskv_no_opt"); }, "no optimizer"),
             "save w/o optimizer");
  // the store still works after all that
  kv.Push(1, {Full(kSmall, 2)});
  kv.Pull(1, {out});
  kv.WaitAll();
  CHECK_TRUE(AllEqual(out, 2.0 * kv.NumWorkers()), "store usable after errors");
}

void AsyncNoOptimizer(KVStore& kv, int) {
  kv.Init(1, Full(kSmall, 1));
  CHECK_TRUE(Throws([&] { kv.Push(1, {Full(kSmall, 1)}); }, "SetOptimizer"),
             "async without optimizer");
}

void Unequal(KVStore& kv, int rounds) {
  // Worker 0 pushes one round more than the others: its last push cannot complete.
  kv.Init(3, Full(kSmall, 0));
  const int mine = kv.Rank() == 0 ? rounds + 1 : rounds;
  for (int i = 0; i < rounds; ++i) kv.Push(3, {Full(kSmall, 1)});
  kv.WaitAll();
  if (mine > rounds) {
    kv.Push(3, {Full(kSmall, 1)});
    CHECK_TRUE(Throws([&] { kv.WaitAll(); }, "finished the job without pushing"), "unequal pushes");
  }
}

void StringOrder(KVStore& kv, int) {
  std::vector<std::string> keys = {"a", "b"};
  if (kv.Rank() == 1) std::swap(keys[0], keys[1]);
  // Every worker gets the same KeyError from Init (none waits in Init's barrier).
  bool failed = false;
  try {
    kv.Init(keys, {Full(kSmall, 1), Full(kSmall, 1)});
  } catch (const KeyError& e) {
    failed = std::strstr(e.what(), "different order") != nullptr &&
             std::strstr(e.what(), "worker[0]") && std::strstr(e.what(), "worker[1]");
    std::fprintf(stderr, "%s: %s\n", g_tag.c_str(), e.what());
  }
  CHECK_TRUE(failed, "this worker must see the key-order error naming both workers");
  // Count the workers that saw the error: all must have.
  kv.Init("zz_count", Full({1}, 0));
  NDArray c = Full({1}, failed ? 1 : 0);
  kv.PushPull("zz_count", {c}, {});
  kv.WaitAll();
  CHECK_TRUE(c.At(0) == kv.NumWorkers(),
             "every worker must see the key-order error, saw " + std::to_string(c.At(0)));
}

void States(KVStore& kv, int rounds) {
  kv.SetOptimizer(OptimizerConfig::FromParams("adam", {{"learning_rate", "0.01"}}));
  kv.Init(3, Full(kSmall, 1));
  kv.Init(99, Full(kBig, 1));
  for (int i = 0; i < rounds; ++i) {
    kv.Push(3, {Full(kSmall, 0.5)});
    kv.Push(99, {Full(kBig, 0.5)});
  }
  kv.WaitAll();
  const std::string f1 = "/tmp/pskv_states_" + std::to_string(::getpid()) + "_a";
  const std::string f2 = "/tmp/pskv_states_" + std::to_string(::getpid()) + "_b";
  // rank 0 writes the file; all ranks take part in gathering
  kv.SaveOptimizerStates(f1);
  kv.Barrier();
  if (kv.Rank() == 0) {
    kv.LoadOptimizerStates(f1);
  } else {
    kv.LoadOptimizerStates("unused-on-non-zero-ranks");
  }
  kv.SaveOptimizerStates(f2);
  if (kv.Rank() == 0) {
    auto read = [](const std::string& p) {
      std::string s;
      FILE* f = std::fopen(p.c_str(), "rb");
      if (!f) return s;
      char b[4096];
      size_t k;
      while ((k = std::fread(b, 1, sizeof b, f)) > 0) s.append(b, k);
      std::fclose(f);
      return s;
    };
    std::string a = read(f1), b = read(f2);
    CHECK_TRUE(a.size() > 100 && a == b, "saved states round-trip through load");
    std::remove(f1.c_str());
    std::remove(f2.c_str());
  }
  kv.Barrier();
}

// ---------------------------------------------------------------- priorities on the wire

// Arrays of `shapes` with values uniform in [-1, 1) drawn from `rng`, cast to `types`.
std::vector<NDArray> RandomArrays(const std::vector<Shape>& shapes, const std::vector<DType>& types,
                                  std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<NDArray> out;
  for (size_t j = 0; j < shapes.size(); ++j) {
    NDArray a(shapes[j]);
    for (int64_t i = 0; i < a.size(); ++i) a.data<float>()[i] = u(rng);
    out.push_back(a.AsType(types[j]));
  }
  return out;
}

// Run with PSKV_WIRE_CHUNK_BYTES=65536, PSKV_WIRE_WINDOW_BYTES=1 (one big message
// in flight at a time) and a server that sleeps a few ms per request: a big
// low-priority push-pull (64 chunks) is issued, then a small high-priority one. The
// small one must complete first: its message overtakes the big one's queued chunks,
// and the server answers it between two chunks. (Without send scheduling the big
// value is ahead of it in the connection and completes first.)
void PriorityOrder(KVStore& kv, int) {
  const int64_t n = int64_t{1} << 20;  // 4 MiB of float32
  kv.Init(1, Full({n}, 0));
  kv.Init(2, Full({1024}, 0));
  NDArray big = Full({n}, 2), big_out({n}), small = Full({1024}, 3), small_out({1024});
  std::atomic<int> order{0};
  int big_pos = -1, small_pos = -1;
  kv.PushPull(1, {big}, {big_out}, -10);
  // Let the engine start the big operation first (it needs >= 64 server delays, so
  // it is still in flight): the order then depends on the wire, not on the engine.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kv.PushPull(2, {small}, {small_out}, 10);
  std::thread waiter([&] {
    kv.Wait(std::vector<int>{1});
    big_pos = order++;
  });
  kv.Wait(std::vector<int>{2});
  small_pos = order++;
  waiter.join();
  CHECK_TRUE(small_pos == 0 && big_pos == 1,
             "the high-priority key completed at position " + std::to_string(small_pos) +
                 ", the big low-priority one at " + std::to_string(big_pos));
  const double w = kv.NumWorkers();
  CHECK_TRUE(AllEqual(big_out, 2 * w) && AllEqual(small_out, 3 * w), "values");
  kv.Barrier();
}

// Run with a tiny window (PSKV_WIRE_WINDOW_BYTES=1) and small chunks: the workers
// push chunked keys in opposite orders. If window credit were released by the
// server's reply (which in sync mode waits for every worker's push), each worker's
// window would hold a chunk whose round needs a chunk queued behind the other
// worker's window: a deadlock. Credit is released on receipt, so it completes.
void WireOpposite(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  const double tri = n * (n + 1) / 2.0;
  kv.SetOptimizer(AddRate(kRate));
  const std::vector<int> keys = {10, 11, 12};
  const Shape shape = {128, 1024};  // 512 KiB: 8 chunks of 64 KiB (per server slice: fewer)
  for (int k : keys) kv.Init(k, Full(shape, 1));
  for (int i = 0; i < rounds; ++i) {
    std::vector<int> order = keys;
    if (r % 2) std::reverse(order.begin(), order.end());
    for (int k : order) kv.Push(k, {Full(shape, r + 1)});
    std::vector<NDArray> outs;
    for (size_t j = 0; j < keys.size(); ++j) outs.emplace_back(shape);
    kv.Pull(keys, outs);
    kv.WaitAll();
    for (auto& o : outs)
      CHECK_TRUE(AllEqual(o, 1 + kRate * (i + 1) * tri), "round " + std::to_string(i));
  }
  kv.Barrier();
}

// Chunked keys give bit-identical values: one store of the job with wire chunks
// (the environment's PSKV_WIRE_CHUNK_BYTES), one without, the same pushes (Adam
// with per-key multipliers and weight decay, keys sliced over the servers, a
// float16 key with multi-precision), compared byte for byte.
void ChunkEqual(KVStore& kv, int rounds) {
  Options plain_opts = Options::FromEnv();
  plain_opts.wire_chunk_bytes = 0;
  auto plain = KVStore::Create("dist_sync", plain_opts);
  CHECK_TRUE(Options::FromEnv().wire_chunk_bytes > 0, "run with PSKV_WIRE_CHUNK_BYTES > 0");
  const int r = kv.Rank();
  auto opt = OptimizerConfig::FromParams(
      "adam", {{"learning_rate", "0.01"}, {"wd", "0.001"}, {"multi_precision", "1"}});
  opt.lr_mult[1] = 0.5;
  opt.wd_mult[2] = 3;
  const std::vector<int> keys = {0, 1, 2, 3};
  const std::vector<Shape> shapes = {{7}, {300, 100}, {64, 333}, {40, 50}};
  const std::vector<DType> types = {DType::kFloat32, DType::kFloat32, DType::kFloat32,
                                    DType::kFloat16};
  std::mt19937 rng(1234);
  const std::vector<NDArray> init = RandomArrays(shapes, types, rng);
  for (KVStore* s : {&kv, plain.get()}) {
    s->SetOptimizer(opt);
    s->Init(keys, init);
  }
  std::mt19937 grng(99 + static_cast<unsigned>(r));
  for (int round = 0; round < rounds; ++round) {
    const std::vector<NDArray> grads = RandomArrays(shapes, types, grng);
    for (KVStore* s : {&kv, plain.get()}) {
      std::vector<NDArray> outs;
      for (size_t j = 0; j < keys.size(); ++j) outs.emplace_back(shapes[j], types[j]);
      if (round % 2)
        s->PushPull(keys, grads, keys, outs);
      else
        s->Push(keys, grads);
    }
    kv.WaitAll();
    plain->WaitAll();
  }
  for (size_t j = 0; j < keys.size(); ++j) {
    NDArray a(shapes[j], types[j]), b(shapes[j], types[j]);
    kv.Pull(keys[j], {a});
    plain->Pull(keys[j], {b});
    kv.WaitAll();
    plain->WaitAll();
    CHECK_TRUE(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0,
               "key " + std::to_string(keys[j]) + " differs between chunked and unchunked");
    CHECK_TRUE(std::memcmp(a.raw(), init[j].raw(), a.nbytes()) != 0,
               "key " + std::to_string(keys[j]) + " was updated");
  }
  kv.Barrier();
}

// Run with PSKV_SERVER_WEIGHTS=w0,w1,... (uneven, a 0 among them): big keys split by
// those shares sum element-dependent values exactly, give the same bits as the even
// split under adam (float32 and float16, chunked or not), and save the same optimizer
// states file as the even split, which loads into either.
void Placement(KVStore& kv, int rounds) {
  Options even_opts = Options::FromEnv();
  CHECK_TRUE(even_opts.server_weights.find(',') != std::string::npos,
             "run with PSKV_SERVER_WEIGHTS=w0,w1,...");
  even_opts.server_weights = "even";
  auto even = KVStore::Create("dist_sync", even_opts);
  auto sums = KVStore::Create("dist_sync", Options::FromEnv());  // no optimizer: the sum
  const int r = kv.Rank(), n = kv.NumWorkers();
  const Shape wide = {1000, 3};  // above the bound of 1000: sliced by the shares
  sums->Init(5, Full(wide, 0));
  for (int round = 0; round < rounds; ++round) {
    NDArray v(wide);
    for (int64_t i = 0; i < v.size(); ++i) v.data<float>()[i] = static_cast<float>(i + r + round);
    sums->PushPull(5, {v}, {});
    sums->WaitAll();
    bool exact = true;
    for (int64_t i = 0; i < v.size(); ++i)
      exact &= v.data<float>()[i] == static_cast<float>(n * (i + round) + n * (n - 1) / 2);
    CHECK_TRUE(exact, "element-dependent sums of round " + std::to_string(round));
  }
  auto opt = OptimizerConfig::FromParams(
      "adam", {{"learning_rate", "0.01"}, {"wd", "0.001"}, {"multi_precision", "1"}});
  const std::vector<int> keys = {0, 1, 2};
  const std::vector<Shape> shapes = {{300, 100}, {7}, {40, 50}};
  const std::vector<DType> types = {DType::kFloat32, DType::kFloat32, DType::kFloat16};
  std::mt19937 rng(1234);
  const std::vector<NDArray> init = RandomArrays(shapes, types, rng);
  for (KVStore* s : {&kv, even.get()}) {
    s->SetOptimizer(opt);
    s->Init(keys, init);
  }
  std::mt19937 grng(99 + static_cast<unsigned>(r));
  for (int round = 0; round < rounds; ++round) {
    const std::vector<NDArray> grads = RandomArrays(shapes, types, grng);
    for (KVStore* s : {&kv, even.get()}) s->Push(keys, grads);
    kv.WaitAll();
    even->WaitAll();
  }
  for (size_t j = 0; j < keys.size(); ++j) {
    NDArray a(shapes[j], types[j]), b(shapes[j], types[j]);
    kv.Pull(keys[j], {a});
    even->Pull(keys[j], {b});
    kv.WaitAll();
    even->WaitAll();
    CHECK_TRUE(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0,
               "key " + std::to_string(keys[j]) + " differs between uneven and even splits");
    CHECK_TRUE(std::memcmp(a.raw(), init[j].raw(), a.nbytes()) != 0,
               "key " + std::to_string(keys[j]) + " was updated");
  }
  // States files hold whole keys: both splits save the same file, and each loads it.
  const std::string f = "/tmp/pskv_states_placement_" + std::to_string(::getpid());
  const std::string g = f + "_even";
  kv.SaveOptimizerStates(f);
  even->SaveOptimizerStates(g);
  if (r == 0) {
    kv.LoadOptimizerStates(f);
    even->LoadOptimizerStates(f);
    auto read = [](const std::string& p) {
      std::ifstream in(p, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    const std::string a = read(f);
    CHECK_TRUE(a.size() > 100 && a == read(g), "uneven and even splits save the same states");
    std::remove(f.c_str());
    std::remove(g.c_str());
  }
  kv.Barrier();
}

// Optimizer states saved by a store without wire chunks load into a store with them
// (the file holds whole keys, re-sliced on load): once loaded, the chunked store
// saves the very same file.
void StatesOtherChunks(KVStore& kv, int) {
  Options plain_opts = Options::FromEnv();
  plain_opts.wire_chunk_bytes = 0;
  auto plain = KVStore::Create("dist_sync", plain_opts);
  const Shape shape = {300, 100};  // sliced over the servers, chunked in kv
  NDArray ramp(shape);
  for (int64_t i = 0; i < ramp.size(); ++i) ramp.data<float>()[i] = 0.001f * (i % 997);
  for (KVStore* s : {&kv, plain.get()}) {
    s->SetOptimizer(OptimizerConfig::FromParams("adam", {{"learning_rate", "0.01"}}));
    s->Init(0, Full(shape, 1));
    s->Push(0, {ramp});
    s->WaitAll();
  }
  plain->Push(0, {Full(shape, 0.5)});  // plain's states now differ from kv's
  plain->WaitAll();
  const std::string tag = "/tmp/pskv_states_chunks_" + std::to_string(::getpid());
  const std::string f = tag + "_plain", g = tag + "_chunked";
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  plain->SaveOptimizerStates(f);
  kv.SaveOptimizerStates(g);
  if (kv.Rank() == 0) {
    CHECK_TRUE(read(f) != read(g), "the two stores' states differ before the load");
    kv.LoadOptimizerStates(f);
  }
  kv.SaveOptimizerStates(g);
  if (kv.Rank() == 0) {
    const std::string a = read(f);
    CHECK_TRUE(a.size() > 100 && a == read(g),
               "states loaded into a chunked store save as the unchunked store's file");
    std::remove(f.c_str());
    std::remove(g.c_str());
  }
  kv.Barrier();
}

// ---------------------------------------------------------------- issue 11 scenarios

const char* Env(const char* name, const char* def = "") {
  const char* v = std::getenv(name);
  return v ? v : def;
}

// Round i (1-based): every worker pushes i, so the value after round i is i(i+1)
// with w <- w + sum. Worker 1 adds an extra pull after round 2 (it "skips a push"),
// and worker 0 pushes twice in round 4. With PSKV_STRICT_ROUNDS=1 both are errors
// at the call, naming the key and the round; nothing is mixed.
void StrictRounds(KVStore& kv, int rounds) {
  kv.SetOptimizer(AddRate(1));
  kv.Init(3, Full(kSmall, 0));
  NDArray out(kSmall);
  kv.Pull(3, {out});  // pulls before the first push read the init value: allowed
  kv.Pull(3, {out});
  kv.WaitAll();
  for (int i = 1; i <= rounds; ++i) {
    if (kv.Rank() == 0 && i == 4) {
      kv.Push(3, {Full(kSmall, i)});
      CHECK_TRUE(Throws([&] { kv.Push(3, {Full(kSmall, i)}); }, "second push in one round"),
                 "second push");
      CHECK_TRUE(Throws([&] { kv.Push(3, {Full(kSmall, i)}); }, "round 4"), "round named");
    } else {
      kv.Push(3, {Full(kSmall, i)});
    }
    kv.Pull(3, {out});
    kv.WaitAll();
    CHECK_TRUE(AllEqual(out, i * (i + 1)), "value after round " + std::to_string(i));
    if (kv.Rank() == 1 && i == 2) {
      CHECK_TRUE(Throws([&] { kv.Pull(3, {out}); }, "has not pushed key 3 in round 3"),
                 "extra pull");
    }
  }
  kv.Barrier();
}

// Workers init key 5 with different shapes of the same size: every worker gets the
// same ShapeError naming both workers (nobody hangs in Init's barrier).
void ShapeMismatch(KVStore& kv, int) {
  const Shape s = kv.Rank() == 0 ? Shape{2, 6} : Shape{3, 4};
  bool failed = false;
  try {
    kv.Init(5, Full(s, 1));
  } catch (const ShapeError& e) {
    failed = std::strstr(e.what(), "worker[0]") && std::strstr(e.what(), "worker[1]") &&
             std::strstr(e.what(), "(2, 6)") && std::strstr(e.what(), "(3, 4)");
    std::fprintf(stderr, "%s: %s\n", g_tag.c_str(), e.what());
  }
  CHECK_TRUE(failed, "init with another shape must fail naming both workers and shapes");
  kv.Barrier();
}

// Worker 0 pushes and waits for the round; worker 1 calls Barrier() first. The
// server reports the deadlock within PSKV_STALL_WARNING: worker 0's wait fails
// naming both sides; worker 0 then closes the store (at once), and worker 1's
// barrier fails with worker 0's reason.
void BarrierDeadlock(KVStore& kv, int) {
  kv.Init(3, Full(kSmall, 0));
  if (kv.Rank() == 0) {
    kv.Push(3, {Full(kSmall, 1)});
    bool ok = false;
    try {
      kv.WaitAll();
    } catch (const TimeoutError& e) {
      std::fprintf(stderr, "%s: %s\n", g_tag.c_str(), e.what());
      ok = std::strstr(e.what(), "deadlock") && std::strstr(e.what(), "Barrier()") &&
           std::strstr(e.what(), "worker[0]") && std::strstr(e.what(), "worker[1]");
    }
    CHECK_TRUE(ok, "the wait must fail naming the deadlock and both workers");
  } else {
    bool ok = false;
    try {
      kv.Barrier();
      kv.Push(3, {Full(kSmall, 1)});
      kv.WaitAll();
    } catch (const Error& e) {
      std::fprintf(stderr, "%s: %s\n", g_tag.c_str(), e.what());
      ok = std::strstr(e.what(), "deadlock") != nullptr;
    }
    CHECK_TRUE(ok, "the barrier must fail with the deadlock report");
  }
}

// Worker 1 is slow to push (PSKV_TEST_SLEEP_MS); worker 0 waits. With a short
// PSKV_STALL_WARNING the waiting nodes log what they wait for; with a short
// PSKV_TIMEOUT worker 0's TimeoutError names worker 1, and closing is immediate.
void Stall(KVStore& kv, int) {
  kv.Init(3, Full(kSmall, 0));
  if (kv.Rank() == 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(Env("PSKV_TEST_SLEEP_MS"))));
  kv.Push(3, {Full(kSmall, 1)});
  if (kv.Rank() == 0 && std::atoi(Env("PSKV_TEST_EXPECT_TIMEOUT", "0"))) {
    bool ok = false;
    try {
      kv.WaitAll();
    } catch (const TimeoutError& e) {
      std::fprintf(stderr, "%s: %s\n", g_tag.c_str(), e.what());
      ok = std::strstr(e.what(), "waiting for worker[1]") != nullptr;
    }
    CHECK_TRUE(ok, "the TimeoutError must name the worker the round waits for");
    std::printf("%s: closing\n", g_tag.c_str());
    std::fflush(stdout);
    return;
  }
  kv.WaitAll();
  NDArray out(kSmall);
  kv.Pull(3, {out});
  kv.WaitAll();
  CHECK_TRUE(AllEqual(out, 2), "value after the slow round");
}

// Values whose float32 sum depends on the order; workers push in reverse rank order
// (worker r waits (N-1-r) * 150 ms). The servers must sum in rank order.
float OrderValue(int rank, int64_t i) {
  static const float kMag[] = {1e8f, 1.0f, -1e8f, 3.0f, 0.5f, 7e7f, -2.5f};
  const float m = kMag[(static_cast<int64_t>(rank) * 3 + i) % 7];
  return m * (1.0f + static_cast<float>(i % 13) / 17.0f);
}

void RankOrderSum(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  kv.Init(3, Full(kSmall, 0));
  kv.Init(99, Full(kBig, 0));
  for (int round = 0; round < rounds; ++round) {
    NDArray a(kSmall), b(kBig);
    for (int64_t i = 0; i < a.size(); ++i) a.data<float>()[i] = OrderValue(r + round, i);
    for (int64_t i = 0; i < b.size(); ++i) b.data<float>()[i] = OrderValue(r + round, i);
    std::this_thread::sleep_for(std::chrono::milliseconds(150 * (n - 1 - r)));
    kv.PushPull(std::vector<int>{3, 99}, {a, b}, std::vector<int>{3, 99}, {a, b});
    kv.WaitAll();
    int bad = 0;
    for (auto* arr : {&a, &b})
      for (int64_t i = 0; i < arr->size(); ++i) {
        float want = OrderValue(round, i);  // rank 0 first, then 1, 2, ...
        for (int w = 1; w < n; ++w) want += OrderValue(w + round, i);
        if (std::memcmp(&want, arr->data<float>() + i, 4) != 0) ++bad;
      }
    CHECK_TRUE(bad == 0, std::to_string(bad) +
                             " elements differ from the rank-order sum in round " +
                             std::to_string(round));
  }
}

// Many keys in one call (spread over the servers' threads) and a 12 MB key (sliced
// over the servers, each slice several 1 MiB chunks: merged chunk-wise in parallel),
// no optimizer: every output must be the rank-order sum, bit for bit.
void ManyKeys(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  std::vector<int> keys;
  std::vector<Shape> shapes;
  for (int k = 0; k < 48; ++k) {
    keys.push_back(k);
    shapes.push_back(k % 3 == 0 ? kBig : kSmall);
  }
  keys.push_back(200);
  shapes.push_back({3000, 1000});
  std::vector<NDArray> init;
  for (auto& s : shapes) init.push_back(Full(s, 0));
  kv.Init(keys, init);
  for (int round = 0; round < rounds; ++round) {
    std::vector<NDArray> vals;
    for (auto& s : shapes) {
      NDArray a(s);
      for (int64_t i = 0; i < a.size(); ++i) a.data<float>()[i] = OrderValue(r + round, i);
      vals.push_back(a);
    }
    kv.PushPull(keys, vals, keys, vals);
    kv.WaitAll();
    int64_t bad = 0;
    for (auto& a : vals)
      for (int64_t i = 0; i < a.size(); ++i) {
        float want = OrderValue(round, i);
        for (int w = 1; w < n; ++w) want += OrderValue(w + round, i);
        if (std::memcmp(&want, a.data<float>() + i, 4) != 0) ++bad;
      }
    CHECK_TRUE(bad == 0, std::to_string(bad) +
                             " elements differ from the rank-order sum in round " +
                             std::to_string(round));
  }
  kv.Barrier();
}

// Fusion: 64 small keys and 2 sliced ones in one call (push with two values per key,
// pull into two outputs, push-pull in place), with an optimizer; rank 0 issues one
// call per key (never fused) while the others fuse, so the server sees both forms in
// the same rounds.
void Fused(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  const double tri = n * (n + 1) / 2.0;
  kv.SetOptimizer(AddRate(kRate));
  std::vector<int> keys;
  std::vector<Shape> shapes;
  for (int k = 0; k < 66; ++k) {
    keys.push_back(10 + k);
    shapes.push_back(k == 20 || k == 50 ? kBig : kSmall);
  }
  std::vector<NDArray> init;
  for (auto& s : shapes) init.push_back(Full(s, 1));
  kv.Init(keys, init);
  auto each = [&](auto&& call) {  // rank 0: one call per key
    if (r != 0) return call(keys, shapes);
    for (size_t i = 0; i < keys.size(); ++i)
      call(std::vector<int>{keys[i]}, std::vector<Shape>{shapes[i]});
  };
  double want = 1;
  for (int i = 0; i < rounds; ++i) {
    each([&](const std::vector<int>& ks, const std::vector<Shape>& ss) {
      std::vector<int> pk;
      std::vector<NDArray> pv;
      for (size_t j = 0; j < ks.size(); ++j)
        for (int d = 0; d < 2; ++d) {
          pk.push_back(ks[j]);
          pv.push_back(Full(ss[j], r + 1));
        }
      kv.Push(pk, pv);
    });
    want += kRate * tri * 2;
    std::vector<NDArray> outs, outs2;
    std::vector<int> pk;
    for (size_t j = 0; j < keys.size(); ++j) {
      pk.push_back(keys[j]);
      pk.push_back(keys[j]);
      outs.emplace_back(shapes[j]);
      outs2.emplace_back(shapes[j]);
    }
    std::vector<NDArray> both;
    for (size_t j = 0; j < keys.size(); ++j) {
      both.push_back(outs[j]);
      both.push_back(outs2[j]);
    }
    kv.Pull(pk, both);
    kv.WaitAll();
    int bad = 0;
    for (size_t j = 0; j < keys.size(); ++j)
      bad += !AllEqual(outs[j], want) || !AllEqual(outs2[j], want);
    CHECK_TRUE(bad == 0,
               std::to_string(bad) + " keys wrong after push+pull round " + std::to_string(i));
    // push-pull in place
    std::vector<NDArray> vals;
    for (auto& s : shapes) vals.push_back(Full(s, r + 1));
    each([&](const std::vector<int>& ks, const std::vector<Shape>&) {
      std::vector<NDArray> mine;
      for (int k : ks) mine.push_back(vals[static_cast<size_t>(k - 10)]);
      kv.PushPull(ks, mine, ks, mine);
    });
    kv.WaitAll();
    want += kRate * tri;
    bad = 0;
    for (auto& v : vals) bad += !AllEqual(v, want);
    CHECK_TRUE(bad == 0,
               std::to_string(bad) + " keys wrong after push-pull round " + std::to_string(i));
  }
  kv.Barrier();
}

// Fusion without an optimizer (the server's sum becomes the value): keys initialised
// in descending order by several Init calls, three dtypes (three fusion groups per
// call), a sliced key in the same call, int32 keys pushed with two values, float32
// keys pulled into two outputs; push-pull into separate outputs, then a fused pull.
// Every output must be the rank-order sum, bit for bit, in every round (the server
// alternates value and merge buffers and reuses its answer buffers across rounds).
void FusedSum(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  struct K {
    int key;
    Shape shape;
    DType dtype;
  };
  std::vector<K> ks;
  for (int k = 0; k < 60; ++k) ks.push_back({100 + k, {9 + 31 * (k % 9)}, DType::kFloat32});
  for (int k = 0; k < 20; ++k) ks.push_back({300 + k, {16}, DType::kFloat16});
  for (int k = 0; k < 20; ++k) ks.push_back({400 + k, {5}, DType::kInt32});
  ks.push_back({500, kBig, DType::kFloat32});
  // Init: descending keys, in four calls.
  for (size_t part = 0; part < 4; ++part) {
    std::vector<int> keys;
    std::vector<NDArray> vals;
    for (size_t j = ks.size(); j-- > 0;)
      if (j % 4 == part) {
        keys.push_back(ks[j].key);
        vals.push_back(Full(ks[j].shape, 0, ks[j].dtype));
      }
    kv.Init(keys, vals);
  }
  // Rank w's value of key k in round `round`, element i.
  auto value = [&](const K& k, int w, int round, int64_t i) -> double {
    if (k.dtype == DType::kFloat32) return OrderValue(w + round, i + k.key);
    if (k.dtype == DType::kFloat16) return (w + 1) * (i % 5 + 1) + round;
    return (w + 1) * (k.key + i + round);  // int32: pushed as two values adding up to it
  };
  auto want = [&](const K& k, int round, int64_t i) -> double {
    if (k.dtype != DType::kFloat32) {
      double sum = 0;
      for (int w = 0; w < n; ++w) sum += value(k, w, round, i);
      return sum;
    }
    float sum = OrderValue(round, i + k.key);  // rank 0 first, then 1, 2, ...
    for (int w = 1; w < n; ++w) sum += OrderValue(w + round, i + k.key);
    return sum;
  };
  auto check = [&](const K& k, const NDArray& o, int round, const std::string& what) {
    for (int64_t i = 0; i < o.size(); ++i) {
      const double w = want(k, round, i);
      const bool same = k.dtype == DType::kFloat32
                            ? [&] {
                                const float f = static_cast<float>(w);
                                return std::memcmp(&f, o.data<float>() + i, 4) == 0;
                              }()
                            : o.At(i) == w;
      if (!same) {
        CHECK_TRUE(false, what + ": key " + std::to_string(k.key) + " element " +
                              std::to_string(i) + " is " + std::to_string(o.At(i)) + ", expected " +
                              std::to_string(w) + " (round " + std::to_string(round) + ")");
        return;
      }
    }
  };
  for (int round = 0; round < rounds; ++round) {
    std::vector<int> pk, ok;
    std::vector<NDArray> pv, outs;
    std::vector<std::pair<size_t, NDArray>> checks;  // (index in ks, output)
    for (size_t j = 0; j < ks.size(); ++j) {
      const K& k = ks[j];
      if (k.dtype == DType::kInt32) {  // two values: k + i + round, then (w+1)-1 times it
        NDArray a(k.shape, k.dtype), b(k.shape, k.dtype);
        for (int64_t i = 0; i < a.size(); ++i) {
          a.data<int32_t>()[i] = k.key + static_cast<int32_t>(i) + round;
          b.data<int32_t>()[i] = r * (k.key + static_cast<int32_t>(i) + round);
        }
        pk.insert(pk.end(), {k.key, k.key});
        pv.insert(pv.end(), {a, b});
      } else {
        NDArray a(k.shape, k.dtype);
        for (int64_t i = 0; i < a.size(); ++i) {
          if (k.dtype == DType::kFloat32)
            a.data<float>()[i] = static_cast<float>(value(k, r, round, i));
          else
            a.data<uint16_t>()[i] = FloatToHalf(static_cast<float>(value(k, r, round, i)));
        }
        pk.push_back(k.key);
        pv.push_back(a);
      }
      const int nout = k.dtype == DType::kFloat32 && k.key < 110 ? 2 : 1;
      for (int o = 0; o < nout; ++o) {
        ok.push_back(k.key);
        outs.emplace_back(k.shape, k.dtype);
        checks.emplace_back(j, outs.back());
      }
    }
    kv.PushPull(pk, pv, ok, outs);
    kv.WaitAll();
    for (auto& [j, o] : checks) check(ks[j], o, round, "push-pull");
    // A fused pull of the same round's values: the small keys alone first (so that
    // WaitAll waits for nothing but their operation), then the big key.
    for (bool small : {true, false}) {
      std::vector<int> keys;
      std::vector<NDArray> pulled;
      for (auto& k : ks)
        if ((k.key != 500) == small) {
          keys.push_back(k.key);
          pulled.emplace_back(k.shape, k.dtype);
        }
      kv.Pull(keys, pulled);
      kv.WaitAll();
      for (size_t j = 0, o = 0; j < ks.size(); ++j)
        if ((ks[j].key != 500) == small) check(ks[j], pulled[o++], round, "pull");
    }
    kv.Barrier();
  }
}

// Fusion in async mode: every fused push is applied at once, key by key.
void AsyncFused(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  kv.SetOptimizer(AddRate(1));
  std::vector<int> keys;
  std::vector<NDArray> init;
  for (int k = 0; k < 20; ++k) {
    keys.push_back(k);
    init.push_back(Full(k == 7 ? kBig : kSmall, 1));
  }
  kv.Init(keys, init);
  for (int i = 0; i < rounds; ++i) {
    std::vector<NDArray> vals;
    for (auto& a : init) vals.push_back(Full(a.shape(), r + 1));
    kv.Push(keys, vals);
  }
  kv.WaitAll();
  kv.Barrier();
  std::vector<NDArray> outs;
  for (auto& a : init) outs.emplace_back(a.shape());
  kv.Pull(keys, outs);
  kv.WaitAll();
  int bad = 0;
  for (auto& o : outs) bad += !AllEqual(o, 1 + rounds * n * (n + 1) / 2.0);
  CHECK_TRUE(bad == 0, std::to_string(bad) + " keys wrong (async, fused)");
  kv.Barrier();
}

// A fused push whose keys' rounds cannot all complete: worker 0 pushes keys 1..8 in
// one call (one fused message), the others push only keys 1..4 and finish. Rounds
// 1..4 complete; 5..8 fail when the others are done: worker 0's call fails with the
// message naming the worker (and does not hang).
void FusedUnequal(KVStore& kv, int) {
  std::vector<int> keys;
  std::vector<NDArray> vals;
  for (int k = 1; k <= 8; ++k) {
    keys.push_back(k);
    vals.push_back(Full(kSmall, 0));
  }
  kv.Init(keys, vals);
  for (auto& v : vals) v = Full(kSmall, 1);
  if (kv.Rank() == 0) {
    kv.Push(keys, vals);
    CHECK_TRUE(Throws([&] { kv.WaitAll(); }, "finished the job without pushing"),
               "a fused push whose rounds cannot complete");
    // The keys whose rounds completed hold their sums.
    NDArray out(kSmall);
    kv.Pull(1, {out});
    kv.WaitAll();
    CHECK_TRUE(AllEqual(out, kv.NumWorkers()), "key 1 completed its round");
  } else {
    kv.Push(std::vector<int>(keys.begin(), keys.begin() + 4),
            std::vector<NDArray>(vals.begin(), vals.begin() + 4));
    kv.WaitAll();
  }
}

// A sliced pull (key 99 over 2 servers) while one server duplicates its replies and
// the other is slow: the pull must wait for both slices.
void DuplicateReplies(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers();
  kv.Init(99, Full(kBig, 0));
  for (int i = 1; i <= rounds; ++i) {  // no optimizer: the value is the round's sum, n*i
    NDArray b = Full(kBig, i);
    kv.PushPull(99, {b}, {});
    kv.WaitAll();
    CHECK_TRUE(AllEqual(b, n * i), "push-pull round " + std::to_string(i));
    kv.Pull(99, {b});
    kv.WaitAll();
    CHECK_TRUE(AllEqual(b, n * i), "pull round " + std::to_string(i));
  }
}

// PSKV_TIMEOUT=1 and a server that answers data requests after 1.5 s: Init times
// out; the late reply must not touch the (long gone) waiting frame.
void LateReply(KVStore& kv, int) {
  CHECK_TRUE(Throws([&] { kv.Init(3, Full(kSmall, 1)); }, "no answer from server[0]"),
             "init must time out naming the server");
  // Give the late reply time to arrive while this thread reuses its stack.
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(2500);
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() < end) {
    char buf[4096];
    std::memset(buf, static_cast<int>(sink) & 0x7f, sizeof buf);
    sink = sink + buf[100];
  }
  std::printf("%s: survived the late reply\n", g_tag.c_str());
}

// Saves states of a 1-element fp16 key (multi-precision SGD: a master copy, no
// other slots), then (second job) loads them into a 4M-element key: ShapeError.
void StatesMismatch(KVStore& kv, int) {
  const std::string phase = Env("PSKV_TEST_PHASE"), file = Env("PSKV_TEST_STATES_FILE");
  kv.SetOptimizer(
      OptimizerConfig::FromParams("sgd", {{"learning_rate", "0.1"}, {"multi_precision", "1"}}));
  const Shape s = phase == "save" ? Shape{1} : Shape{4 << 20};
  kv.Init(0, Full(s, 1, DType::kFloat16));
  kv.Push(0, {Full(s, 1, DType::kFloat16)});
  kv.WaitAll();
  if (phase == "save") {
    kv.SaveOptimizerStates(file);
    return;
  }
  CHECK_TRUE(Throws([&] { kv.LoadOptimizerStates(file); }, "master copy of 1 elements"),
             "loading mismatched states must fail");
  // nothing was loaded: the store keeps working
  kv.Push(0, {Full(s, 1, DType::kFloat16)});
  NDArray out(s, DType::kFloat16);
  kv.Pull(0, {out});
  kv.WaitAll();
  CHECK_TRUE(AllEqual(out, 0.8, 1e-3), "store usable after a refused load");
}

// Adam on a 100M-parameter key sliced over the servers: save (only rank 0 fetches),
// load (rank 0 alone), save again: identical files; one more update works.
void BigStates(KVStore& kv, int) {
  const int64_t n = 100'000'000;
  const std::string f1 = Env("PSKV_TEST_STATES_FILE"), f2 = f1 + ".2";
  kv.SetOptimizer(OptimizerConfig::FromParams("adam", {{"learning_rate", "0.01"}}));
  {
    NDArray w({n});
    w.Fill(1);
    kv.Init(0, w);
  }
  {
    NDArray g({n});
    g.Fill(0.5);
    kv.Push(0, {g});
    kv.WaitAll();
  }
  kv.SaveOptimizerStates(f1);
  if (kv.Rank() == 0) kv.LoadOptimizerStates(f1);  // rank 0 alone
  kv.SaveOptimizerStates(f2);
  if (kv.Rank() == 0) {
    std::ifstream a(f1, std::ios::binary), b(f2, std::ios::binary);
    std::vector<char> ba(1 << 20), bb(1 << 20);
    uint64_t total = 0;
    bool same = true;
    while (a && b && same) {
      a.read(ba.data(), static_cast<std::streamsize>(ba.size()));
      b.read(bb.data(), static_cast<std::streamsize>(bb.size()));
      same = a.gcount() == b.gcount() &&
             std::memcmp(ba.data(), bb.data(), static_cast<size_t>(a.gcount())) == 0;
      total += static_cast<uint64_t>(a.gcount());
    }
    CHECK_TRUE(same && !b.read(bb.data(), 1), "states round-trip through load");
    CHECK_TRUE(total > 2ull * n * 4, "states of 100M parameters (" + std::to_string(total) + " B)");
    std::remove(f1.c_str());
    std::remove(f2.c_str());
  }
  kv.Barrier();
}

// Pushes and pulls until something fails (a peer is killed by the test), for at
// most 90 s. Creates $PSKV_TEST_MARKER_DIR/worker<rank> once initialised.
void PushUntilFailure(KVStore& kv);
void LoopUntilFailure(KVStore& kv, int) {
  kv.Init(3, Full(kSmall, 0));
  if (const char* dir = std::getenv("PSKV_TEST_MARKER_DIR")) {
    std::string p = std::string(dir) + "/worker" + std::to_string(kv.Rank());
    if (FILE* f = std::fopen(p.c_str(), "w")) std::fclose(f);
  }
  PushUntilFailure(kv);
}

void PushUntilFailure(KVStore& kv) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < end) {
    kv.Push(3, {Full(kSmall, 1)});
    NDArray out(kSmall);
    kv.Pull(3, {out});
    kv.WaitAll();  // throws once a peer is declared dead
  }
  std::fprintf(stderr, "%s: no failure was reported within 90 s\n", g_tag.c_str());
  ++g_failures;
}

// Push+pull rounds for `seconds` s (checking every pulled sum), then exit 0.
// Creates $PSKV_TEST_MARKER_DIR/worker<rank> once initialised (the test freezes a
// worker meanwhile).
void Steady(KVStore& kv, int seconds) {
  kv.Init(3, Full(kSmall, 0));
  if (const char* dir = std::getenv("PSKV_TEST_MARKER_DIR")) {
    std::string p = std::string(dir) + "/worker" + std::to_string(kv.Rank());
    if (FILE* f = std::fopen(p.c_str(), "w")) std::fclose(f);
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (int i = 0; i < 100000 && std::chrono::steady_clock::now() < end; ++i) {
    kv.Push(3, {Full(kSmall, 1)});
    NDArray out(kSmall);
    kv.Pull(3, {out});
    kv.WaitAll();
    CHECK_TRUE(AllEqual(out, kv.NumWorkers()), "steady round " + std::to_string(i));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Rank 1 exits with status 3 after one round; the others keep going.
void ExitThree(KVStore& kv, int) {
  kv.Init(3, Full(kSmall, 0));
  kv.Push(3, {Full(kSmall, 1)});
  kv.WaitAll();
  if (kv.Rank() == 1) {
    std::printf("worker 1 exits with status 3 now\n");
    std::fflush(stdout);
    std::_Exit(3);
  }
  PushUntilFailure(kv);
}

}  // namespace

// ---------------------------------------------------------------- row_sparse (issue 15)
// MXNet's dist_sync_kvstore.py row_sparse checks (check_row_sparse_keys,
// check_row_sparse_keys_with_zeros, check_big_row_sparse_keys) with w <- w + rate*g.

NDArray IdArray(const std::vector<int64_t>& v, Shape s = {}) {
  NDArray a(s.empty() ? Shape{static_cast<int64_t>(v.size())} : s, DType::kInt64);
  for (size_t i = 0; i < v.size(); ++i) a.data<int64_t>()[i] = v[i];
  return a;
}

// `out` holds exactly rows `ids` (deduplicated) with want(row) in every element.
bool RowsAre(const RowSparseNDArray& out, const std::vector<int64_t>& ids,
             const std::function<double(int64_t)>& want) {
  std::set<int64_t> set(ids.begin(), ids.end());
  const std::vector<int64_t> got(out.indices().data<int64_t>(),
                                 out.indices().data<int64_t>() + out.nnz());
  if (got != std::vector<int64_t>(set.begin(), set.end())) {
    std::fprintf(stderr, "%s: row_sparse_pull returned %lld rows, expected %zu\n", g_tag.c_str(),
                 static_cast<long long>(out.nnz()), set.size());
    return false;
  }
  NDArray dense = out.ToDense();
  const int64_t u = out.RowSize();
  for (int64_t r = 0; r < out.num_rows(); ++r)
    for (int64_t j = 0; j < u; ++j) {
      const double w = set.count(r) ? want(r) : 0;
      if (std::abs(dense.At(r * u + j) - w) > 1e-3 * std::max(1.0, std::abs(w))) {
        std::fprintf(stderr, "%s: row %lld element %lld is %.9g, expected %.9g\n", g_tag.c_str(),
                     static_cast<long long>(r), static_cast<long long>(j), dense.At(r * u + j), w);
        return false;
      }
    }
  return true;
}

void SparseSync(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  kv.SetOptimizer(AddRate(kRate));
  const Shape shape = {2, 3}, big = {100, 30};  // big: 3000 elements, sliced by rows
  for (DType t : {DType::kFloat32, DType::kFloat64}) {
    const int key = t == DType::kFloat32 ? 9 : 19, big_key = key + 91, zero_key = key + 2;
    kv.Init(key, RowSparseNDArray::FromDense(Full(shape, 1, t)));
    kv.Init(big_key, RowSparseNDArray::FromDense(Full(big, 1, t)));
    kv.Init(zero_key, RowSparseNDArray::FromDense(Full(shape, 1, t)));
    // check_row_sparse_keys: worker r pushes row r % 2 = r + 1, `rounds` times.
    NDArray v = Full(shape, 0, t);
    for (int64_t j = 0; j < 3; ++j) {
      NDArray row = v.Slice1D((r % 2) * 3 + j, 1);
      row.Fill(r + 1);
    }
    for (int i = 0; i < rounds; ++i) kv.Push(key, {RowSparseNDArray::FromDense(v)});
    std::mt19937 rng(static_cast<unsigned>(r));
    std::vector<int64_t> ids;
    for (int i = 0; i < 2; ++i) ids.push_back(static_cast<int64_t>(rng() % 2));
    RowSparseNDArray out(shape, t);
    kv.RowSparsePull(key, {out}, {IdArray(ids, {1, 2})});
    kv.WaitAll();
    CHECK_TRUE(RowsAre(out, ids,
                       [&](int64_t row) {
                         double w = 1;
                         for (int k = 0; k < n; ++k)
                           if (k % 2 == row) w += (k + 1) * kRate * rounds;
                         return w;
                       }),
               "check_row_sparse_keys " + DTypeName(t));
    // check_row_sparse_keys_with_zeros: empty pushes leave the values at 1.
    for (int i = 0; i < rounds; ++i) {
      kv.Push(zero_key, {RowSparseNDArray(shape, t)});
      RowSparseNDArray z(shape, t);
      kv.RowSparsePull(zero_key, {z}, {IdArray({0, 1})});
      kv.WaitAll();
      CHECK_TRUE(RowsAre(z, {0, 1}, [](int64_t) { return 1.0; }), "empty pushes");
    }
    // check_big_row_sparse_keys: rows with density 0.3 (same on every worker); worker
    // k updates every (k+1)*2-th of them; random (repeating, unsorted) pulls.
    std::mt19937 common(123);
    std::vector<int64_t> dense_rows;
    for (int64_t row = 0; row < big[0]; ++row)
      if (common() % 10 < 3) dense_rows.push_back(row);
    std::vector<std::vector<int64_t>> update(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k)
      for (size_t i = 0; i < dense_rows.size(); i += static_cast<size_t>((k + 1) * 2))
        update[static_cast<size_t>(k)].push_back(dense_rows[i]);
    const auto& mine = update[static_cast<size_t>(r)];
    Shape rs = big;
    rs[0] = static_cast<int64_t>(mine.size());
    auto grad = RowSparseNDArray::FromRows(big, IdArray(mine), Full(rs, r + 1, t));
    for (int i = 0; i < rounds; ++i) kv.Push(big_key, {grad});
    std::vector<int64_t> pull_ids;
    for (int64_t i = 0; i < big[0]; ++i) pull_ids.push_back(static_cast<int64_t>(rng() % 100));
    RowSparseNDArray big_out(big, t);
    kv.RowSparsePull(big_key, {big_out}, {IdArray(pull_ids, {50, 2})});
    kv.WaitAll();
    CHECK_TRUE(RowsAre(big_out, pull_ids,
                       [&](int64_t row) {
                         double w = 1;
                         for (int k = 0; k < n; ++k)
                           for (int64_t x : update[static_cast<size_t>(k)])
                             if (x == row) w += (k + 1) * kRate * rounds;
                         return w;
                       }),
               "check_big_row_sparse_keys " + DTypeName(t));
  }
  // The storage-type rules are errors at the call, the same on every worker.
  RowSparseNDArray out({2, 3});
  NDArray dense = Full({2, 3}, 0);
  CHECK_TRUE(Throws([&] { kv.Pull(9, {dense}); }, "row_sparse_pull"), "dense pull of sparse key");
  CHECK_TRUE(Throws([&] { kv.Push(9, {dense}); }, "row_sparse"), "dense push to sparse key");
  CHECK_TRUE(Throws([&] { kv.RowSparsePull(9, {out}, {IdArray({2})}); }, "out of range"),
             "row id out of range");
  kv.Init(50, Full({2, 3}, 1));
  CHECK_TRUE(Throws([&] { kv.RowSparsePull(50, {out}, {IdArray({0})}); }, "storage type"),
             "row_sparse_pull of a dense key");
  CHECK_TRUE(Throws(
                 [&] {
                   kv.Push(50, {RowSparseNDArray({2, 3})});
                 },
                 "storage type"),
             "row_sparse push to a dense key");
  // The optimizer states of row_sparse keys save and load like those of dense keys.
  const char* port = std::getenv("DMLC_PS_ROOT_PORT");
  const std::string states = "/tmp/pskv_sparse_states_" + std::string(port ? port : "0") + ".bin";
  kv.SaveOptimizerStates(states);
  kv.Barrier();
  kv.LoadOptimizerStates(states);
  kv.Barrier();
  if (r == 0) std::remove(states.c_str());
}

// No optimizer (update_on_kvstore=False): each round the stored value becomes the sum
// of the workers' pushes; rows nobody pushed become zero.
void SparseNoOptimizer(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  const Shape big = {100, 30};
  kv.Init(7, RowSparseNDArray::FromDense(Full(big, 5)));
  for (int i = 0; i < rounds; ++i) {
    // worker r pushes rows {r, 50 + r, 99} with value r + 1 + i
    std::vector<int64_t> ids = {r, 50 + r, 99};
    auto g = RowSparseNDArray::FromRows(big, IdArray(ids), Full({3, 30}, r + 1 + i));
    kv.Push(7, {g});
    RowSparseNDArray out(big);
    std::vector<int64_t> all(100);
    for (int64_t k = 0; k < 100; ++k) all[static_cast<size_t>(k)] = k;
    kv.RowSparsePull(7, {out}, {IdArray(all)});
    kv.WaitAll();
    CHECK_TRUE(RowsAre(out, all,
                       [&](int64_t row) {
                         if (row == 99) return n * (n + 1) / 2.0 + n * i;
                         const int64_t k = row >= 50 ? row - 50 : row;
                         return k < n ? k + 1.0 + i : 0.0;
                       }),
               "sum of sparse pushes, round " + std::to_string(i));
    kv.Barrier();  // everyone pulled this round before the next one changes it
  }
}

// dist_async: every push is applied at once; after all workers pushed, the value
// holds every contribution.
void SparseAsync(KVStore& kv, int rounds) {
  const int n = kv.NumWorkers(), r = kv.Rank();
  kv.SetOptimizer(AddRate(1));
  const Shape big = {100, 30};
  kv.Init(3, RowSparseNDArray::FromDense(Full(big, 1)));
  std::vector<int64_t> ids = {r, 99, r};  // repeated id: summed
  auto g = RowSparseNDArray::FromRows(big, IdArray(ids), Full({3, 30}, 1));
  for (int i = 0; i < rounds; ++i) kv.Push(3, {g});
  kv.WaitAll();
  kv.Barrier();
  RowSparseNDArray out(big);
  kv.RowSparsePull(3, {out}, {IdArray({0, 99})});
  kv.WaitAll();
  CHECK_TRUE(RowsAre(out, {0, 99},
                     [&](int64_t row) { return row == 99 ? 1.0 + n * rounds : 1.0 + 2 * rounds; }),
             "async sparse pushes");
  kv.Barrier();
}

int main(int argc, char** argv) {
  pskv::TuneAllocatorForLargeMessages();
  // A worker's node too may disturb the wire (PSKV_TEST_BOGUS_CREDITS, test_dist.cc).
  pskv::test::InstallEnvFailPoints();
  if (argc < 2) {
    std::fprintf(stderr, "usage: dist_worker SCENARIO [ROUNDS]\n");
    return 2;
  }
  const std::string scenario = argv[1];
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 4;
  static const std::map<std::string, std::pair<std::string, std::function<void(KVStore&, int)>>>
      kScenarios = {
          {"sync", {"dist_sync", Sync}},
          {"sync_device", {"dist_sync_device", Sync}},
          {"string_keys", {"dist_sync", SyncStringKeys}},
          {"async", {"dist_async", Async}},
          {"async_device", {"dist_async_device", Async}},
          {"compression", {"dist_sync", Compression}},
          {"no_optimizer", {"dist_sync", NoOptimizer}},
          {"multi_precision", {"dist_sync", MultiPrecision}},
          {"misuse", {"dist_sync", Misuse}},
          {"async_no_optimizer", {"dist_async", AsyncNoOptimizer}},
          {"unequal", {"dist_sync", Unequal}},
          {"string_order", {"dist_sync", StringOrder}},
          {"states", {"dist_sync", States}},
          {"loop_until_failure", {"dist_sync", LoopUntilFailure}},
          {"exit3", {"dist_sync", ExitThree}},
          {"steady", {"dist_sync", Steady}},
          {"strict_rounds", {"dist_sync", StrictRounds}},
          {"shape_mismatch", {"dist_sync", ShapeMismatch}},
          {"barrier_deadlock", {"dist_sync", BarrierDeadlock}},
          {"stall", {"dist_sync", Stall}},
          {"rank_order_sum", {"dist_sync", RankOrderSum}},
          {"many_keys", {"dist_sync", ManyKeys}},
          {"fused", {"dist_sync", Fused}},
          {"fused_sum", {"dist_sync", FusedSum}},
          {"fused_unequal", {"dist_sync", FusedUnequal}},
          {"async_fused", {"dist_async", AsyncFused}},
          {"duplicate_replies", {"dist_sync", DuplicateReplies}},
          {"late_reply", {"dist_sync", LateReply}},
          {"states_mismatch", {"dist_sync", StatesMismatch}},
          {"big_states", {"dist_sync", BigStates}},
          {"sparse_sync", {"dist_sync", SparseSync}},
          {"sparse_no_optimizer", {"dist_sync", SparseNoOptimizer}},
          {"sparse_async", {"dist_async", SparseAsync}},
          {"priority_order", {"dist_sync", PriorityOrder}},
          {"wire_opposite", {"dist_sync", WireOpposite}},
          {"chunk_equal", {"dist_sync", ChunkEqual}},
          {"states_other_chunks", {"dist_sync", StatesOtherChunks}},
          {"placement", {"dist_sync", Placement}},
      };
  auto it = kScenarios.find(scenario);
  if (it == kScenarios.end()) {
    std::fprintf(stderr, "unknown scenario '%s'\n", scenario.c_str());
    return 2;
  }
  try {
    pskv::ConfigureProcess();  // PSKV_LOG_LEVEL, PSKV_TIMELINE, PSKV_METRICS_* of the tests
    auto kv = KVStore::Create(it->second.first);
    g_tag = "worker " + std::to_string(kv->Rank());
    it->second.second(*kv, rounds);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected error: %s\n", g_tag.c_str(), e.what());
    return 1;
  }
  if (g_failures) {
    std::fprintf(stderr, "%s: %d check(s) failed\n", g_tag.c_str(), g_failures);
    return 1;
  }
  std::printf("%s: all checks passed\n", g_tag.c_str());
  return 0;
}
