// Moving a dist store's optimizer states between the servers and a states file.
//
// The file holds whole keys ("PSKVDST3", kvstore/states_file.h), whatever the number
// of servers and the placement: saving gathers each key's parts from the servers,
// loading cuts each key into the parts of this job's placement
// (kvstore/states_layout.h). So states saved by a job with S servers load into a job
// with any other number, and into a local store. Files of the per-server formats
// ("PSKVDST1"/"PSKVDST2") load as they are with the same number of servers, and are
// re-sliced from the placement they were saved with otherwise.
//
// The states move as chunked data (kStates: any size; command replies are capped),
// only to and from rank 0, which writes and reads the file. Store s's states travel
// under its key 0 (WireKey(s, 0)) and its commands carry s.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kvstore/distributed/worker/key_table.h"
#include "kvstore/distributed/worker/server_link.h"
#include "kvstore/states_layout.h"

namespace pskv::dist {

/// The optimizer-state parts of `metas` placed over `num_servers` servers: per key,
/// each ps key's server, optimizer key (dist::OptimizerKey) and element range.
states::Layout LayoutOf(const std::vector<const KeyMeta*>& metas, int num_servers);

/// The store's layout over a number of servers (for this job's number: the placement
/// its key table routes requests with).
using LayoutFor = std::function<states::Layout(int num_servers)>;

/// Gathers every server's states and writes them to `fname` as whole keys (rank 0
/// only), through a temporary file renamed at the end: a failed save leaves an
/// existing file as it was. `dump_optimizer` marks the file so that loading adopts
/// the saved configuration.
void SaveServerStates(ServerLink& link, const LayoutFor& layout, const std::string& fname,
                      bool dump_optimizer);
/// Reads `fname` and loads each server its part (rank 0 only). IOError if the file
/// is malformed; KeyError or ShapeError if its keys are not this store's (nothing
/// loaded then).
void LoadServerStates(ServerLink& link, const LayoutFor& layout, const std::string& fname);

}  // namespace pskv::dist
