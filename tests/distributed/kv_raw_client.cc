// A worker that speaks the dist protocol directly (KVWorker, no KVStore), to send
// requests the KVStore never builds: multi-key pushes and inits where one key is
// bad. The server must refuse such a request whole — no key of it applied.
// Started by test_rounds.cc with the DMLC_* environment; exit status 0 = passed.
#include <cstdio>
#include <cstring>
#include <vector>

#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "ps/kv_app.h"
#include "ps/node.h"
#include "pskv/error.h"
#include "pskv/optimizer.h"

using namespace pskv;

namespace {

int g_failures = 0;
#define CHECK_TRUE(c, m)                                         \
  do {                                                           \
    if (!(c)) {                                                  \
      std::fprintf(stderr, "raw client: CHECK FAILED: %s\n", m); \
      ++g_failures;                                              \
    }                                                            \
  } while (0)

Frame Floats(const std::vector<float>& v) {
  return Frame::Copy(v.data(), v.size() * 4);
}

}  // namespace

int main() {
  try {
    Options o = Options::FromEnv();
    Node node(o);
    KVWorker w(&node);
    node.Start();
    const auto t = o.op_timeout;
    w.Command(dist::kSetMode, payload::EncodeMode(false), t);
    w.Command(
        dist::kSetOptimizer,
        payload::EncodeOptimizer(OptimizerConfig::FromParams("sgd", {{"learning_rate", "-1"}})), t);
    const uint64_t base = KVWorker::ServerRange(0, 1).first;
    auto call = [&](auto issue) {
      auto c = std::make_shared<Completion>();
      uint64_t ts = issue(Completion::Callback(c));
      w.Await(ts, c, t, o.stall_warning, "raw request");
    };
    // init keys 1 and 2 (4 floats each) in one request
    call([&](KVWorker::Callback cb) {
      return w.Push({base + 1, base + 2}, Floats({1, 1, 1, 1, 2, 2, 2, 2}), {16, 16},
                    dist::MakeCmd(dist::Kind::kInit, DType::kFloat32), cb);
    });
    // push to keys 1 (right size) and 2 (wrong size): refused whole
    bool refused = false;
    try {
      call([&](KVWorker::Callback cb) {
        return w.Push({base + 1, base + 2}, Floats({10, 10, 10, 10, 10, 10}), {16, 8},
                      dist::MakeCmd(dist::Kind::kDense, DType::kFloat32), cb);
      });
    } catch (const ShapeError& e) {
      refused = std::strstr(e.what(), "key 2") != nullptr;
      std::fprintf(stderr, "raw client: %s\n", e.what());
    }
    CHECK_TRUE(refused, "a push with a wrongly sized key must be refused naming it");
    // init keys 2 (exists) and 3 (new): refused whole, key 3 not created
    refused = false;
    try {
      call([&](KVWorker::Callback cb) {
        return w.Push({base + 2, base + 3}, Floats({0, 0, 0, 0, 3, 3, 3, 3}), {16, 16},
                      dist::MakeCmd(dist::Kind::kInit, DType::kFloat32), cb);
      });
    } catch (const KeyError& e) {
      refused = std::strstr(e.what(), "duplicate init of key 2") != nullptr;
    }
    CHECK_TRUE(refused, "an init with an existing key must be refused");
    // key 1 unchanged, key 3 absent
    std::vector<float> out(8, -1);
    call([&](KVWorker::Callback cb) {
      return w.Pull({base + 1, base + 2}, reinterpret_cast<char*>(out.data()), {16, 16},
                    dist::MakeCmd(dist::Kind::kDense, DType::kFloat32), cb);
    });
    CHECK_TRUE(out[0] == 1 && out[3] == 1 && out[4] == 2 && out[7] == 2,
               "no key of a refused request may change");
    bool absent = false;
    try {
      call([&](KVWorker::Callback cb) {
        return w.Pull({base + 3}, reinterpret_cast<char*>(out.data()), {16},
                      dist::MakeCmd(dist::Kind::kDense, DType::kFloat32), cb);
      });
    } catch (const KeyError&) {
      absent = true;
    }
    CHECK_TRUE(absent, "key 3 of a refused init must not exist");
    w.Command(dist::kWorkerDone, "", t);
    node.Finalize(t);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "raw client: unexpected error: %s\n", e.what());
    return 1;
  }
  if (g_failures) return 1;
  std::printf("raw client: all checks passed\n");
  return 0;
}
