// Elastic workers (PSKV_ELASTIC=1; docs/fault-tolerance.md, "Elastic workers"): real
// processes over real ZeroMQ, workers killed with SIGKILL at chosen or random moments.
// The job must go on and end with exit 0 on every process left, and every round's
// update must be the scaled sum of exactly the pushes that reached it: the test solves
// each round's contributor set from the weights the survivors pulled (elastic_worker.cc
// makes every worker's gradient a distinct power of two times a shared integer), checks
// that every survivor is in every set and that each killed worker contributed to a
// prefix of the rounds (its last round possibly for some keys only), and compares the
// final weights, every element, with the reference computed from those sets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "support/proc.h"
#include "support/test_util.h"

using namespace pskv::test;
using namespace std::chrono_literals;

namespace {

// As elastic_worker.cc.
const std::vector<int> kKeys = {3, 5, 7, 9};
const std::vector<int64_t> kSizes = {10, 60000, 4, 4};
float Base(int round, int key, int64_t i) {
  return static_cast<float>(1 + (round * 3 + key * 5 + static_cast<int>(i % 7)) % 4);
}
constexpr int kLogged = 4;  // elements logged per key: 0, 1, 2, last
int64_t LoggedIndex(size_t k, int j) {
  return j < 3 ? j : kSizes[k] - 1;
}

struct Job {
  std::string dir, log;
  int workers = 0, port = 0;
  std::vector<pid_t> procs;  // scheduler, servers, workers (by start order)
  std::vector<pid_t> worker_pids;
};

std::map<std::string, std::string> Env(int port, const std::string& role, int workers,
                                       int min_workers) {
  return {{"DMLC_ROLE", role},
          {"DMLC_PS_ROOT_URI", "127.0.0.1"},
          {"DMLC_PS_ROOT_PORT", std::to_string(port)},
          {"DMLC_NUM_SERVER", "2"},
          {"DMLC_NUM_WORKER", std::to_string(workers)},
          {"PS_HEARTBEAT_INTERVAL", "0.5"},
          {"PS_HEARTBEAT_TIMEOUT", "3"},
          {"PSKV_ELASTIC", "1"},
          {"PSKV_MIN_WORKERS", std::to_string(min_workers)},
          {"PSKV_SERVER_THREADS", "1"},
          {"PSKV_TIMEOUT", "60"}};
}

std::string TempDir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("pskv_elastic_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

Job Start(const std::string& name, int workers, int min_workers, int rounds, int epoch_rounds,
          int sleep_ms, std::vector<std::string> extra = {},
          const std::map<std::string, std::string>& more_env = {}) {
  Job j;
  j.dir = TempDir(name);
  j.log = j.dir + "/log";
  j.workers = workers;
  const int port = FreePort();
  j.port = port;
  auto env = [&](const char* role) {
    auto e = Env(port, role, workers, min_workers);
    for (auto& [k, v] : more_env) e[k] = v;
    return e;
  };
  j.procs.push_back(Spawn({PSKV_SERVER}, env("scheduler"), j.log));
  for (int s = 0; s < 2; ++s) j.procs.push_back(Spawn({PSKV_SERVER}, env("server"), j.log));
  std::vector<std::string> argv = {ELASTIC_WORKER, std::to_string(rounds), j.dir,
                                   std::to_string(epoch_rounds), std::to_string(sleep_ms)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  for (int w = 0; w < workers; ++w) j.procs.push_back(Spawn(argv, env("worker"), j.log));
  return j;
}

// A job of 3 workers and 2 servers under pskv-launch --min-workers 2 (and `launch_args`),
// the workers running `rounds` rounds of ELASTIC_WORKER with epochs of `epoch` rounds;
// the launcher is the job's one process.
Job StartLaunched(const std::string& name, int rounds, int epoch,
                  const std::vector<std::string>& launch_args = {}) {
  Job j;
  j.dir = TempDir(name);
  j.log = j.dir + "/log";
  j.workers = 3;
  std::vector<std::string> argv = {PSKV_LAUNCH, "-n", "3", "-s", "2", "--min-workers", "2"};
  argv.insert(argv.end(), launch_args.begin(), launch_args.end());
  for (const std::string& a :
       {std::string("--"), std::string(ELASTIC_WORKER), std::to_string(rounds), j.dir,
        std::to_string(epoch), std::string("30")})
    argv.push_back(a);
  j.procs.push_back(Spawn(
      argv,
      {{"PS_HEARTBEAT_INTERVAL", "0.5"}, {"PS_HEARTBEAT_TIMEOUT", "3"}, {"PSKV_TIMEOUT", "60"}},
      j.log));
  return j;
}

void Cleanup(const Job& j) {
  for (pid_t p : j.procs) {
    ::kill(-p, SIGKILL);
    ::waitpid(p, nullptr, WNOHANG);
  }
  std::filesystem::remove_all(j.dir);
}

// The pid worker `rank` wrote (it registered and got its rank), waiting at most 20 s.
pid_t WorkerPid(const Job& j, int rank) {
  const std::string f = j.dir + "/w" + std::to_string(rank) + ".pid";
  if (!WaitFile(f, 20s)) return 0;
  for (int i = 0; i < 50; ++i) {
    std::ifstream in(f);
    pid_t p = 0;
    if (in >> p && p > 0) return p;
    std::this_thread::sleep_for(20ms);
  }
  return 0;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A worker KillWorkerAfter signalled: its pid, and NowMs() right after the signal.
struct Killed {
  pid_t pid = 0;
  int64_t at = 0;
};

// Sends worker `rank` signal `sig` once it finished round `round` (its marker file).
void KillWorkerAfter(const Job& j, int rank, int round, Killed* killed, int sig = SIGKILL) {
  killed->pid = WorkerPid(j, rank);
  ASSERT_GT(killed->pid, 0) << ReadFile(j.log);
  ASSERT_TRUE(WaitFile(j.dir + "/w" + std::to_string(rank) + ".r" + std::to_string(round), 20s))
      << ReadFile(j.log);
  ::kill(killed->pid, sig);
  killed->at = NowMs();
}

// Waits at most `bound` for the launcher (the job's one process) to exit, which it
// must with status 0; `*log`: the job's log then.
// Starts a newcomer worker (log "w<id><tag>.log") that asks to join `j` (3 workers, at
// least 2) with `more` in its environment.
pid_t SpawnJoiner(const Job& j, int rounds, int epoch, const char* tag,
                  const std::map<std::string, std::string>& more = {}) {
  auto env = Env(j.port, "worker", 3, 2);
  for (const auto& [k, v] : more) env[k] = v;
  return Spawn(
      {ELASTIC_WORKER, std::to_string(rounds), j.dir, std::to_string(epoch), "30", "-1", "-1", tag},
      env, j.log);
}

void ExpectLauncherSucceeds(const Job& j, std::chrono::milliseconds bound, std::string* log) {
  auto st = WaitExit(j.procs[0], bound);
  ASSERT_TRUE(st.has_value()) << ReadFile(j.log);
  *log = ReadFile(j.log);
  EXPECT_EQ(*st, 0) << *log;
}

struct Line {
  int round = 0;
  int64_t ms = 0;
  std::vector<double> v;  // kKeys.size() * kLogged
};

std::vector<Line> ReadLog(const std::string& path) {
  std::vector<Line> out;
  std::ifstream f(path);
  for (std::string s; std::getline(f, s);) {
    std::istringstream in(s);
    Line l;
    in >> l.round >> l.ms;
    for (double x; in >> x;) l.v.push_back(x);
    if (l.v.size() == kKeys.size() * kLogged) out.push_back(l);
  }
  return out;
}

// The update of one element in a round whose pushes came from `mask` (bit r: worker r).
double Update(int workers, unsigned mask, float base) {
  const int k = __builtin_popcount(mask);
  return static_cast<double>(static_cast<float>(static_cast<double>(workers) / k) *
                             (static_cast<float>(mask) * base));
}

// The contributor set of every (round, key) (`sets[round][key index]`, bit r: worker r),
// solved from the deltas of the weights logged in `ref` (rounds 1, 2, ...).
void Solve(const std::vector<Line>& ref, int W, std::vector<std::vector<unsigned>>* sets) {
  sets->assign(ref.size() + 1, std::vector<unsigned>(kKeys.size()));
  std::vector<double> prev(kKeys.size() * kLogged, 1000.0);
  for (size_t r = 0; r < ref.size(); ++r) {
    const int round = static_cast<int>(r) + 1;
    ASSERT_EQ(ref[r].round, round) << "the reference log skips a round";
    for (size_t k = 0; k < kKeys.size(); ++k) {
      std::vector<unsigned> fits;
      for (unsigned mask = 1; mask < (1u << W); ++mask) {
        bool ok = true;
        for (int e = 0; e < kLogged && ok; ++e) {
          const size_t at = k * kLogged + static_cast<size_t>(e);
          const double delta = prev[at] - ref[r].v[at];
          ok = std::fabs(delta - Update(W, mask, Base(round, kKeys[k], LoggedIndex(k, e)))) < 1e-2;
        }
        if (ok) fits.push_back(mask);
      }
      ASSERT_EQ(fits.size(), 1u) << "round " << round << " key " << kKeys[k]
                                 << ": the update is not the scaled sum of one set of pushes";
      (*sets)[static_cast<size_t>(round)][k] = fits[0];
    }
    prev = ref[r].v;
  }
}

// Every element of the final weights in `path`, against the reference from `sets`.
void CheckWeights(const std::string& path, int W, const std::vector<std::vector<unsigned>>& sets) {
  std::string bytes = ReadFile(path);
  int64_t total = 0;
  for (auto n : kSizes) total += n;
  ASSERT_EQ(bytes.size(), static_cast<size_t>(total) * 4) << path;
  const float* got = reinterpret_cast<const float*>(bytes.data());
  int64_t at = 0, bad = 0;
  for (size_t k = 0; k < kKeys.size(); ++k)
    for (int64_t i = 0; i < kSizes[k]; ++i, ++at) {
      float w = 1000.0f;
      for (size_t r = 1; r < sets.size(); ++r)
        w -= static_cast<float>(Update(W, sets[r][k], Base(static_cast<int>(r), kKeys[k], i)));
      if (w != got[at] && bad++ < 3)
        ADD_FAILURE() << path << ": key " << kKeys[k] << "[" << i << "] = " << got[at]
                      << ", reference " << w;
    }
  EXPECT_EQ(bad, 0) << path << ": elements differing from the reference";
}

struct Verdict {
  int rounds = 0;
  int64_t stall_ms = -1;  // the longest gap between two rounds' ends on survivor 0
  std::vector<std::vector<unsigned>> sets;  // [round][key index]: the workers summed
};

// Checks the job's outcome (see the file comment); `killed`: ranks killed, with the
// time of each kill.
void Check(const Job& j, const std::vector<int>& survivors, const std::map<int, int64_t>& killed,
           int rounds, Verdict* verdict = nullptr) {
  Verdict scratch;
  Verdict& out = verdict ? *verdict : scratch;
  const int W = j.workers;
  std::vector<Line> ref = ReadLog(j.dir + "/w" + std::to_string(survivors[0]) + ".log");
  EXPECT_EQ(static_cast<int>(ref.size()), rounds) << ReadFile(j.log);
  for (int s : survivors) {
    auto mine = ReadLog(j.dir + "/w" + std::to_string(s) + ".log");
    EXPECT_EQ(mine.size(), ref.size()) << "worker " << s;
    for (size_t r = 0; r < std::min(mine.size(), ref.size()); ++r)
      EXPECT_EQ(mine[r].v, ref[r].v) << "worker " << s << " round " << r + 1;
  }
  std::vector<std::vector<unsigned>> sets;
  ASSERT_NO_FATAL_FAILURE(Solve(ref, W, &sets));
  for (size_t r = 1; r < sets.size(); ++r)
    for (size_t k = 0; k < kKeys.size(); ++k)
      for (int s : survivors)
        EXPECT_TRUE(sets[r][k] & (1u << s)) << "round " << r << " key " << kKeys[k]
                                            << " lacks the push of worker " << s << ", which lived";
  // Each killed worker: a prefix of full rounds, at most one partial round after it,
  // nothing later; at least every round it completed (its markers), at most one more.
  for (auto& [d, when] : killed) {
    int full = 0, last_any = 0;
    for (int r = 1; r <= static_cast<int>(ref.size()); ++r) {
      int n = 0;
      for (unsigned m : sets[static_cast<size_t>(r)]) n += (m >> d) & 1;
      if (n == static_cast<int>(kKeys.size()) && full == r - 1) full = r;
      if (n > 0) last_any = r;
    }
    EXPECT_LE(last_any, full + 1) << "worker " << d << " contributed after a round it missed";
    int completed = 0;
    while (std::filesystem::exists(j.dir + "/w" + std::to_string(d) + ".r" +
                                   std::to_string(completed + 1)))
      ++completed;
    EXPECT_GE(full, completed) << "worker " << d << " completed rounds the sums lack";
    EXPECT_LE(last_any, completed + 1) << "worker " << d << " contributed past its next round";
    std::printf("worker %d (killed): completed %d rounds, in the sums of %d full round(s)%s\n", d,
                completed, full, last_any > full ? " and part of the next" : "");
    // Stall: the longest time between two rounds' ends on the first survivor in the
    // rounds that ended after the kill (the round the kill caught among them).
    for (size_t r = 1; r < ref.size(); ++r)
      if (ref[r].ms >= when) out.stall_ms = std::max(out.stall_ms, ref[r].ms - ref[r - 1].ms);
  }
  for (int s : survivors) CheckWeights(j.dir + "/w" + std::to_string(s) + ".weights", W, sets);
  out.rounds = static_cast<int>(ref.size());
  out.sets = sets;
}

// Every process but the killed ones exits 0 within `bound`.
void ExpectFinished(const Job& j, const std::set<pid_t>& killed, std::chrono::milliseconds bound) {
  const auto end = std::chrono::steady_clock::now() + bound;
  for (pid_t p : j.procs) {
    if (killed.count(p)) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    auto st = WaitExit(p, std::max(left, 1ms));
    ASSERT_TRUE(st.has_value()) << "pid " << p << " still running; log:\n" << ReadFile(j.log);
    EXPECT_EQ(*st, 0) << "pid " << p << " failed; log:\n" << ReadFile(j.log);
  }
}

}  // namespace

// Worker 1 of 3 killed once it finished round 6: the job goes on with 2 workers; the
// epochs after the kill are dealt in 2 parts.
TEST(ElasticWorkers, KillAtChosenRound) {
  const int rounds = 24, epoch = 5;
  Job j = Start("chosen", 3, 2, rounds, epoch, 30);
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 6, &k));
  ExpectFinished(j, {k.pid}, 20s);
  Verdict v;
  Check(j, {0, 2}, {{1, k.at}}, rounds, &v);
  std::printf("stall after the kill: %lld ms (PS_HEARTBEAT_TIMEOUT 3 s)\n",
              static_cast<long long>(v.stall_ms));
  // Partitions: an epoch before the kill has 3 parts (the ranks), one after it 2.
  std::map<int, std::vector<std::pair<int, int>>> parts;  // epoch -> (num_parts, index)
  for (int s : {0, 2}) {
    std::ifstream f(j.dir + "/w" + std::to_string(s) + ".parts");
    std::string e;
    for (int ep, n, i; f >> e >> ep >> n >> i;) parts[ep].push_back({n, i});
  }
  EXPECT_EQ(static_cast<int>(parts.size()), (rounds + epoch - 1) / epoch);
  int completed = 0, after = 0;
  while (std::filesystem::exists(j.dir + "/w1.r" + std::to_string(completed + 1))) ++completed;
  for (auto& [ep, got] : parts) {
    ASSERT_EQ(got.size(), 2u) << "epoch " << ep;
    EXPECT_EQ(got[0].first, got[1].first) << "epoch " << ep << ": workers disagree on the parts";
    EXPECT_NE(got[0].second, got[1].second) << "epoch " << ep << ": one part read twice";
    if (ep == 0) {
      EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{3, 0}, {3, 2}}));
    }
    // An epoch starting two rounds past the last one the victim completed: it was never
    // at that barrier, whose release counts it out. Before: either, whole.
    if (ep * epoch + 1 >= completed + 3) {
      EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{2, 0}, {2, 1}})) << "epoch " << ep;
      ++after;
    } else if (got[0].first == 3) {
      EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{3, 0}, {3, 2}})) << "epoch " << ep;
    } else {
      EXPECT_EQ(got, (std::vector<std::pair<int, int>>{{2, 0}, {2, 1}})) << "epoch " << ep;
    }
  }
  EXPECT_GE(after, 1) << "no epoch started after the kill; the victim completed " << completed;
  Cleanup(j);
}

