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
// offered more than its rate, so no queue forms. With PSKV_REPLICAS = R, a primary's
// connections to its replicas (the initial range table's) carry its rounds' copies,
// paced alike, and L counts them, so the workers' connections slow down to leave the
// copies their room: the replica's copy and its acknowledgement queue behind nothing
// (docs/performance.md, "Replicated servers"). Worker-worker connections, the other
// server-server ones (acknowledgements) and those within a host are not paced; after
// a failover the pacing stays that of the initial table.
#pragma once

#include "pskv/options.h"

namespace pskv {
class Node;
namespace dist {

/// Sets the pacing rate of `node`'s connections to the workers and its replicas (a
/// server of rank < S; spares are not paced) or to the servers (a worker) on other
/// hosts, when `o.link_rate` > 0; after Node::Start. Idempotent.
void PaceLinks(Node& node, const Options& o);

}  // namespace dist
}  // namespace pskv
