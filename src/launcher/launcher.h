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
  /// --spare-servers: server processes besides num_servers that take over the copies
  /// of a dead server's key ranges (PSKV_SPARE_SERVERS; docs/fault-tolerance.md).
  int spare_servers = 0;
  /// --min-workers: elastic workers (PSKV_ELASTIC=1, PSKV_MIN_WORKERS): a worker's
  /// death does not end the job while this many are left (docs/fault-tolerance.md,
  /// "Elastic workers"). 0: strict (a worker's death ends the job).
  int min_workers = 0;
  /// Filled by ParseArgs: --min-workers, or PSKV_ELASTIC=1 in the job's environment.
  bool elastic = false;
  /// --restart-workers: with elastic workers, a worker the scheduler dropped is started
  /// again (the same command and rank), at most this many times in all; it joins the
  /// running job at the workers' next epoch barrier (docs/fault-tolerance.md).
  int restart_workers = 0;
  /// A second scheduler process next to the scheduler that takes over when it dies
  /// (PSKV_SCHEDULER_STANDBY; docs/fault-tolerance.md, "The scheduler"); after a
  /// takeover the launcher starts a fresh one (NextStandby). On by default (not with
  /// kubernetes); --no-standby-scheduler turns it off.
  bool standby_scheduler = true;
  bool standby_asked = false;  ///< --standby-scheduler given explicitly
  /// -H: a host file (`host[:ssh_port] [slots=N]` lines) or a list host1:4,host2:4.
  std::string hosts;
  int ssh_port = 22;     ///< for hosts that name no port
  std::string launcher;  ///< local, ssh, mpi, slurm, sge, yarn, kubernetes ("" = local without -H)
  std::string sync_dst_dir;
  std::vector<std::pair<std::string, std::string>> env, env_server, env_worker;
  std::string server_command;  ///< shell command for servers/scheduler; "" = pskv-server
  /// --remote-server (ssh): path of pskv-server on the remote hosts. "" = with
  /// --sync-dst-dir the copy synced into DIR/.pskv/, else the launcher's own
  /// pskv-server path when it exists on the host, else pskv-server in its PATH.
  std::string remote_server;
  std::vector<std::string> ssh_args;
  bool dry_run = false;
  /// --no-secret: run in MXNet's open mode (no job secret; anyone who can reach the
  /// ports can join). Default: a fresh random secret per job (docs/security.md).
  bool no_secret = false;
  /// The job secret (filled by Launch: from PSKV_JOB_SECRET / PSKV_JOB_SECRET_FILE
  /// of the launcher's environment, else generated).
  std::string job_secret;
  int timeout_s = 0;
  std::string log_dir;     ///< --log-dir: one log file per process (and the launcher's)
  bool timestamps = true;  ///< prefix forwarded lines with the time
  std::vector<std::string> command;

  // --launcher kubernetes (see plans/kubernetes.h)
  std::string k8s_image, k8s_namespace = "default", k8s_job_name, k8s_kind = "job";
  std::string k8s_cpu, k8s_memory;
  bool k8s_apply = false;

  // Filled from the launcher's own environment by ParseArgs (the launcher's one
  // place that reads it): scheduler address and what to forward to remote hosts.
  std::string root_uri;
  int root_port = 0;
  std::map<std::string, std::string> forward_env;
  std::string self_dir;  ///< directory of the pskv-launch binary
  std::string pskv_lib;  ///< libpskv.so.0 this launcher runs with ("" if linked statically)
};

/// --help and --version: print `text` to stdout and exit with `status`.
struct EarlyExit {
  int status = 0;
  std::string text;
};

/// Parses the command line (CLI11: `--opt value`, `--opt=value`, `-n4`, `--`);
/// throws pskv::InvalidArgument with a usage hint, or EarlyExit.
LaunchConfig ParseArgs(int argc, char** argv);
std::string Usage();
std::string Version();

/// The processes to start (scheduler first) and, for batch systems, the files to
/// write. Pure: used by --dry-run and by the tests of the generated commands.
struct Plan {
  std::vector<ChildSpec> children;
  /// path -> content, written before start and removed when the job ends ("#prelude":
  /// a command run before the job instead).
  std::map<std::string, std::string> files;
  std::vector<std::string> secret_files;  ///< files of `files` --dry-run prints as <secret>
};
Plan MakePlan(const LaunchConfig& cfg, const std::string& job_id);

/// Runs the job; returns the launcher's exit status.
int Launch(const LaunchConfig& cfg);

/// Environment variables whose values are never printed (--dry-run, logs).
bool IsSecretVar(const std::string& name);

/// Quotes `s` for a POSIX shell.
std::string ShellQuote(const std::string& s);

}  // namespace pskv::launcher