// Worker 2 of 3 dies amid round 5: its pushes of keys 3 and 5 were summed, those of
// keys 7 and 9 never sent. Round 5 of keys 3 and 5 holds its push (3 pushes, unscaled),
// that of keys 7 and 9 closes without it (2 pushes, scaled by 3/2).
TEST(ElasticWorkers, DeathAmidAStep) {
  const int rounds = 10;
  Job j = Start("midstep", 3, 2, rounds, 0, 0, {"2", "5"});
  pid_t victim = WorkerPid(j, 2);
  ASSERT_GT(victim, 0) << ReadFile(j.log);
  const int64_t when = NowMs();
  ExpectFinished(j, {victim}, 20s);
  auto st = WaitExit(victim, 5s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(*st, 128 + SIGKILL);
  Verdict v;
  Check(j, {0, 1}, {{2, when}}, rounds, &v);
  ASSERT_EQ(v.sets.size(), static_cast<size_t>(rounds) + 1);
  EXPECT_EQ(v.sets[4], (std::vector<unsigned>{7, 7, 7, 7}));
  EXPECT_EQ(v.sets[5], (std::vector<unsigned>{7, 7, 3, 3}));
  EXPECT_EQ(v.sets[6], (std::vector<unsigned>{3, 3, 3, 3}));
  Cleanup(j);
}

// Two of four workers killed at random moments (seeded; the seed is printed): any rank,
// amid pushes, pulls or barriers.
TEST(ElasticWorkers, KillAtRandomMoments) {
  const unsigned seed = static_cast<unsigned>(NowMs());
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<int> ranks = {0, 1, 2, 3};
  std::shuffle(ranks.begin(), ranks.end(), rng);
  const int rounds = 40;
  Job j = Start("random", 4, 2, rounds, 7, 25);
  std::vector<pid_t> pids;
  for (int r = 0; r < 4; ++r) pids.push_back(WorkerPid(j, r));
  for (pid_t p : pids) ASSERT_GT(p, 0) << ReadFile(j.log);
  // The job is training once some worker finished round 2.
  ASSERT_TRUE(WaitFile(j.dir + "/w" + std::to_string(ranks[3]) + ".r2", 20s)) << ReadFile(j.log);
  std::map<int, int64_t> killed;
  std::set<pid_t> killed_pids;
  for (int n = 0; n < 2; ++n) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<>(0, 400)(rng)));
    ::kill(pids[static_cast<size_t>(ranks[static_cast<size_t>(n)])], SIGKILL);
    killed[ranks[static_cast<size_t>(n)]] = NowMs();
    killed_pids.insert(pids[static_cast<size_t>(ranks[static_cast<size_t>(n)])]);
  }
  ExpectFinished(j, killed_pids, 20s);
  std::vector<int> survivors = {ranks[2], ranks[3]};
  std::sort(survivors.begin(), survivors.end());
  Check(j, survivors, killed, rounds);
  Cleanup(j);
}

