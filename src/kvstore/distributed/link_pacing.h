// Kernel pacing of the connections between workers and servers on different hosts
// (Options::link_rate, PSKV_LINK_RATE; docs/performance.md, "Across hosts").
//
// A host's uplink is one FIFO queue for all its connections. Unpaced, each TCP
// connection hands it its data in bursts, so a piece one server waits for queues
// behind the bursts to the others, and the small flows (a co-located server's
// part, its answers) finish early while the big ones finish last. Paced, each
// connection between worker w and server r sends at link_rate * share_r / L (L:
// the busiest link's bytes per byte of a key; server_shares.h, LinkPacingRates):
// every connection's part of a push+pull takes the same time, and no link is
// offered more than its rate, so no queue forms. With PSKV_REPLICAS = R, L counts the
// copies of the primaries' rounds to their replicas (the initial range table's), so
// the workers' connections slow down to leave the copies their room: the replica's
// copy and its acknowledgement queue behind nothing (docs/performance.md, "Replicated
// servers"). Worker-worker, server-server and same-host connections are not paced;
// after a failover the rates stay those of the initial table.
#pragma once

#include "pskv/options.h"

namespace pskv {
class Node;
namespace dist {

/// Sets the pacing rate of `node`'s connections to the workers (a server of rank < S;
/// spares are not paced) or to the servers (a worker) on other
/// hosts, when `o.link_rate` > 0; after Node::Start. Idempotent.
void PaceLinks(Node& node, const Options& o);

}  // namespace dist
}  // namespace pskv
