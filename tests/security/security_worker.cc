// The victim of tests/security/test_security.cc: one dist_sync worker that initialises
// key 0 to ones, signals READY_FILE, waits for GO_FILE (while the test attacks the
// job), then checks that nothing changed its weights and that the job still works.
//
//   security_worker READY_FILE GO_FILE      exit 0 = values exact
//   security_worker --hang-rank R           rank R hangs; the others wait at a barrier
//                                           (for the launcher's "who hung" headline)
//   security_worker --no-push-rank R        rank R never pushes; the others wait for a
//                                           sync round that needs its push
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "pskv/error.h"
#include "pskv/kvstore.h"

using namespace pskv;

namespace {
bool AllEqual(const NDArray& a, float v) {
  const float* p = a.data<float>();
  for (int64_t i = 0; i < a.size(); ++i)
    if (p[i] != v) {
      std::fprintf(stderr, "security_worker: element %lld is %g, want %g\n",
                   static_cast<long long>(i), p[i], v);
      return false;
    }
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--hang-rank") {
    auto kv = KVStore::Create("dist_sync");
    if (kv->Rank() == std::atoi(argv[2])) std::this_thread::sleep_for(std::chrono::minutes(10));
    kv->Barrier();
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--no-push-rank") {
    auto kv = KVStore::Create("dist_sync");
    NDArray w(Shape{4}, DType::kFloat32);
    w.Fill(1);
    kv->Init(0, w);
    if (kv->Rank() == std::atoi(argv[2])) std::this_thread::sleep_for(std::chrono::minutes(10));
    kv->Push(0, {w});
    kv->Pull(0, {w});
    kv->WaitAll();
    return 0;
  }
  if (argc != 3) {
    std::fprintf(stderr, "usage: security_worker READY_FILE GO_FILE\n");
    return 2;
  }
  try {
    auto kv = KVStore::Create("dist_sync");
    NDArray w(Shape{4}, DType::kFloat32), out(Shape{4}, DType::kFloat32);
    w.Fill(1);
    kv->Init(0, w);
    kv->Pull(0, {out});
    kv->WaitAll();
    if (!AllEqual(out, 1)) return 3;
    std::ofstream(argv[1]) << "ready\n";
    // Bounded wait for the test to finish its attacks.
    for (int i = 0; i < 1200 && ::access(argv[2], F_OK) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kv->Pull(0, {out});
    kv->WaitAll();
    if (!AllEqual(out, 1)) return 4;  // a stranger changed the weight
    NDArray g(Shape{4}, DType::kFloat32);
    g.Fill(2);
    kv->Push(0, {g});
    kv->Pull(0, {out});
    kv->WaitAll();
    if (!AllEqual(out, 2)) return 5;  // the job no longer works exactly
    std::printf("security_worker: values exact\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "security_worker: %s\n", e.what());
    return 1;
  }
}