// Below PSKV_MIN_WORKERS the job fails, naming the setting, within the detection bound.
TEST(ElasticWorkers, BelowMinimumFails) {
  Job j = Start("minimum", 3, 3, 200, 0, 20);
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 2, 2, &k));
  const auto end = std::chrono::steady_clock::now() + 15s;
  for (pid_t p : j.procs) {
    if (p == k.pid) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    auto st = WaitExit(p, std::max(left, 1ms));
    ASSERT_TRUE(st.has_value()) << "pid " << p << " still running; log:\n" << ReadFile(j.log);
    EXPECT_NE(*st, 0) << "pid " << p;
  }
  EXPECT_NE(ReadFile(j.log).find("PSKV_MIN_WORKERS=3"), std::string::npos) << ReadFile(j.log);
  Cleanup(j);
}

// Under pskv-launch --min-workers 2: worker rank 1 killed after its round 3; the launcher
// reports the verdict, the job succeeds (exit status 0) and its weights are right.
TEST(ElasticWorkers, UnderTheLauncher) {
  const int rounds = 20;
  Job j = StartLaunched("launcher", rounds, 0);
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 3, &k));
  std::string log;
  ASSERT_NO_FATAL_FAILURE(ExpectLauncherSucceeds(j, 30s, &log));
  EXPECT_NE(log.find("the scheduler dropped it (PSKV_ELASTIC)"), std::string::npos) << log;
  EXPECT_NE(log.find("(workers dropped: PSKV_ELASTIC)"), std::string::npos) << log;
  Check(j, {0, 2}, {{1, k.at}}, rounds);
  Cleanup(j);
}

