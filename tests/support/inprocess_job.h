// InProcessDistJob: a dist job whose scheduler, one DistServer and W KVWorkers are
// Nodes of this process, over TCP on 127.0.0.1 — for tests (ASan and TSan see the
// whole job) and benchmarks.
#pragma once

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "common/net.h"
#include "kvstore/dist_protocol.h"
#include "kvstore/distributed/server/dist_server.h"
#include "kvstore/distributed/wire/kv_payload.h"
#include "ps/kv_app.h"
#include "ps/node.h"

namespace pskv {

struct InProcessDistJob {
  // Declared before `nodes`, so destroyed after them: a node that stops (or aborts,
  // when the constructor throws) calls the failure handlers these registered.
  std::unique_ptr<DistServer> server;
  std::vector<std::unique_ptr<KVWorker>> workers;
  std::vector<std::unique_ptr<Node>> nodes;  // scheduler, server, workers

  /// Starts the job in sync mode. `o` gives every setting but the job's address
  /// and size (a free port on 127.0.0.1, one server, `num_workers` workers);
  /// `server_transport`, if set, makes the server's transport (e.g. a wrapper).
  InProcessDistJob(Options o, int num_workers, Node::TransportFactory server_transport = {}) {
    using namespace std::chrono_literals;
    o.root_uri = "127.0.0.1";
    o.root_port = FreePort();
    o.num_servers = 1;
    o.num_workers = num_workers;
    o.role_set = true;
    auto make = [&](Role r) {
      Options x = o;
      x.role = r;
      x.rank_hint = static_cast<int64_t>(nodes.size());
      nodes.push_back(std::make_unique<Node>(x));
      return nodes.back().get();
    };
    make(Role::kScheduler);
    Node* server_node = make(Role::kServer);
    if (server_transport) server_node->SetTransportFactory(std::move(server_transport));
    server = std::make_unique<DistServer>(server_node);
    for (int w = 0; w < num_workers; ++w)
      workers.push_back(std::make_unique<KVWorker>(make(Role::kWorker)));
    std::vector<std::thread> ts;
    for (auto& n : nodes) ts.emplace_back([&n] { n->Start(); });
    for (auto& t : ts) t.join();
    workers[0]->Command(dist::kSetMode, payload::EncodeMode(true), 60s);
  }
  ~InProcessDistJob() {
    std::vector<std::thread> ts;
    for (auto& n : nodes) ts.emplace_back([&n] { n->Finalize(std::chrono::seconds(60)); });
    for (auto& t : ts) t.join();
    // The nodes' threads are stopped: the server (whose stall inspector reads its node)
    // and the workers go before the nodes they use.
    server.reset();
    workers.clear();
  }
  InProcessDistJob(const InProcessDistJob&) = delete;
  InProcessDistJob& operator=(const InProcessDistJob&) = delete;
};

}  // namespace pskv
