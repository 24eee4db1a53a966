// pskv-launch's command line and the launcher's own environment (launcher.h).
#include "launcher/launcher.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>

#include <CLI/CLI.hpp>

#include "common/env_table.h"
#include "common/net.h"
#include "launcher/hosts.h"
#include "launcher/plans/plan.h"
#include "pskv/error.h"

namespace pskv::launcher {

namespace {

std::pair<std::string, std::string> ParseKV(const std::string& opt, const std::string& s) {
  auto eq = s.find('=');
  if (eq == std::string::npos) eq = s.find(':');
  if (eq == std::string::npos || eq == 0)
    throw InvalidArgument(opt + " needs K=V, got '" + s + "'");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

const char* const kDescription =
    R"(Starts one scheduler, S servers and N workers of a pskv job. Workers run COMMAND (its
arguments are passed exactly as given); the scheduler and servers run the built-in
pskv-server. Every output line is prefixed with the time and the process's role and rank.)";

const char* const kFooter =
    R"(Hosts (-H): a list `host1:4,host2:4` (horovodrun's syntax: 4 slots each) or a host
file with lines `host[:ssh_port] [slots=N]`. Workers fill the slots host by host (rank
0 first); servers are spread round-robin and take no slots. Without any slots, servers
and workers go round-robin over the hosts. A lone `-H NAME` that is no existing file is
an error unless NAME is an IPv4 address or localhost: write one host as NAME:SLOTS or
NAME, (a list). Servers on other hosts run the launcher's own pskv-server path if it
exists there, else pskv-server from PATH (see --remote-server, --sync-dst-dir).
DMLC_INTERFACE (in the launcher's environment) picks the network every process
advertises.

Lifecycle: the exit status is 0 when every process exits 0, else the first failure's
status; when a process fails, the others are stopped within a few seconds and the
headline names the failing process (or the one the others were waiting for, when a job
hangs) and its status. The scheduler's death is not a failure: a standby scheduler
(started by default, next to the scheduler) takes over, and the launcher starts a
fresh standby to follow it, so the job survives a later death too
(--no-standby-scheduler: none; not with --launcher kubernetes). Ctrl-C or SIGTERM stop
the whole job. No process of the job outlives the launcher. At the end a summary lists every
process, its exit status and wall time.

Examples:
  pskv-launch -n 2 -s 1 -- ./train_fmnist --kv-store dist_sync
  pskv-launch -n 8 -s 2 -H node1:4,node2:4 --sync-dst-dir /tmp/job -- python3 train.py
  pskv-launch -n 4 -H hosts --log-dir logs -- python3 train.py
  pskv-launch -n 2 --launcher slurm --dry-run -- ./train_fmnist
  pskv-launch -n 4 -s 2 --launcher kubernetes --image registry/me/train:1 -- python3 train.py
)";

// Builds the parser over `c`; `kv` receives the raw K=V strings of --env*. The constructor
// is long on purpose: it is the table of pskv-launch's options, one entry each, in the order
// --help lists them; splitting it would only scatter that table.
struct Parser {
  CLI::App app{kDescription, "pskv-launch"};
  std::vector<std::string> env, env_server, env_worker;
  bool no_timestamps = false;
  bool standby = false, no_standby = false;