// Checks a job of 3 workers in which worker 1 was killed and a new process joined in
// its place (its files: `joiner`.*): from the first round of an epoch after the kill to
// the end, the newcomer's weights are the job's, and before its first round it pulled
// those of the round before; the rounds between the kill and the join hold the pushes
// of workers 0 and 2 (scaled by 3/2), those from the join on all three again; the
// epochs from the join on are dealt in 3 parts (the newcomer reads part 1); every
// element of every worker's final weights equals the reference from those sets.
void CheckJoined(const Job& j, const std::string& joiner, int rounds, int epoch, int64_t killed_at,
                 int64_t started_at) {
  const std::string log = ReadFile(j.log);
  std::vector<Line> ref = ReadLog(j.dir + "/w0.log");
  ASSERT_EQ(static_cast<int>(ref.size()), rounds) << log;
  EXPECT_EQ(ReadLog(j.dir + "/w2.log").size(), ref.size());
  for (auto& l : ReadLog(j.dir + "/w2.log"))
    EXPECT_EQ(l.v, ref[static_cast<size_t>(l.round - 1)].v);
  std::vector<std::vector<unsigned>> sets;
  ASSERT_NO_FATAL_FAILURE(Solve(ref, 3, &sets));
  std::vector<Line> joined = ReadLog(j.dir + "/" + joiner + ".log");
  ASSERT_FALSE(joined.empty()) << log;
  const int first = joined.front().round;
  int completed = 0;  // by the killed worker (a newcomer's markers start after a gap)
  while (std::filesystem::exists(j.dir + "/w1.r" + std::to_string(completed + 1))) ++completed;
  EXPECT_GT(first, completed + 1) << log;
  EXPECT_EQ((first - 1) % epoch, 0) << "joined amid an epoch";
  EXPECT_EQ(joined.back().round, rounds);
  EXPECT_EQ(static_cast<int>(joined.size()), rounds - first + 1);
  for (auto& l : joined) EXPECT_EQ(l.v, ref[static_cast<size_t>(l.round - 1)].v) << l.round;
  std::vector<Line> start = ReadLog(j.dir + "/" + joiner + ".start");
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0].round, first - 1);
  EXPECT_EQ(start[0].v, ref[static_cast<size_t>(first - 2)].v) << "the weights it pulled";
  // Who pushed: all three until the kill, 0 and 2 until the join (the round the kill
  // caught: either), all three again from the join on.
  for (int r = 1; r <= rounds; ++r)
    for (size_t k = 0; k < kKeys.size(); ++k) {
      const unsigned got = sets[static_cast<size_t>(r)][k];
      if (r <= completed || r >= first)
        EXPECT_EQ(got, 7u) << "round " << r << " key " << kKeys[k];
      else if (r == completed + 1)
        EXPECT_TRUE(got == 7u || got == 5u) << "round " << r << " key " << kKeys[k];
      else
        EXPECT_EQ(got, 5u) << "round " << r << " key " << kKeys[k];
    }
  for (const std::string& w : {std::string("w0"), std::string("w2"), joiner})
    CheckWeights(j.dir + "/" + w + ".weights", 3, sets);
  std::map<int, std::map<std::string, std::pair<int, int>>> parts;  // epoch -> worker -> part
  for (const std::string& w : {std::string("w0"), std::string("w2"), joiner}) {
    std::ifstream f(j.dir + "/" + w + ".parts");
    std::string e;
    for (int ep, n, i; f >> e >> ep >> n >> i;) parts[ep][w] = {n, i};
  }
  const int join_epoch = (first - 1) / epoch;
  EXPECT_EQ(static_cast<int>(parts.size()), rounds / epoch);
  // (The killed worker's parts file is not read: a restarted worker rewrote it.)
  for (auto& [ep, got] : parts) {
    std::set<int> idx, num;
    for (auto& [w, p] : got) {
      num.insert(p.first);
      idx.insert(p.second);
    }
    EXPECT_EQ(num.size(), 1u) << "epoch " << ep << ": workers disagree on the parts";
    EXPECT_EQ(idx.size(), got.size()) << "epoch " << ep << ": a part read twice";
    if (ep >= join_epoch) {
      EXPECT_EQ(got.size(), 3u) << "epoch " << ep;
      EXPECT_EQ(*num.begin(), 3) << "epoch " << ep;
      EXPECT_EQ(got[joiner], std::make_pair(3, 1)) << "epoch " << ep;
    } else {
      EXPECT_EQ(got.size(), 2u) << "epoch " << ep;
      if (*num.begin() == 2) {
        EXPECT_EQ(idx, (std::set<int>{0, 1})) << "epoch " << ep;
      }
    }
  }
  EXPECT_NE(log.find("joined the running job (PSKV_ELASTIC)"), std::string::npos) << log;
  std::printf(
      "killed after round %d; the replacement, started %lld ms after the kill, pushed "
      "from round %d (epoch %d); its first round ended %lld ms after its start; the "
      "first round with it ended %lld ms after the one before\n",
      completed, static_cast<long long>(started_at - killed_at), first, join_epoch,
      static_cast<long long>(joined.front().ms - started_at),
      static_cast<long long>(ref[static_cast<size_t>(first - 1)].ms -
                             ref[static_cast<size_t>(first - 2)].ms));
}

