#include "kvstore/dist/link_pacing.h"

#include <string>
#include <vector>

#include "common/logging.h"
#include "kvstore/dist/worker/server_shares.h"
#include "ps/node.h"

namespace pskv::dist {

void PaceLinks(Node& node, const Options& o) {
  if (o.link_rate <= 0) return;
  HostLayout layout;
  const std::vector<int> servers = node.ServerIds(), workers = node.WorkerIds();
  for (int id : servers) layout.server_hosts.push_back(node.HostOf(id));
  for (int id : workers) layout.worker_hosts.push_back(node.HostOf(id));
  const std::vector<uint64_t> rates =
      LinkPacingRates(layout, ServerShares(o.server_weights, layout),
                      static_cast<uint64_t>(o.link_rate), o.replicas);
  if (rates.empty()) return;
  const std::string here = node.HostOf(node.id());
  auto pace = [&](int peer, uint64_t rate) {
    if (node.HostOf(peer) != here) node.SetPacingRate(peer, rate);
  };
  if (o.role == Role::kServer && node.rank() < static_cast<int>(servers.size())) {
    const auto rank = static_cast<size_t>(node.rank());
    for (int w : workers) pace(w, rates[rank]);
    // The copies of this server's rounds to its replicas (the initial range table's:
    // ReplicaRanks). A connection that carries only acknowledgements (to a primary
    // this server replicates, not also one of its replicas) is not paced.
    for (int r : ReplicaRanks(static_cast<int>(rank), static_cast<int>(servers.size()), o.replicas))
      pace(servers[static_cast<size_t>(r)], rates[rank]);
  } else if (o.role == Role::kWorker) {
    for (size_t r = 0; r < servers.size(); ++r) pace(servers[r], rates[r]);
  }
  if (o.verbose >= 1)
    PSKV_INFO(node.Tag() << ": connections to other hosts paced for a link of " << o.link_rate
                         << " B/s");
}

}  // namespace pskv::dist
