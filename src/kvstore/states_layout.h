// Optimizer states of whole keys versus the parts the servers hold.
//
// A dist server keeps the optimizer state of each part of a key it holds (a slice of a
// big key, a wire chunk of a slice, a row range of a row_sparse table) under its own
// optimizer key. A states file holds whole keys instead ("PSKVDST3", states_file.h),
// so that it does not depend on how the saving job placed its keys: saving gathers
// the parts into whole keys, loading cuts whole keys into the parts of the loading
// job's placement. The placement itself is not computed here: the caller describes it
// as a Layout, built from the worker's key table (the same placement that routes its
// pushes), so a change of placement never changes the file.
//
// Every part is a contiguous range of the key's elements; a state buffer (each slot,
// the float32 master copy) has one element per weight element, so a part's state is
// the same range of the whole key's state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvstore/states_file.h"

namespace pskv::states {

/// One part of a key: elements [offset, offset + len) of the key, held by `server`
/// under optimizer key `opt_key`.
struct Part {
  int server = 0;
  int64_t opt_key = 0;
  int64_t offset = 0, len = 0;
};

/// A key of the store: its id (the key of the whole-keys file), element count and
/// parts (covering the key, in any order, none empty).
struct KeyLayout {
  int64_t key = 0;
  int64_t size = 0;
  std::vector<Part> parts;
};
using Layout = std::vector<KeyLayout>;

/// Writes the whole-keys file ("PSKVDST3" and its blob) of the per-server blobs
/// `servers` (index = server) laid out by `layout` to `out`. Each key's step count is
/// the largest of its parts' (they are equal unless a save raced a dist_async push);
/// the update count is the largest of the servers'; the configuration is server 0's.
/// Keys without states on any server are left out. InternalError if a server holds
/// a part that `layout` does not name, a key has states on some of its parts only,
/// or parts disagree with the layout's sizes; the sink sees nothing then.
void GatherWholeKeys(const std::vector<std::string_view>& servers, const Layout& layout,
                     bool dumped, const BlobWriter::Sink& out);

/// Cuts whole-keys states `whole` (IndexBlob of a whole-keys file or of any single
/// optimizer's blob) into one blob per server of `layout` (num_servers of them),
/// appended to `out` in server order; returns their sizes. Each server's update
/// count is the file's. KeyError for a key of the file that `layout` does not have,
/// ShapeError for a state whose size is not its key's; `out` is unchanged then.
std::vector<uint64_t> SplitWholeKeys(const BlobView& whole, const Layout& layout, int num_servers,
                                     std::string* out);

}  // namespace pskv::states
