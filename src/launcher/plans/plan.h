// How each cluster type starts a job's processes: one file per type in this folder,
// each one entry of the table ClusterTypes() (plan.cc), which also lists the valid
// --launcher values. MakePlan (launcher.h) builds the PlanContext every type shares,
// adds the scheduler (always next to the launcher) and calls the type's `plan`.
//
// Each type also decides how its processes' status records reach the launcher
// (ChildSpec::status; docs/design.md, "Status channel").
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "launcher/launcher.h"

namespace pskv::launcher {

using Env = std::map<std::string, std::string>;

struct PlanContext {
  const LaunchConfig& cfg;
  std::string job_id;
  /// What every process gets: scheduler address, job size, job id, cluster type,
  /// --env, and the job secret.
  Env common;
  /// pskv-server next to the launcher if it is there, else "pskv-server" (PATH).
  std::string server_bin;
  /// What the servers and the scheduler run (pskv-server or --server-command).
  std::vector<std::string> server_argv;

  /// `common` plus the role, the task id (when >= 0) and --env-server / --env-worker.
  Env RoleEnv(const std::string& role, int task) const;
};

struct ClusterType {
  const char* name;
  /// Adds the servers and the workers (children and files) to `plan`; null for a type
  /// Launch handles itself (kubernetes: manifests, no supervision).
  void (*plan)(const PlanContext& ctx, Plan& plan);
};

/// Every --launcher value, in the order --help lists them.
std::span<const ClusterType> ClusterTypes();

void PlanLocal(const PlanContext& ctx, Plan& plan);
void PlanSsh(const PlanContext& ctx, Plan& plan);
void PlanMpi(const PlanContext& ctx, Plan& plan);
void PlanSlurm(const PlanContext& ctx, Plan& plan);
void PlanSge(const PlanContext& ctx, Plan& plan);
void PlanYarn(const PlanContext& ctx, Plan& plan);

/// `count` processes of one role started by one command (MPI and batch systems).
struct Group {
  std::string role;
  int count = 0;
  /// A server started by a command of its own (Servers::kSeparate): its index, 0..S-1,
  /// then the spare servers (its rank hint DMLC_TASK_ID, and PSKV_SPARE_SERVER for a
  /// spare, are in `env`); -1: a group of `count` processes.
  int index = -1;
  /// Their environment, without the job secret: values reach the batch system through
  /// the environment of the command that submits (mpirun -x NAME, srun --export=ALL,
  /// qsub -V), never through its argv; PlanGroups sets the secret only there.
  Env env;
  std::vector<std::string> prog;  ///< what each process runs
};
/// How PlanGroups starts the servers.
enum class Servers {
  /// One command for all of them ("servers"): the system reports only that command's
  /// exit, so a replicated job cannot go on without one of them (sge, yarn).
  kGrouped,
  /// One command per server ("server 0", ..., the spares last): each is its own
  /// process group for the system (one mpirun, one srun step), so one's death ends
  /// only its own command and a replicated job survives it as under the local
  /// launcher (mpi, slurm; docs/fault-tolerance.md, "The launcher").
  kSeparate,
};
/// Adds the servers (as `servers` says) and the "workers" children, each running
/// `command(group)` (which may change the group's env and add files), with status
/// records via `status`.
void PlanGroups(const PlanContext& ctx, Plan& plan, StatusVia status, Servers servers,
                const std::function<std::vector<std::string>(Group&, Plan&)>& command);

/// The spec of a fresh standby scheduler that follows `active`, the job's scheduler (a
/// standby that took over: its PSKV_SCHEDULER_STANDBY is its address; the first
/// scheduler: DMLC_PS_ROOT_*), bound at a new free port of the same host; named
/// "standby scheduler `number`".
ChildSpec NextStandby(const ChildSpec& active, int number);

/// argv as one shell word list ("a 'b c'").
std::string JoinQuoted(const std::vector<std::string>& argv);
/// Each K=V of `env` as two words: `flag`, `K=V`.
std::vector<std::string> EnvFlags(const Env& env, const std::string& flag);

}  // namespace pskv::launcher
