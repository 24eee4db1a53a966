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
};
Plan MakePlan(const LaunchConfig& cfg, const std::string& job_id);

/// Runs the job; returns the launcher's exit status.
int Launch(const LaunchConfig& cfg);

/// Quotes `s` for a POSIX shell.
std::string ShellQuote(const std::string& s);

}  // namespace pskv::launcher
