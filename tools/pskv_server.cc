// pskv-server: runs the scheduler or a server of a pskv job, configured by the
// DMLC_* environment (pskv-launch starts it; no user code is needed).
#include <cstdio>
#include <cstring>

#include "pskv/error.h"
#include "pskv/kvstore.h"
#include "pskv/options.h"
#include "pskv/tuning.h"

int main(int argc, char** argv) {
  pskv::TuneAllocatorForLargeMessages();
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf(
        "usage: DMLC_ROLE=server|scheduler DMLC_PS_ROOT_URI=HOST DMLC_PS_ROOT_PORT=PORT \\\n"
        "       DMLC_NUM_SERVER=S DMLC_NUM_WORKER=N pskv-server\n"
        "Runs the scheduler or one server of a pskv job until the job ends. Exit status 0 when\n"
        "the job ended cleanly, 1 when it failed (the reason is printed), 2 on bad "
        "configuration.\n");
    return 0;
  }
  try {
    pskv::Options o = pskv::Options::FromEnv();
    if (!o.role_set || o.role == pskv::Role::kWorker) {
      std::fprintf(stderr,
                   "pskv-server: set DMLC_ROLE to 'server' or 'scheduler' (workers run your "
                   "training program)\n");
      return 2;
    }
    return *pskv::RunServerRoleIfAsked(o);  // a server or scheduler: it has a value
  } catch (const pskv::Error& e) {
    std::fprintf(stderr, "pskv-server: %s\n", e.what());
    return 2;
  }
}
