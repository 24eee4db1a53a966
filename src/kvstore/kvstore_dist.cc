// The factory of the dist stores and the server-role entry point. The store itself is
// dist::DistWorkerStore (kvstore/distributed/worker/store.h) with this CPU's local reducer.
#include "kvstore/kvstore_dist.h"

#include <dlfcn.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "common/env_table.h"
#include "common/logging.h"
#include "kvstore/distributed/server/role_main.h"
#include "kvstore/distributed/worker/store.h"
#include "pskv/error.h"
#include "pskv/process.h"

namespace pskv {
namespace {

std::string Quoted(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./=:,+@%") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The pskv-launch beside this library: build/ (build/libpskv.so) or the Python
// package's bin/ (pskv/libpskv.so.0, pskv/bin/pskv-launch); else the one in PATH.
std::string LauncherPath() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&Quoted), &info) && info.dli_fname) {
    std::string dir = info.dli_fname;
    dir = dir.find('/') == std::string::npos ? "." : dir.substr(0, dir.rfind('/'));
    for (const char* rel : {"/pskv-launch", "/bin/pskv-launch"})
      if (::access((dir + rel).c_str(), X_OK) == 0) return dir + rel;
  }
  return "pskv-launch";
}

// This program's own command line under the launcher, ready to paste: "pskv-launch -n 2
// -s 1 -- /usr/bin/python3 train.py --lr 0.1" (with the PYTHONPATH it was given).
std::string LaunchCommand() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string cmd;
  for (size_t i = 0; i < all.size();) {
    size_t j = all.find('\0', i);
    if (j == std::string::npos) j = all.size();
    cmd += " " + Quoted(all.substr(i, j - i));
    i = j + 1;
  }
  if (cmd.empty()) cmd = " PROGRAM";
  const char* pypath = EnvValue("PYTHONPATH");
  return std::string(pypath && *pypath ? "PYTHONPATH=" + Quoted(pypath) + " " : "") +
         LauncherPath() + " -n 2 -s 1 --" + cmd;
}

}  // namespace

std::optional<int> RunServerRoleIfAsked(const Options& options) {
  if (!options.role_set || options.role == Role::kWorker) return std::nullopt;
  options.ValidateForDistributed();
  // The process becomes this server or scheduler: the program asked, so the
  // process-wide settings are made here (kvstore.h).
  try {
    ConfigureProcess(options);
  } catch (const std::exception& e) {
    PSKV_ERROR("the job failed: " << e.what());
    return 1;
  }
  return RunServerOrScheduler(options);
}

std::optional<int> RunServerRoleIfAsked() {
  return RunServerRoleIfAsked(Options::FromEnv());
}

std::unique_ptr<KVStore> CreateDistKVStore(const std::string& type, const Options& options) {
  if (!options.role_set)
    throw ConfigError("kvstore type '" + type +
                      "' needs DMLC_ROLE (scheduler, server or worker) and "
                      "the other DMLC_* variables; start the job with pskv-launch, e.g. 2 "
                      "workers and 1 server on this machine: " +
                      LaunchCommand());
  if (options.role != Role::kWorker)
    throw UsageError("KVStore::Create('" + type +
                     "') in a process with DMLC_ROLE=" + RoleName(options.role) +
                     ": servers and the scheduler do not create stores. Start them with "
                     "pskv-server (pskv-launch does), or begin main with `if (auto rc = "
                     "pskv::RunServerRoleIfAsked()) return *rc;`");
  options.ValidateForDistributed();
  // No process-wide setting changes here (pskv/process.h): PSKV_LOG_LEVEL,
  // PSKV_TIMELINE and PSKV_METRICS_* are the program's, through ConfigureProcess.
  return std::make_unique<dist::DistWorkerStore>(
      type, options,
      std::make_unique<dist::CpuLocalReducer>(options.bigarray_bound, options.reduction_threads));
}

}  // namespace pskv
