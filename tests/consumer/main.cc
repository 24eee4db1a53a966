// Uses only pskv's public headers: a store ("local", or "dist_sync" under pskv-launch).
#include <pskv/kvstore.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  const std::string type = argc > 1 ? argv[1] : "local";
  auto kv = pskv::KVStore::Create(type);
  pskv::NDArray w({4}, pskv::DType::kFloat32), g({4}, pskv::DType::kFloat32);
  for (int i = 0; i < 4; ++i) {
    w.data<float>()[i] = 0;
    g.data<float>()[i] = 1;
  }
  kv->Init(7, w);
  kv->Push(7, {g});
  kv->Pull(7, {w});
  kv->WaitAll();
  const float want = static_cast<float>(kv->NumWorkers());
  if (w.data<float>()[3] != want) {
    std::printf("consumer: got %g, want %g\n", w.data<float>()[3], want);
    return 1;
  }
  std::printf("consumer %s rank %d: ok\n", type.c_str(), kv->Rank());
  return 0;
}