// Joining: worker 1 of 3 killed after its round 6, and a new worker process (the same
// program and environment, started by hand) joins the running job in its place at the
// workers' next epoch barrier (CheckJoined).
TEST(ElasticWorkers, ReplacementJoins) {
  const int rounds = 24, epoch = 4;
  Job j = Start("join", 3, 2, rounds, epoch, 30);
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 6, &k));
  ASSERT_TRUE(WaitExit(k.pid, 5s).has_value());
  const int64_t started_at = NowMs();
  j.procs.push_back(SpawnJoiner(j, rounds, epoch, "j"));
  ExpectFinished(j, {k.pid}, 30s);
  CheckJoined(j, "w1j", rounds, epoch, k.at, started_at);
  Cleanup(j);
}

// As ReplacementJoins, with PS_RESEND=1 (sequence numbers per peer, acknowledgements,
// in-order delivery): the newcomer is another process under the id of the one that
// left, so the scheduler's and the servers' numbering with that id starts afresh both
// ways. When they kept the dead process's numbers, the newcomer held the release of the
// epoch barrier that admitted it behind a gap that never filled (and the nodes took its
// messages, numbered from 1, for duplicates): it hung, and the job with it.
const std::map<std::string, std::string> kResend = {{"PS_RESEND", "1"},
                                                    {"PS_RESEND_TIMEOUT", "300"}};
