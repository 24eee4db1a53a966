// pskv-test-server: pskv-server (tools/pskv_server.cc) with the fail points of
// tests/support/env_fail_points.h installed, so that a test can make the scheduler or a
// server it starts misbehave or die with PSKV_TEST_* variables. The tests that set
// them start this program instead of pskv-server (pskv-launch --server-command, or as
// PSKV_SERVER of a test job); production's pskv-server has no such points.
#include <cstdio>

#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/options.h"
#include "pskv/tuning.h"
#include "support/env_fail_points.h"

int main() {
  pskv::TuneAllocatorForLargeMessages();
  try {
    pskv::test::InstallEnvFailPoints();
    pskv::Options o = pskv::Options::FromEnv();
    if (!o.role_set || o.role == pskv::Role::kWorker) {
      std::fprintf(stderr, "pskv-test-server: set DMLC_ROLE to 'server' or 'scheduler'\n");
      return 2;
    }
    return *pskv::RunServerRoleIfAsked(o);
  } catch (const pskv::Error& e) {
    std::fprintf(stderr, "pskv-test-server: %s\n", e.what());
    return 2;
  }
}
