// Optimizer states far over the 64 MiB command-reply cap: Adam on 100M parameters
// sliced over 2 servers (~800 MB of states), saved, loaded by rank 0 alone, saved
// again. Labelled "big": needs ~6 GB of memory; exclude it from sanitizer runs
// (ctest -LE big).
#include <gtest/gtest.h>

#include "support/job.h"

using namespace pskv::test;
using namespace std::chrono_literals;

TEST(BigStates, Adam100MParametersOverTwoServers) {
  Spec s;
  s.scenario = "big_states";
  s.workers = 2;
  s.servers = 2;
  s.env = {{"MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"},
           {"PSKV_TEST_STATES_FILE", (std::filesystem::temp_directory_path() /
                                      ("pskv_big_states_" + std::to_string(::getpid())))
                                         .string()},
           {"PSKV_TIMEOUT", "120"}};
  s.bound = 280s;
  Result r = RunJob(s);
  ExpectWorkersPassed(r);
  for (int st : r.others) EXPECT_EQ(st, 0) << r.log;
}