TEST(ElasticWorkers, ReplacementJoinsWithResend) {
  const int rounds = 24, epoch = 4;
  Job j = Start("join_resend", 3, 2, rounds, epoch, 30, {}, kResend);
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 6, &k));
  ASSERT_TRUE(WaitExit(k.pid, 5s).has_value());
  const int64_t started_at = NowMs();
  j.procs.push_back(SpawnJoiner(j, rounds, epoch, "j", kResend));
  ExpectFinished(j, {k.pid}, 30s);
  CheckJoined(j, "w1j", rounds, epoch, k.at, started_at);
  Cleanup(j);
}

// With PS_RESEND=1, a frozen worker (SIGSTOP) is dropped and a newcomer joins in its
// place; once the newcomer pushed rounds of its own, the old process is resumed
// (SIGCONT) with its unacknowledged messages, numbered in the old sequence, still to
// resend. None of them may count as the newcomer's (they come on the old process's
// connection, which no longer names the id): the old process exits non-zero, the job
// ends, and every round from the join on is the sum of the three live workers' pushes
// (CheckJoined), bitwise.
TEST(ElasticWorkers, ResumedWorkerAfterItsReplacementWithResend) {
  const int rounds = 32, epoch = 4;
  Job j = Start("resumed_resend", 3, 2, rounds, epoch, 30, {}, kResend);
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 6, &k, SIGSTOP));
  // The newcomer asks to join at once: it is seated at the first epoch barrier after
  // the scheduler dropped the frozen one (heartbeat timeout, 3 s).
  const int64_t started_at = NowMs();
  j.procs.push_back(SpawnJoiner(j, rounds, epoch, "j", kResend));
  // The newcomer pushed two rounds: resume the old process.
  bool pushed = false;
  for (int i = 0; i < 600 && !pushed; ++i) {
    std::this_thread::sleep_for(50ms);
    pushed = ReadLog(j.dir + "/w1j.log").size() >= 2;
  }
  ::kill(k.pid, SIGCONT);
  ASSERT_TRUE(pushed) << ReadFile(j.log);
  auto st = WaitExit(k.pid, 20s);
  ASSERT_TRUE(st.has_value()) << ReadFile(j.log);
  EXPECT_NE(*st, 0);
  ExpectFinished(j, {k.pid}, 30s);
  const std::string log = ReadFile(j.log);
  EXPECT_NE(log.find("dropped from the job by the scheduler"), std::string::npos) << log;
  CheckJoined(j, "w1j", rounds, epoch, k.at, started_at);
  Cleanup(j);
}

