// A job's nodes as threads of this process (tests/ps): one node's run on its thread,
// a job whose nodes all start at once (to see what each one's Start() ends in), and
// what an exception_ptr holds.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ps/node.h"
#include "pskv/options.h"
#include "support/test_util.h"

namespace pskv::test {

/// The message of what `e` holds ("" for none).
inline std::string What(std::exception_ptr e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

/// Whether `e` holds an `E`.
template <typename E>
bool Threw(std::exception_ptr e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

/// One node of an in-process job, run on the calling thread: Node(o), `setup` before
/// Start() (a transport factory), `part` after it (the node's share of the test), then
/// Finalize(`linger`). What it throws goes to `*error` (dropped where `error` is null).
inline void RunNode(const Options& o, std::exception_ptr* error,
                    const std::function<void(Node&)>& setup = {},
                    const std::function<void(Node&)>& part = {},
                    std::chrono::milliseconds linger = std::chrono::milliseconds(0)) {
  try {
    Node n(o);
    if (setup) setup(n);
    n.Start();
    if (part) part(n);
    n.Finalize(linger);
  } catch (...) {
    if (error) *error = std::current_exception();
  }
}

/// What became of one node of StartAtOnce.
struct Started {
  std::string what;          // "started" if Start() returned, then what it threw, if anything
  std::exception_ptr error;  // what Start() or Finalize() threw (null: nothing)
};

/// Starts a job of a scheduler, `servers` servers and `workers` workers on 127.0.0.1
/// (NodeOptions; registration timeout 60 s, longer than any bound the test checks),
/// node `i` in that order with the options `tweak(i, o)` makes, each on a thread of its
/// own, all at once; a node that started is finalised (1 s linger). For the start-up
/// checks that must fail every node of a job.
inline std::vector<Started> StartAtOnce(int port, int servers, int workers,
                                        const std::function<void(int, Options&)>& tweak) {
  const int nodes = 1 + servers + workers;
  std::vector<Started> out(static_cast<size_t>(nodes));
  std::vector<std::thread> threads;
  for (int i = 0; i < nodes; ++i)
    threads.emplace_back([&, i] {
      const Role role = i == 0 ? Role::kScheduler : i <= servers ? Role::kServer : Role::kWorker;
      Options o = NodeOptions(role, port, servers, workers);
      o.register_timeout = std::chrono::seconds(60);
      tweak(i, o);
      Started& s = out[static_cast<size_t>(i)];
      try {
        Node node(o);
        node.Start();
        s.what = "started";
        node.Finalize(std::chrono::seconds(1));
      } catch (const std::exception& e) {
        s.what += e.what();
        s.error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace pskv::test
