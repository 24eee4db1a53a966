// A dist_sync training loop for the elastic-worker tests (test_elastic.cc): plain SGD
// (learning rate 1) on three keys — a small one, a big one sliced over every server, a
// fused pair of tiny ones — with gradients whose every element is a small integer times
// 2^rank, so that each round's update names the workers whose pushes it summed (the
// test solves for them) and every sum is exact in float32 whatever the order.
//
//   elastic_worker ROUNDS OUT_DIR [EPOCH_ROUNDS [SLEEP_MS [DIE_RANK DIE_ROUND [TAG]]]]
//
// It writes its pid to OUT_DIR/w<rank>.pid. After round r it appends "r <ms> <v> <v> ..."
// (the wall clock in ms since the epoch, then a few elements of every key) to
// OUT_DIR/w<rank>.log and creates OUT_DIR/w<rank>.r<r> (the test kills workers at
// chosen points); at the end it writes every key's values to OUT_DIR/w<rank>.weights. With
// EPOCH_ROUNDS > 0, a round that starts an epoch first asks for the epoch's data partition
// (KVStore::EpochPartition) and appends "e <epoch> <num_parts> <part_index>" to
// OUT_DIR/w<rank>.parts. SLEEP_MS: a pause before each round (a step's compute), so
// that a kill lands near the round chosen. DIE_RANK, DIE_ROUND: that worker, in that
// round, pushes the first two keys only, waits until their rounds were summed, and
// kills itself (SIGKILL): a death amid a step. TAG (a worker started to join the running
// job in place of one that left) is appended to its file names (w<rank><TAG>.*); such a
// worker starts at the epoch it was admitted in (KVStore::Epoch), so its rounds are
// numbered as the others', and writes the weights it pulled before its first round to
// w<rank><TAG>.start ("<round before its first> <v> <v> ...", as a log line).
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "pskv/kvstore.h"

using namespace pskv;

namespace {

const std::vector<int> kKeys = {3, 5, 7, 9};
const std::vector<int64_t> kSizes = {10, 60000, 4, 4};  // key 5: sliced over the servers

// The multiplier every worker's gradient of (round, key, element) shares; worker
// `rank` pushes it times 2^rank.
float Base(int round, int key, int64_t i) {
  return static_cast<float>(1 + (round * 3 + key * 5 + static_cast<int>(i % 7)) % 4);
}

NDArray Grad(int64_t n, int rank, int round, int key) {
  NDArray a({n});
  for (int64_t i = 0; i < n; ++i)
    a.data<float>()[i] = Base(round, key, i) * static_cast<float>(1 << rank);
  return a;
}

void Touch(const std::string& path) {
  if (FILE* f = std::fopen(path.c_str(), "w")) std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: elastic_worker ROUNDS OUT_DIR [EPOCH_ROUNDS]\n");
    return 2;
  }
  const int rounds = std::atoi(argv[1]);
  const std::string out = argv[2];
  const int epoch_rounds = argc > 3 ? std::atoi(argv[3]) : 0;
  const int sleep_ms = argc > 4 ? std::atoi(argv[4]) : 0;
  const int die_rank = argc > 6 ? std::atoi(argv[5]) : -1;
  const int die_round = argc > 6 ? std::atoi(argv[6]) : -1;
  const std::string tag = argc > 7 ? argv[7] : "";
  try {
    auto kv = KVStore::Create("dist_sync");
    const int rank = kv->Rank();
    const std::string me = out + "/w" + std::to_string(rank) + tag;
    std::ofstream(me + ".pid") << ::getpid() << "\n";
    for (size_t k = 0; k < kKeys.size(); ++k) {
      NDArray v({kSizes[k]});
      v.Fill(1000.0);
      kv->Init(kKeys[k], v);
    }
    kv->SetOptimizer(OptimizerConfig::FromParams("sgd", {{"learning_rate", "1"}}));
    std::vector<NDArray> w;
    for (auto n : kSizes) w.emplace_back(std::vector<int64_t>{n});
    kv->Pull(kKeys, w);  // the current weights (a worker that joined: those of the job)
    kv->WaitAll();
    auto write_values = [&](FILE* f, int r, long long ms) {
      std::fprintf(f, "%d %lld", r, ms);
      for (auto& a : w)
        for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}, a.size() - 1})
          std::fprintf(f, " %.9g", static_cast<double>(a.data<float>()[i]));
      std::fprintf(f, "\n");
    };
    FILE* log = std::fopen((me + ".log").c_str(), "w");
    FILE* parts = epoch_rounds > 0 ? std::fopen((me + ".parts").c_str(), "w") : nullptr;
    bool first = true;
    for (int r = 1; r <= rounds; ++r) {
      if (epoch_rounds > 0 && (first || (r - 1) % epoch_rounds == 0)) {
        auto [num_parts, part_index] = kv->EpochPartition();
        if (first && kv->Epoch() > 0) {  // joined a running job: its epoch's first round
          r = kv->Epoch() * epoch_rounds + 1;
          FILE* start = std::fopen((me + ".start").c_str(), "w");
          write_values(start, r - 1, 0);
          std::fclose(start);
        }
        first = false;
        std::fprintf(parts, "e %d %d %d\n", kv->Epoch(), num_parts, part_index);
        std::fflush(parts);
        if (r > rounds) break;
      }
      if (sleep_ms > 0) ::usleep(static_cast<useconds_t>(sleep_ms) * 1000);
      std::vector<NDArray> g;
      for (size_t k = 0; k < kKeys.size(); ++k) g.push_back(Grad(kSizes[k], rank, r, kKeys[k]));
      if (rank == die_rank && r == die_round) {
        const std::vector<int> first = {kKeys[0], kKeys[1]};
        kv->Push(first, {g[0], g[1]});
        kv->Wait(first);
        ::raise(SIGKILL);
      }
      if (r % 2) {
        kv->PushPull(kKeys, g, kKeys, w);
      } else {
        kv->Push(kKeys, g);
        kv->Pull(kKeys, w);
      }
      kv->WaitAll();
      const auto now = std::chrono::system_clock::now().time_since_epoch();
      write_values(log, r,
                   static_cast<long long>(
                       std::chrono::duration_cast<std::chrono::milliseconds>(now).count()));
      std::fflush(log);
      Touch(me + ".r" + std::to_string(r));
    }
    std::fclose(log);
    if (parts) std::fclose(parts);
    std::ofstream f(me + ".weights", std::ios::binary);
    for (auto& a : w)
      f.write(static_cast<const char*>(a.raw()), static_cast<std::streamsize>(a.nbytes()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
