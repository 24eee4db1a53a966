// Moving a dist store's optimizer states between the servers and a states file
// (format: kvstore/states_file.h, a dist file of every server's blob).
//
// The states move as chunked data (kStates: any size; command replies are capped),
// only to and from rank 0, which writes and reads the file. Store s's states travel
// under its key 0 (WireKey(s, 0)) and its commands carry s.
#pragma once

#include <string>

#include "kvstore/dist/worker/server_link.h"

namespace pskv::dist {

/// Gathers every server's states and writes them to `fname` (rank 0 only).
/// `dump_optimizer` marks each blob so that loading adopts the saved configuration.
void SaveServerStates(ServerLink& link, const std::string& fname, bool dump_optimizer);
/// Reads `fname` and loads each server's blob into it (rank 0 only). UsageError if
/// the file was saved from another number of servers; IOError if it is malformed.
void LoadServerStates(ServerLink& link, const std::string& fname);

}  // namespace pskv::dist
