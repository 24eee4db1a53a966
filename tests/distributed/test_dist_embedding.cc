// Dist embedding tables' worker cache and checkpoints (issue 41 items 5, 6): real
// processes on 127.0.0.1 started by pskv-launch, running
// tests/distributed/embedding_io_worker.cc; each test asserts the launcher's exit status.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

int Launch(int workers, int servers, const std::string& scenario, const std::string& dir,
           int rounds, const std::string& needle = "") {
  // Appended piece by piece (GCC 12's -Warray-bounds misfires on a chain of +).
  std::string cmd = PSKV_LAUNCH;
  cmd.append(" -n ").append(std::to_string(workers));
  cmd.append(" -s ").append(std::to_string(servers));
  cmd.append(" --timeout 60 -- ").append(EMBEDDING_IO_WORKER);
  cmd.append(" ").append(scenario).append(" '").append(dir).append("' ");
  cmd.append(std::to_string(rounds));
  if (!needle.empty()) cmd.append(" '").append(needle).append("'");
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string FreshDir(const std::string& name) {
  const fs::path d =
      fs::path(testing::TempDir()) / ("pskv-emb-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

// The one file of `dir` whose name starts with `prefix`.
fs::path FileOf(const std::string& dir, const std::string& prefix) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return e.path();
  ADD_FAILURE() << "no file " << prefix << "* in " << dir;
  return {};
}

std::string CopyOf(const std::string& from, const std::string& name) {
  const std::string to = FreshDir(name);
  fs::copy(from, to, fs::copy_options::overwrite_existing | fs::copy_options::recursive);
  return to;
}

}  // namespace

// The worker's row cache: S = 0 reads bit for bit what an uncached pull reads; with
// S = 2 and 8 every row read at round t is the servers' row of a round in [t - S, t],
// stale rows are served, and the pulls' bytes fall with S; the tables' counters
// (Stats) are the sums of the servers' parts and equal one reference table's.
TEST(DistEmbedding, Cache2Workers2ServersBoundedStaleness) {
  EXPECT_EQ(Launch(2, 2, "cache", "-", 16), 0);
}

// A table saved by 2 servers (a full save after round 4, deltas after 6 and 8, while
// it trains) restores on 3, 1 and 2 servers to the rows and versions saved after
// round 8, and rounds 8..11 then give the saving job's rows after round 12 bit for
// bit; the export holds exactly the live rows. A missing or corrupt delta, or a save
// a server did not finish, is an IOError on every worker naming the file, and the
// table is left as it was.
TEST(DistEmbedding, CheckpointSavedBy2ServersRestoresOn3And1And2) {
  const std::string dir = FreshDir("ckpt");
  ASSERT_EQ(Launch(2, 2, "save", dir, 12), 0);
  EXPECT_EQ(Launch(2, 3, "restore", dir, 12), 0);
  EXPECT_EQ(Launch(2, 1, "restore", dir, 12), 0);
  EXPECT_EQ(Launch(2, 2, "restore", dir, 12), 0);
  {  // a delta missing from shard 1's chain
    const std::string d = CopyOf(dir, "missing");
    fs::remove(FileOf(d, "emb80-000002-1of2-"));
    EXPECT_EQ(Launch(2, 2, "broken", d, 1, "emb80-000002-1of2-"), 0);
  }
  {  // a corrupt byte in the last delta of shard 0
    const std::string d = CopyOf(dir, "corrupt");
    const fs::path f = FileOf(d, "emb80-000003-0of2-");
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(fs::file_size(f) / 2));
    io.put('\x5a');
    io.close();
    EXPECT_EQ(Launch(2, 3, "broken", d, 1, f.filename().string()), 0);
  }
  {  // the last save written by one server only
    const std::string d = CopyOf(dir, "incomplete");
    fs::remove(FileOf(d, "emb80-000003-1of2-"));
    EXPECT_EQ(Launch(2, 2, "broken", d, 1, "emb80-000003-1of2-"), 0);
  }
  {  // no save at all
    const std::string d = FreshDir("empty");
    EXPECT_EQ(Launch(2, 2, "broken", d, 1, "no save of embedding table 80"), 0);
  }
}
