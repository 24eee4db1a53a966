// The files of a saved or exported embedding table in a directory (table_files.h).
#include "embedding/table_files.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <system_error>

#include "pskv/error.h"

namespace pskv::embedding {

namespace {

namespace fs = std::filesystem;

struct SaveFile {
  uint64_t seq = 0;
  uint32_t shard = 0, shards = 0;
  int64_t step = 0;
  bool full = false;
  std::string path;
};

// The save files of `key` in `dir` (none when the directory does not exist).
std::vector<SaveFile> List(const std::string& dir, int key) {
  std::vector<SaveFile> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    SaveFile f;
    int k = 0, used = 0;
    char ext[8] = {};
    if (std::sscanf(name.c_str(),
                    "emb%d-%" SCNu64 "-%" SCNu32 "of%" SCNu32 "-step%" SCNd64 ".%5[a-z]%n", &k,
                    &f.seq, &f.shard, &f.shards, &f.step, ext, &used) != 6 ||
        static_cast<size_t>(used) != name.size() || k != key || f.shards == 0 ||
        f.shard >= f.shards)
      continue;
    if (std::strcmp(ext, "full") == 0) {
      f.full = true;
    } else if (std::strcmp(ext, "delta") != 0) {
      continue;
    }
    f.path = it->path().string();
    out.push_back(std::move(f));
  }
  return out;
}

// The name of save `seq` of a part, whatever its step and kind.
std::string Pattern(const std::string& dir, int key, uint64_t seq, uint32_t shard,
                    uint32_t shards) {
  std::string name = SaveFileName(key, seq, shard, shards, 0, false);
  name.replace(name.rfind("-step0.delta"), std::string::npos, "-step*.*");
  return (fs::path(dir) / name).string();
}

}  // namespace

std::string SaveFileName(int key, uint64_t seq, uint32_t shard, uint32_t shards, int64_t step,
                         bool full) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "emb%d-%06" PRIu64 "-%" PRIu32 "of%" PRIu32 "-step%" PRId64 ".%s",
                key, seq, shard, shards, step, full ? "full" : "delta");
  return buf;
}

std::string ExportFileName(int key, uint32_t shard, uint32_t shards) {
  return "emb" + std::to_string(key) + "-export-" + std::to_string(shard) + "of" +
         std::to_string(shards);
}

uint64_t LastSavedSeq(const std::string& dir, int key, uint32_t shard, uint32_t shards) {
  uint64_t seq = 0;
  for (const SaveFile& f : List(dir, key))
    if (f.shards != shards || f.shard == shard) seq = std::max(seq, f.seq);
  return seq;
}

SavedTable FindSaved(const std::string& dir, int key) {
  const std::vector<SaveFile> files = List(dir, key);
  const std::string table = "embedding table " + std::to_string(key);
  if (files.empty())
    throw IOError("no save of " + table + " in '" + dir + "' (files emb" + std::to_string(key) +
                  "-*.full / *.delta): pass the directory given to Save");
  SavedTable out;
  for (const SaveFile& f : files) out.seq = std::max(out.seq, f.seq);
  for (const SaveFile& f : files)
    if (f.seq == out.seq) {
      if (out.shards && out.shards != f.shards)
        throw IOError("save " + std::to_string(out.seq) + " of " + table + " in '" + dir +
                      "' has files of " + std::to_string(out.shards) + " and of " +
                      std::to_string(f.shards) +
                      " servers: two jobs saved into one directory; give each its own");
      out.shards = f.shards;
    }
  // Per shard: its files of this shard count up to seq, by number.
  std::vector<std::map<uint64_t, const SaveFile*>> by_shard(out.shards);
  for (const SaveFile& f : files)
    if (f.shards == out.shards && f.seq <= out.seq) {
      auto [it, fresh] = by_shard[f.shard].emplace(f.seq, &f);
      if (!fresh)
        throw IOError("'" + f.path + "' and '" + it->second->path + "' are both save " +
                      std::to_string(f.seq) + " of shard " + std::to_string(f.shard) +
                      ": remove the one a failed or foreign save left");
    }
  for (uint32_t s = 0; s < out.shards; ++s) {
    const auto& mine = by_shard[s];
    if (!mine.count(out.seq))
      throw IOError("save " + std::to_string(out.seq) + " of " + table + " in '" + dir +
                    "' is incomplete: shard " + std::to_string(s) + " of " +
                    std::to_string(out.shards) + " has no file " +
                    Pattern(dir, key, out.seq, s, out.shards) +
                    "; a save did not finish: remove the other files of "
                    "save " +
                    std::to_string(out.seq) + " to restore the save before it");
    auto full = mine.end();
    for (auto it = mine.begin(); it != mine.end(); ++it)
      if (it->second->full) full = it;
    if (full == mine.end())
      throw IOError("no full save of shard " + std::to_string(s) + " of " +
                    std::to_string(out.shards) + " of " + table + " in '" + dir +
                    "' before its deltas: a chain starts with Save(kFull) into the same "
                    "directory");
    SavedShard chain;
    chain.full = full->second->path;
    uint64_t want = full->first + 1;
    for (auto it = std::next(full); it != mine.end(); ++it, ++want) {
      if (it->first != want)
        throw IOError("delta " + Pattern(dir, key, want, s, out.shards) +
                      " is missing from the chain of " + chain.full +
                      ": a restore needs every delta after its full save; put it back, or "
                      "remove the saves after " +
                      std::to_string(want - 1) + " to restore an earlier one");
      chain.deltas.push_back(it->second->path);
    }
    out.step = std::max(out.step, mine.at(out.seq)->step);
    out.chains.push_back(std::move(chain));
  }
  return out;
}

void MakeDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw IOError("cannot create the directory '" + dir + "' for an embedding table's files (" +
                  ec.message() + "): give a writable path");
}

std::vector<std::string> FindExports(const std::string& dir, int key) {
  std::map<uint32_t, std::map<uint32_t, std::string>> by_count;  // shards -> shard -> path
  std::error_code ec;
  const std::string prefix = "emb" + std::to_string(key) + "-export-";
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    uint32_t s = 0, n = 0;
    int used = 0;
    if (std::sscanf(name.c_str() + prefix.size(), "%" SCNu32 "of%" SCNu32 "%n", &s, &n, &used) !=
            2 ||
        prefix.size() + static_cast<size_t>(used) != name.size() || n == 0 || s >= n)
      continue;
    by_count[n][s] = it->path().string();
  }
  const std::string table = "embedding table " + std::to_string(key);
  if (by_count.empty())
    throw IOError("no export of " + table + " in '" + dir + "' (files " + prefix +
                  "<shard>of<shards>): pass the directory given to Export");
  if (by_count.size() > 1)
    throw IOError("'" + dir + "' holds exports of " + table + " by " +
                  std::to_string(by_count.begin()->first) + " and by " +
                  std::to_string(by_count.rbegin()->first) +
                  " servers: remove the older files, or export into an empty directory");
  const uint32_t n = by_count.begin()->first;
  std::vector<std::string> out;
  for (uint32_t s = 0; s < n; ++s) {
    auto it = by_count.begin()->second.find(s);
    if (it == by_count.begin()->second.end())
      throw IOError("the export of " + table + " in '" + dir + "' lacks " +
                    (fs::path(dir) / ExportFileName(key, s, n)).string() +
                    ": export again (every server writes its file)");
    out.push_back(it->second);
  }
  return out;
}

uint64_t FileBytes(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(n);
}

}  // namespace pskv::embedding