  explicit Parser(LaunchConfig& c) {
    app.set_version_flag("--version", Version());
    app.prefix_command();  // everything from COMMAND on belongs to the workers
    app.footer(kFooter);
    app.get_formatter()->column_width(34);
    app.add_option("-n,--num-workers", c.num_workers, "number of workers (required)")
        ->type_name("N")
        ->check(CLI::Range(1, 100000));
    app.add_option("-s,--num-servers", c.num_servers, "number of servers (default: N, as in MXNet)")
        ->type_name("S")
        ->check(CLI::Range(0, 100000));
    app.add_option("--spare-servers", c.spare_servers,
                   "spare server processes (local, mpi, slurm; needs PSKV_REPLICAS >= 1): each "
                   "takes over the copies of a dead server's key ranges, so that the job is "
                   "back to full strength (docs/fault-tolerance.md)")
        ->type_name("N")
        ->check(CLI::Range(0, 1024));
    app.add_option("--min-workers", c.min_workers,
                   "elastic workers (local, ssh; sets PSKV_ELASTIC=1): a worker that dies is "
                   "dropped and the job goes on while at least N workers are left; the rounds "
                   "it missed are scaled to the workers that pushed (docs/fault-tolerance.md)")
        ->type_name("N")
        ->check(CLI::Range(1, 100000));
    app.add_option("--restart-workers", c.restart_workers,
                   "with elastic workers (--min-workers): start a worker the scheduler dropped "
                   "again, at most N times in all; it joins the running job in its place at "
                   "the workers' next epoch barrier (KVStore::EpochPartition)")
        ->type_name("N")
        ->check(CLI::Range(0, 1000000));
    app.add_flag("--standby-scheduler", standby,
                 "(the default) start a standby scheduler next to the scheduler: when the "
                 "scheduler dies, it takes over and the job goes on, and a fresh standby is "
                 "started to follow it (also when the standby dies, 3 times at most; not with "
                 "--launcher kubernetes; docs/fault-tolerance.md)");
    app.add_flag("--no-standby-scheduler", no_standby,
                 "start no standby scheduler: the scheduler's death ends the job (saves a "
                 "process; the job starts ~10 ms sooner, within noise)");
    app.add_option("-H,--hosts,--hostfile", c.hosts,
                   "hosts: host1:4,host2:4 or a host file (ssh, mpi; see below)")
        ->type_name("HOSTS");
    app.add_option("--ssh-port", c.ssh_port, "ssh port of hosts that name none (default 22)")
        ->check(CLI::Range(1, 65535));
    app.add_option("--launcher", c.launcher,
                   "local (default without -H), ssh (default with -H), mpi, slurm (srun), "
                   "sge (qsub), yarn (distributed shell), kubernetes (manifests; see --image)")
        ->type_name("TYPE");
    app.add_option("--sync-dst-dir", c.sync_dst_dir,
                   "ssh: rsync the current directory to DIR on every host, run there")
        ->type_name("DIR");
    app.add_option("--env", env, "environment for every process (K:V also accepted)")
        ->type_name("K=V")
        ->allow_extra_args(false);
    app.add_option("--env-server", env_server, "environment for the servers and the scheduler only")
        ->type_name("K=V")
        ->allow_extra_args(false);
    app.add_option("--env-worker", env_worker, "environment for the workers only")
        ->type_name("K=V")
        ->allow_extra_args(false);
    app.add_option("--server-command", c.server_command,
                   "shell command run instead of pskv-server (e.g. a Python script that "
                   "creates a dist store, as with MXNet)")
        ->type_name("CMD");
    app.add_option("--remote-server", c.remote_server,
                   "ssh: path of pskv-server on the remote hosts (default: with --sync-dst-dir "
                   "a copy synced to DIR/.pskv/, else the launcher's own path if it exists "
                   "there, else pskv-server in the remote PATH)")
        ->type_name("PATH");
    app.add_option("--ssh-arg", c.ssh_args, "extra argument for every ssh call (e.g. -i key)")
        ->type_name("ARG")
        ->allow_extra_args(false);
    app.add_flag("--no-secret", c.no_secret,
                 "run without a job secret (MXNet's open mode: anyone who can reach the job's "
                 "ports can join it). By default every job gets a fresh random secret (or "
                 "PSKV_JOB_SECRET[_FILE] if set), handed to each process in its environment or "
                 "on ssh's stdin, never on a command line (docs/security.md)");
    app.add_flag("--dry-run", c.dry_run, "print what would be run, run nothing (secrets masked)");
    app.add_option("--timeout", c.timeout_s,
                   "stop the job and exit 124 after this long (default: none)")
        ->type_name("SECONDS")
        ->check(CLI::Range(0, 100000000));
    app.add_option("--log-dir", c.log_dir,
                   "also write each process's output to DIR/<process>.log (timestamped), and "
                   "the launcher's messages to DIR/launcher.log")
        ->type_name("DIR");
    app.add_flag("--no-timestamps", no_timestamps, "do not prefix forwarded lines with the time");
    auto* k8s = "Kubernetes (--launcher kubernetes)";
    app.add_option("--image", c.k8s_image, "container image with pskv and the program")->group(k8s);
    app.add_option("--namespace", c.k8s_namespace, "namespace of the job (default: default)")
        ->group(k8s);
    app.add_option("--job-name", c.k8s_job_name, "name of the job's objects (default: pskv-<id>)")
        ->group(k8s);
    app.add_option("--k8s-kind", c.k8s_kind,
                   "job: Indexed Jobs and a headless Service; mxjob: a Kubeflow MXJob")
        ->group(k8s)
        ->check(CLI::IsMember({"job", "mxjob"}));
    app.add_option("--cpu", c.k8s_cpu, "CPU request and limit per pod (e.g. 2)")->group(k8s);
    app.add_option("--memory", c.k8s_memory, "memory request and limit per pod (e.g. 4Gi)")
        ->group(k8s);
    app.add_flag("--apply", c.k8s_apply, "submit with `kubectl apply -f -` (default: print)")
        ->group(k8s);
  }
};

}  // namespace

std::string Version() {
  return std::string("pskv-launch ") + PSKV_VERSION;
}

std::string Usage() {
  LaunchConfig c;
  Parser p(c);
  return "usage: pskv-launch -n N [-s S] [-H HOSTS] [--launcher TYPE] [OPTIONS] -- COMMAND "
         "[ARGS...]\n\n" +
         std::regex_replace(p.app.help(), std::regex("\nUsage: [^\n]*\n"), "\n");
}

namespace {

// Parses argv into `c`: the options, the workers' command after them and the --env* pairs.
void ParseCommandLine(int argc, char** argv, LaunchConfig& c) {
  Parser p(c);
  try {
    p.app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    throw EarlyExit{0, Usage()};
  } catch (const CLI::CallForAllHelp&) {
    throw EarlyExit{0, Usage()};
  } catch (const CLI::CallForVersion&) {
    throw EarlyExit{0, Version() + "\n"};
  } catch (const CLI::ParseError& e) {
    throw InvalidArgument(e.what());
  }
  std::vector<std::string> rest = p.app.remaining();
  if (!rest.empty() && rest[0] == "--")
    rest.erase(rest.begin());
  else if (!rest.empty() && rest[0].size() > 1 && rest[0][0] == '-')
    throw InvalidArgument("unknown option '" + rest[0] + "'");
  c.command = rest;
  for (auto& kv : p.env) c.env.push_back(ParseKV("--env", kv));
  for (auto& kv : p.env_server) c.env_server.push_back(ParseKV("--env-server", kv));
  for (auto& kv : p.env_worker) c.env_worker.push_back(ParseKV("--env-worker", kv));
  c.timestamps = !p.no_timestamps;
  if (p.standby && p.no_standby)
    throw InvalidArgument("give --standby-scheduler or --no-standby-scheduler, not both");
  // A standby by default, where the scheduler runs next to the launcher (every type but
  // kubernetes, whose scheduler is a pod of its own).
  c.standby_scheduler = !p.no_standby;
  c.standby_asked = p.standby;
}

// Fills the defaults that depend on other options and rejects combinations that cannot work.
void ValidateOptions(LaunchConfig& c) {
  if (c.num_workers <= 0) throw InvalidArgument("-n N (number of workers, at least 1) is required");
  if (c.num_servers < 0) c.num_servers = c.num_workers;
  if (c.num_servers == 0) throw InvalidArgument("-s must be at least 1: a pskv job needs a server");
  if (c.command.empty())
    throw InvalidArgument("no command given for the workers (put it after --)");
  if (c.launcher.empty()) c.launcher = c.hosts.empty() ? "local" : "ssh";
  bool ok = false;
  std::string valid;
  for (const ClusterType& t : ClusterTypes()) {
    ok |= c.launcher == t.name;
    valid += (valid.empty() ? "" : ", ") + std::string(t.name);
  }
  if (!ok) throw InvalidArgument("unknown launcher '" + c.launcher + "'; valid: " + valid);
  if (c.launcher == "ssh" && c.hosts.empty())
    throw InvalidArgument("--launcher ssh needs hosts (-H host1:4,host2:4 or -H HOSTFILE)");
  if (!c.hosts.empty()) ParseHosts(c.hosts, c.ssh_port);  // report a bad -H now
  if (c.spare_servers > 0 && c.launcher != "local" && c.launcher != "mpi" && c.launcher != "slurm")
    throw InvalidArgument("--spare-servers works with --launcher local, mpi or slurm only");
  if (c.min_workers > c.num_workers)
    throw InvalidArgument("--min-workers " + std::to_string(c.min_workers) + " is more than -n " +
                          std::to_string(c.num_workers));
  if (c.min_workers > 0 && c.launcher != "local" && c.launcher != "ssh")
    throw InvalidArgument(
        "--min-workers works with --launcher local or ssh only (elsewhere the workers are one "
        "process group, which the resource manager ends when one of them dies)");
  if (!c.sync_dst_dir.empty() && c.launcher != "ssh")
    throw InvalidArgument("--sync-dst-dir works with --launcher ssh only");
  if (!c.remote_server.empty() && c.launcher != "ssh")
    throw InvalidArgument("--remote-server works with --launcher ssh only");
  if (!c.remote_server.empty() && !c.server_command.empty())
    throw InvalidArgument("give --remote-server or --server-command, not both");
  if (c.launcher == "kubernetes" && c.k8s_image.empty())
    throw InvalidArgument(
        "--launcher kubernetes needs --image (a container image with pskv-server "
        "and the workers' program)");
  if (c.launcher == "kubernetes") {
    if (c.standby_asked)
      throw InvalidArgument(
          "--standby-scheduler does not work with --launcher kubernetes (the scheduler is a pod "
          "of its own there; its death ends the job)");
    c.standby_scheduler = false;
  }
  if (c.launcher != "kubernetes" && c.k8s_apply)
    throw InvalidArgument("--apply is for --launcher kubernetes");
}

// The scheduler's address and port the job's processes meet at.
void ReadRootAddress(LaunchConfig& c) {
  const bool local = c.launcher == "local";
  if (const char* v = EnvValue("DMLC_PS_ROOT_URI"))
    c.root_uri = v;
  else if (const char* h = EnvValue("DMLC_NODE_HOST"))
    c.root_uri = h;
  else if (const char* itf = EnvValue("DMLC_INTERFACE"))
    c.root_uri = InterfaceAddress(itf);
  else
    c.root_uri = local ? "127.0.0.1" : DefaultAddress();
  if (const char* v = EnvValue("DMLC_PS_ROOT_PORT")) {
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    if (!*v || *end || x <= 0 || x > 65535)
      throw InvalidArgument(std::string("DMLC_PS_ROOT_PORT='") + v + "' is not a port number");
    c.root_port = static_cast<int>(x);
  }
}

// Every job-wide variable of the table (common/env_table.cc) set here reaches every
// node (kHost ones: not in containers, see plans/kubernetes.cc); the launcher sets the
// kLauncher ones itself.
void ReadForwardedEnv(LaunchConfig& c) {
  for (const EnvVar& var : EnvVars())
    if (var.scope == EnvScope::kJob || var.scope == EnvScope::kHost)
      if (const char* v = EnvValue(var.name)) c.forward_env[var.name] = v;
  // Replicated servers where the launcher cannot tell one server's death from the
  // job's failure: an error now rather than a job that fails when it should go on.
  if (c.launcher == "sge" || c.launcher == "yarn") {
    std::string replicas =
        c.forward_env.count("PSKV_REPLICAS") ? c.forward_env["PSKV_REPLICAS"] : "";
    for (auto* kvs : {&c.env, &c.env_server})
      for (auto& [k, v] : *kvs)
        if (k == "PSKV_REPLICAS") replicas = v;
    if (std::strtol(replicas.c_str(), nullptr, 10) > 0)
      throw InvalidArgument(
          "PSKV_REPLICAS=" + replicas + " cannot work with --launcher " + c.launcher +
          ": it starts all servers as one " + (c.launcher == "sge" ? "array job" : "application") +
          " whose processes report nothing to the launcher, which then cannot tell a server's "
          "death from the job's failure. Use --launcher local, ssh, mpi or slurm (each server "
          "its own process there), or run unreplicated (docs/fault-tolerance.md, \"The "
          "launcher\")");
  }
}

void ReadJobSecret(LaunchConfig& c) {
  if (const char* v = EnvValue("PSKV_JOB_SECRET")) c.job_secret = v;
  if (const char* path = EnvValue("PSKV_JOB_SECRET_FILE")) {
    if (!c.job_secret.empty())
      throw InvalidArgument("both PSKV_JOB_SECRET and PSKV_JOB_SECRET_FILE are set: set only one");
    try {
      c.job_secret = ReadJobSecretFile(path);  // the same rules as every node's
    } catch (const ConfigError& e) {
      throw InvalidArgument(e.what());
    }
  }
  if (c.no_secret) c.job_secret.clear();
}

// The launcher's own directory and the libpskv it (and so its pskv-server) runs with:
// --sync-dst-dir copies it next to pskv-server for hosts that have no pskv installed.
void FindOwnFiles(LaunchConfig& c) {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    std::string exe(buf, static_cast<size_t>(n));
    c.self_dir = exe.substr(0, exe.rfind('/'));
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    auto base = path.substr(path.rfind('/') + 1);
    if (base.rfind("libpskv.so", 0) == 0) {
      c.pskv_lib = path;
      break;
    }
  }
}

}  // namespace

LaunchConfig ParseArgs(int argc, char** argv) {
  LaunchConfig c;
  ParseCommandLine(argc, argv, c);
  ValidateOptions(c);
  // The launcher's own environment (its one place that reads it).
  if (const char* v = EnvValue("PSKV_LOG_LEVEL")) SetLogLevels(v);
  ReadRootAddress(c);
  ReadForwardedEnv(c);
  c.elastic = c.min_workers > 0 ||
              (c.forward_env.count("PSKV_ELASTIC") && c.forward_env["PSKV_ELASTIC"] == "1");
  for (auto& [k, v] : c.env)
    if (k == "PSKV_ELASTIC") c.elastic = c.min_workers > 0 || v == "1";
  if (c.restart_workers > 0 && !c.elastic)
    throw InvalidArgument(
        "--restart-workers needs elastic workers (--min-workers N): a strict job ends when a "
        "worker dies");
  ReadJobSecret(c);
  FindOwnFiles(c);
  return c;
}

}  // namespace pskv::launcher
