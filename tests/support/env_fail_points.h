// The fail points (src/ps/fail_points.h) of the processes tests start, driven by their
// PSKV_TEST_* environment variables: pskv-test-server (tests/support/test_server.cc)
// and the test workers install them in main. The library never reads these variables
// and never exits a process; here a point may end it with status 137, as if killed.
//
//   PSKV_TEST_REPLY_DELAY=ms           a dist server sleeps this long before handling each
//                                      data request (replies then arrive after a timeout)
//   PSKV_TEST_DUPLICATE_REPLIES=1      a server sends every data reply twice
//   PSKV_TEST_BOGUS_CREDITS=1          with every send-window credit a node also sends one
//                                      for far more messages than it received
//   PSKV_TEST_COPY_HOLD_CHANGES=n      a spare installs a copy of a key range only once it
//                                      holds n changes of the range that followed the copy
//   PSKV_TEST_EXIT_AT_START=1          a server exits when its node table arrived, before
//                                      the job's start barrier
//   PSKV_TEST_EXIT_AFTER_REPLICATED_ROUNDS=n
//                                      a primary exits when its replicas acknowledged n
//                                      sync rounds of one key range, before any push of
//                                      the n-th is answered
//   PSKV_TEST_EXIT_AFTER_FORWARDED_INITS=n
//                                      a primary exits when its replicas acknowledged the
//                                      n-th init of one key range it forwarded, before that
//                                      init is answered
//   PSKV_TEST_EXIT_BEFORE_DELEGATED_ANSWER=n
//                                      a replica acknowledges the n-th replicated round (of
//                                      one key range) whose primary left it answers to
//                                      workers on its host, waits 300 ms (the
//                                      acknowledgement reaches the primary) and exits
//                                      without answering them
//   PSKV_TEST_HOLD_REPLICATION_ROUND=n a primary chooses the replicas of each key's sync
//                                      round n as always, but sends the round to them only
//                                      once its range table changed from the first (at most
//                                      10 s later, from a thread of its own): a server
//                                      killed meanwhile is one of the chosen replicas
//   PSKV_TEST_EXIT_AMID_REPLICATION=n  a server sends its n-th replicated change that has
//                                      two or more targets to the first of them only, and
//                                      exits when that one acknowledged it; -n: to the last
//                                      target only
//   PSKV_TEST_CUT_SCHEDULER_AFTER=ms   a standby scheduler drops every message it sends to
//                                      the scheduler from ms after its node table arrived
//                                      (its link to the scheduler cut, the nodes' not)
// 0 (or unset) turns a point off. A malformed value is a pskv::ConfigError.
#pragma once

#include <memory>

#include "ps/fail_points.h"

namespace pskv::test {

/// The fail points of `node` from this process's PSKV_TEST_* variables.
std::unique_ptr<FailPoints> EnvFailPoints(const Node& node);

/// Every node this process makes gets EnvFailPoints (InstallFailPoints); reads the
/// variables once now, so that a malformed one fails here.
void InstallEnvFailPoints();

}  // namespace pskv::test
