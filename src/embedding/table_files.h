// The files of a saved or exported embedding table in a directory (issue 41 item 6):
// their names, and finding the newest save's chains (a full save and its deltas per
// saved shard) for Table::Restore.
//
// A save is numbered: every part (server) of a table writes save `seq` together (a
// collective Save), so a directory holds, per table key, files
//   emb<key>-<seq, 6+ digits>-<shard>of<shards>-step<step>.full|.delta
// where `step` is the part's count of updates applied when it was written (the
// clock a restored part continues from), and an export
//   emb<key>-export-<shard>of<shards>
// FindSaved picks the largest seq, requires a file of it from every shard of its
// shard count, and per shard the newest full save up to it plus every delta after
// that, with no seq missing: anything else is an IOError naming the file and the fix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "embedding/table.h"

namespace pskv::embedding {

std::string SaveFileName(int key, uint64_t seq, uint32_t shard, uint32_t shards, int64_t step,
                         bool full);
std::string ExportFileName(int key, uint32_t shard, uint32_t shards);

/// The newest save of table `key` in `dir`.
struct SavedTable {
  uint32_t shards = 0;             ///< the server count that saved it
  uint64_t seq = 0;                ///< the save's number
  int64_t step = 0;                ///< updates applied when it was saved
  std::vector<SavedShard> chains;  ///< per saved shard: full save, deltas in order
};
/// IOError (naming the directory or file, and the fix) when there is no save of `key`,
/// a shard's file of the newest save is missing, or a delta of a chain is missing.
SavedTable FindSaved(const std::string& dir, int key);
/// The largest save number of `key` in `dir` that part `shard` of `shards` sees: of its
/// own files and of saves by another part count (not its siblings', which they may be
/// writing now), so the parts of one job agree. 0 when none (or no directory).
uint64_t LastSavedSeq(const std::string& dir, int key, uint32_t shard, uint32_t shards);
/// Creates `dir` (and its parents) if missing: IOError naming it if it cannot.
void MakeDir(const std::string& dir);
/// The export files of `key` in `dir`, by shard. IOError when none, one is missing, or
/// exports by different server counts are mixed.
std::vector<std::string> FindExports(const std::string& dir, int key);
/// A file's size in bytes (0 if it cannot be read).
uint64_t FileBytes(const std::string& path);

}  // namespace pskv::embedding
