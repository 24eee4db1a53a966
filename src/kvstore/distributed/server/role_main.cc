#include "kvstore/distributed/server/role_main.h"

#include <memory>

#include "common/logging.h"
#include "kvstore/distributed/link_pacing.h"
#include "kvstore/distributed/server/dist_server.h"
#include "kvstore/distributed/server/replicated_server.h"
#include "ps/node.h"

namespace pskv {

int RunServerOrScheduler(const Options& options) {
  try {
    Node node(options);
    std::unique_ptr<DistServer> server;
    std::unique_ptr<ReplicaHost> host;  // replicated servers (PSKV_REPLICAS)
    if (options.role == Role::kServer && node.replicated())
      host = std::make_unique<ReplicaHost>(&node);
    else if (options.role == Role::kServer)
      server = std::make_unique<DistServer>(&node);
    node.Start();
    std::unique_ptr<dist::LinkPacer> pacer;
    if (options.role == Role::kServer) pacer = std::make_unique<dist::LinkPacer>(node, options);
    node.Finalize(std::chrono::milliseconds(0));
    return 0;
  } catch (const std::exception& e) {
    // A standby's error is its own (it stops; the job goes on with its scheduler).
    PSKV_ERROR((options.standby ? "the standby scheduler stops: " : "the job failed: ")
               << e.what());
    return 1;
  }
}

}  // namespace pskv
