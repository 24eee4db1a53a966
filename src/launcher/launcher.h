// pskv-launch: builds the processes of a job for a cluster type and supervises them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/process.h"

namespace pskv::launcher {

struct LaunchConfig {
  int num_workers = 0;
  int num_servers = -1;  ///< -1: same as num_workers (MXNet's default)
  std::string hostfile;
  std::string launcher;  ///< local, ssh, mpi, slurm, sge, yarn ("" = local without hostfile)
  std::string sync_dst_dir;
  std::vector<std::pair<std::string, std::string>> env, env_server, env_worker;
  std::string server_command;  ///< shell command for servers/scheduler; "" = pskv-server
  std::vector<std::string> ssh_args;
  bool dry_run = false;
  /// --no-secret: run in MXNet's open mode (no job secret; anyone who can reach the
  /// ports can join). Default: a fresh random secret per job (docs/security.md).
  bool no_secret = false;
  /// The job secret (filled by Launch: from PSKV_JOB_SECRET / PSKV_JOB_SECRET_FILE
  /// of the launcher's environment, else generated).
  std::string job_secret;
  int timeout_s = 0;
  std::vector<std::string> command;

  // Filled from the launcher's own environment by ParseArgs (the launcher's one
  // place that reads it): scheduler address and what to forward to remote hosts.
  std::string root_uri;
  int root_port = 0;
  std::map<std::string, std::string> forward_env;
  std::string self_dir;  ///< directory of the pskv-launch binary
};

/// Parses the command line; throws pskv::InvalidArgument with a usage hint.
LaunchConfig ParseArgs(int argc, char** argv);
std::string Usage();

/// The processes to start (scheduler first) and, for batch systems, the files to
/// write. Pure: used by --dry-run and by the tests of the generated commands.
struct Plan {
  std::vector<ChildSpec> children;
  std::map<std::string, std::string> files;  ///< path -> content (written before start)
  std::vector<std::string> remove_at_exit;   ///< files removed when the job ends (secrets)
};
Plan MakePlan(const LaunchConfig& cfg, const std::string& job_id);

/// Runs the job; returns the launcher's exit status.
int Launch(const LaunchConfig& cfg);

/// Environment variables whose values are never printed (--dry-run, logs).
bool IsSecretVar(const std::string& name);

/// Quotes `s` for a POSIX shell.
std::string ShellQuote(const std::string& s);

}  // namespace pskv::launcher