// A worker that asks to join while no worker left is refused with a typed error saying
// why; the job is not disturbed.
TEST(ElasticWorkers, JoinWithoutAPlaceIsRefused) {
  const int rounds = 16;
  Job j = Start("noplace", 2, 1, rounds, 4, 30);
  ASSERT_TRUE(WaitFile(j.dir + "/w0.r2", 20s)) << ReadFile(j.log);
  const pid_t extra =
      Spawn({ELASTIC_WORKER, std::to_string(rounds), j.dir, "4", "30", "-1", "-1", "x"},
            Env(j.port, "worker", 2, 1), j.log);
  auto st = WaitExit(extra, 20s);
  ASSERT_TRUE(st.has_value()) << ReadFile(j.log);
  EXPECT_EQ(*st, 1);
  ExpectFinished(j, {}, 30s);
  const std::string log = ReadFile(j.log);
  EXPECT_NE(log.find("was refused by the scheduler"), std::string::npos) << log;
  EXPECT_NE(log.find("a worker joins in place of one that left"), std::string::npos) << log;
  Check(j, {0, 1}, {}, rounds);
  Cleanup(j);
}

// Under pskv-launch --min-workers 2 --restart-workers 1: worker 1 killed after its round
// 6 is started again by the launcher (the same command, rank 1) and joins the running
// job (CheckJoined); the job succeeds, the summary says so.
TEST(ElasticWorkers, RestartedUnderTheLauncher) {
  const int rounds = 24, epoch = 4;
  Job j = StartLaunched("restart", rounds, epoch, {"--restart-workers", "1"});
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 6, &k));
  std::string log;
  ASSERT_NO_FATAL_FAILURE(ExpectLauncherSucceeds(j, 60s, &log));
  EXPECT_NE(log.find("started again"), std::string::npos) << log;
  EXPECT_NE(log.find("worker 1 started again"), std::string::npos) << log;
  CheckJoined(j, "w1", rounds, epoch, k.at, k.at);
  Cleanup(j);
}

// The standby scheduler follows the workers that leave and join (pskv-launch starts one
// by default): worker 1 killed after its round 6 is started again and joins; once it
// pushed a few rounds, the scheduler is killed too. The standby, whose table names the
// joined process (not the dead one), takes over: the newcomer follows it, and the job
// ends as in RestartedUnderTheLauncher (CheckJoined). Before the standby followed
// kWorkerJoined it sent its takeover to the dead process's address: the newcomer never
// heard of it and failed.
TEST(ElasticWorkers, SchedulerDiesAfterAWorkerLeftAndJoined) {
  const int rounds = 40, epoch = 4;
  const std::string tag = "PSKV_TEST_TAG=elastic-sched-" + std::to_string(::getpid());
  Job j = StartLaunched("sched_dies", rounds, epoch, {"--restart-workers", "1", "--env", tag});
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 6, &k));
  // The restarted worker 1 pushed rounds of its own: kill the scheduler.
  ASSERT_TRUE(WaitFile(j.dir + "/w1.r16", 30s)) << ReadFile(j.log);
  ASSERT_FALSE(std::filesystem::exists(j.dir + "/w0.r" + std::to_string(rounds)))
      << "the job ended before the scheduler's kill";
  std::vector<pid_t> scheds = PidsWithEnv("DMLC_ROLE=scheduler"), ours = PidsWithEnv(tag),
                     standbys = PidsWithEnv("PSKV_STANDBY=1"), primary;
  for (pid_t p : ours)
    if (std::count(scheds.begin(), scheds.end(), p) &&
        !std::count(standbys.begin(), standbys.end(), p))
      primary.push_back(p);
  ASSERT_EQ(primary.size(), 1u) << ReadFile(j.log);
  ::kill(primary[0], SIGKILL);
  std::string log;
  ASSERT_NO_FATAL_FAILURE(ExpectLauncherSucceeds(j, 60s, &log));
  EXPECT_NE(log.find("worker 1 started again"), std::string::npos) << log;
  EXPECT_NE(log.find("the standby scheduler takes over and the job goes on"), std::string::npos)
      << log;
  EXPECT_NE(log.find("every node rejoined"), std::string::npos) << log;
  CheckJoined(j, "w1", rounds, epoch, k.at, k.at);
  Cleanup(j);
}

