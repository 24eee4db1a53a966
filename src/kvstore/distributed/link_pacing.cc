#include "kvstore/distributed/link_pacing.h"

#include <string>
#include <vector>

#include "common/logging.h"
#include "kvstore/distributed/server_shares.h"
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
    // The connections to the replicas stay unpaced: the rates leave the copies their
    // room on every link, and a copy leaves no faster than the paced pushes complete
    // its round; a cap sized for a dense round starves a row_sparse one (the union of
    // the workers' rows), measured in docs/performance.md, "Replicated servers".
  } else if (o.role == Role::kWorker) {
    for (size_t r = 0; r < servers.size(); ++r) pace(servers[r], rates[r]);
  }
  if (o.verbose >= 1)
    PSKV_INFO(node.Tag() << ": connections to other hosts paced for a link of " << o.link_rate
                         << " B/s");
}

}  // namespace pskv::dist
