// Optimizer states with replicated servers (docs/fault-tolerance.md): a states load
// reaches every copy of a range, a save after a failover reads the promoted ranges,
// and a server killed during a save leaves the job going. Real processes over real
// ZeroMQ (tests/support/replica_job.h; states_failover_worker.cc: Adam with weight
// decay and a schedule, a small key and a key sliced over both servers).
//
// Job A trains rounds 1-4 and saves its weights and states; job B starts from them
// (rank 0 loads the states), trains rounds 5-8 and saves the states after every
// round. With a server killed after the load, B's final weights and states file must
// be bitwise-equal to the undisturbed B's: a replica that missed the load would
// continue with fresh Adam moments, and a save that read only the surviving
// server's own range would fail.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/replica_job.h"

using namespace pskv::test;

namespace {

ReplicaJobSpec Spec(const std::string& name, int first, const std::string& from,
                    int reply_delay_ms = 0) {
  ReplicaJobSpec s;
  s.name = name;
  s.server = PSKV_SERVER;
  s.worker = {STATES_FAILOVER_WORKER, "4", std::to_string(first)};
  if (!from.empty()) s.worker.push_back(from);
  s.reply_delay_ms = reply_delay_ms;
  s.collect = {"states"};
  return s;
}

// Job A's weights and states, as job B's starting point.
const std::string& FromDir() {
  static const std::string dir = [] {
    const std::string d = (std::filesystem::temp_directory_path() /
                           ("pskv_states_from_" + std::to_string(::getpid())))
                              .string();
    std::filesystem::create_directories(d);
    auto r = RunReplicaJob(Spec("states_a", 1, ""));
    EXPECT_EQ(r.weights.size(), 2u);
    if (r.weights.size() == 2) {
      std::ofstream(d + "/w0.weights", std::ios::binary) << r.weights[0];
      std::ofstream(d + "/states", std::ios::binary) << r.files["states"];
    }
    return d;
  }();
  return dir;
}

const ReplicaJobResult& Undisturbed() {
  static const ReplicaJobResult r = RunReplicaJob(Spec("states_b", 5, FromDir()));
  return r;
}

void ExpectSameAsUndisturbed(const ReplicaJobResult& got, const std::string& what) {
  const auto& want = Undisturbed();
  ASSERT_EQ(want.weights.size(), 2u);
  ASSERT_FALSE(want.files.at("states").empty());
  ASSERT_EQ(got.weights.size(), 2u) << what;
  for (size_t w = 0; w < 2; ++w)
    EXPECT_TRUE(got.weights[w] == want.weights[w])
        << what << ": worker " << w << "'s final weights differ from the undisturbed job's";
  EXPECT_TRUE(got.files.at("states") == want.files.at("states"))
      << what << ": the last states file differs from the undisturbed job's";
}

}  // namespace

// A server killed after the load (between rounds): the promoted copy has the loaded
// states, and the saves after the failover read both ranges.
TEST(FailoverStates, LoadReachesEveryCopyAndSavesReadPromotedRanges) {
  for (int victim : {0, 1})
    ExpectSameAsUndisturbed(
        RunReplicaJob(Spec("states_kill" + std::to_string(victim), 5, FromDir()), victim, "w0.r5"),
        "server " + std::to_string(victim) + " killed after round 5");
}

// A server killed while rank 0 saves round 6's states (30 ms per request in the
// servers: the kill lands in the save's size command or its pulls): the save is
// finished (or done again) against the new primaries and the job goes on.
TEST(FailoverStates, KillDuringSaveLeavesTheJobGoing) {
  for (int victim : {0, 1})
    ExpectSameAsUndisturbed(
        RunReplicaJob(Spec("states_save" + std::to_string(victim), 5, FromDir(), 30), victim,
                      "w0.s6"),
        "server " + std::to_string(victim) + " killed during a save");
}