// A frozen worker (SIGSTOP: no closed port) is dropped after PS_HEARTBEAT_TIMEOUT (3 s
// here) + PS_HEARTBEAT_INTERVAL: the survivors' round that waited for it ends that much
// later (measured); resumed (SIGCONT), it learns it was dropped and exits non-zero
// without disturbing the job, whose weights are the reference's.
TEST(ElasticWorkers, FrozenWorkerIsDropped) {
  const int rounds = 30;
  Job j = Start("frozen", 3, 2, rounds, 0, 30);
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 6, &k, SIGSTOP));
  // Resumed once the survivors went on (two rounds after the drop).
  std::vector<Line> seen;
  for (int i = 0; i < 300 && seen.size() < 12; ++i) {
    std::this_thread::sleep_for(50ms);
    seen = ReadLog(j.dir + "/w0.log");
  }
  ::kill(k.pid, SIGCONT);
  auto st = WaitExit(k.pid, 15s);
  ASSERT_TRUE(st.has_value()) << ReadFile(j.log);
  EXPECT_NE(*st, 0);
  ExpectFinished(j, {k.pid}, 30s);
  const std::string log = ReadFile(j.log);
  EXPECT_NE(log.find("dropped from the job by the scheduler"), std::string::npos) << log;
  Verdict v;
  Check(j, {0, 2}, {{1, k.at}}, rounds, &v);
  std::printf(
      "frozen worker: the survivors' longest round after the freeze took %lld ms "
      "(PS_HEARTBEAT_TIMEOUT 3 s + PS_HEARTBEAT_INTERVAL 0.5 s)\n",
      static_cast<long long>(v.stall_ms));
  EXPECT_GE(v.stall_ms, 2000) << "dropped long before the heartbeat timeout";
  EXPECT_LT(v.stall_ms, 15000);
  Cleanup(j);
}

// Elastic workers with replicated servers (PSKV_REPLICAS=1): worker 1 killed after its
// round 5, then server 0 after the survivors' round 14, so the rest of the job reads
// the replicas the primaries kept: the primaries scaled the short rounds before copying
// them, so the copies agree and every element of the final weights is the reference's.
TEST(ElasticWorkers, WithReplicatedServers) {
  const int rounds = 24;
  Job j = Start("replicas", 3, 2, rounds, 4, 30, {}, {{"PSKV_REPLICAS", "1"}});
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 5, &k));
  ASSERT_TRUE(WaitFile(j.dir + "/w0.r14", 30s)) << ReadFile(j.log);
  const pid_t server0 = j.procs[1];  // the first server started (its rank is either)
  ::kill(server0, SIGKILL);
  ExpectFinished(j, {k.pid, server0}, 40s);
  const std::string log = ReadFile(j.log);
  EXPECT_NE(log.find("continue on their replicas"), std::string::npos) << log;
  Check(j, {0, 2}, {{1, k.at}}, rounds);
  Cleanup(j);
}

// A worker must prove it belongs to the job to join it, as any node: one with another
// PSKV_JOB_SECRET is refused at the transport's handshake and exits non-zero; the job
// goes on with the workers left (no round holds a push of rank 1 after the kill), and
// the replacement with the job's secret then joins.
TEST(ElasticWorkers, JoinNeedsTheJobSecret) {
  const int rounds = 24, epoch = 4;
  Job j = Start("secret", 3, 2, rounds, epoch, 30, {},
                {{"PSKV_JOB_SECRET", "the-job-secret-0123456789abcdef"}});
  Killed k;
  ASSERT_NO_FATAL_FAILURE(KillWorkerAfter(j, 1, 6, &k));
  const pid_t impostor =
      SpawnJoiner(j, rounds, epoch, "x", {{"PSKV_JOB_SECRET", "another-secret-0123456789abcdef"}});
  auto st = WaitExit(impostor, 20s);
  ASSERT_TRUE(st.has_value()) << ReadFile(j.log);
  EXPECT_NE(*st, 0);
  EXPECT_FALSE(std::filesystem::exists(j.dir + "/w1x.log"));
  const int64_t started_at = NowMs();
  j.procs.push_back(
      SpawnJoiner(j, rounds, epoch, "j", {{"PSKV_JOB_SECRET", "the-job-secret-0123456789abcdef"}}));
  ExpectFinished(j, {k.pid}, 30s);
  CheckJoined(j, "w1j", rounds, epoch, k.at, started_at);
  Cleanup(j);
}
