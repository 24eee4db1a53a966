#include "launcher/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/env_table.h"
#include "common/net.h"
#include "launcher/hosts.h"
#include "launcher/kubernetes.h"
#include "pskv/error.h"
#include "transport/auth.h"

namespace pskv::launcher {

namespace {

std::pair<std::string, std::string> ParseKV(const std::string& opt, const std::string& s) {
  auto eq = s.find('=');
  if (eq == std::string::npos) eq = s.find(':');
  if (eq == std::string::npos || eq == 0)
    throw InvalidArgument(opt + " needs K=V, got '" + s + "'");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

std::string JoinQuoted(const std::vector<std::string>& argv) {
  std::string s;
  for (auto& a : argv) s += (s.empty() ? "" : " ") + ShellQuote(a);
  return s;
}

}  // namespace

std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./=:,+@%") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

namespace {

const char* const kLaunchers[] = {"local", "ssh", "mpi", "slurm", "sge", "yarn", "kubernetes"};

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
headline names the failing process (or the one the others were waiting for, when a
job hangs) and its status. Ctrl-C or SIGTERM stop the whole job. No process of the job
outlives the launcher. At the end a summary lists every process, its exit status and
wall time.

Examples:
  pskv-launch -n 2 -s 1 -- ./train_fmnist --kv-store dist_sync
  pskv-launch -n 8 -s 2 -H node1:4,node2:4 --sync-dst-dir /tmp/job -- python3 train.py
  pskv-launch -n 4 -H hosts --log-dir logs -- python3 train.py
  pskv-launch -n 2 --launcher slurm --dry-run -- ./train_fmnist
  pskv-launch -n 4 -s 2 --launcher kubernetes --image registry/me/train:1 -- python3 train.py
)";

// Builds the parser over `c`; `kv` receives the raw K=V strings of --env*.
struct Parser {
  CLI::App app{kDescription, "pskv-launch"};
  std::vector<std::string> env, env_server, env_worker;
  bool no_timestamps = false;

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

LaunchConfig ParseArgs(int argc, char** argv) {
  LaunchConfig c;
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

  if (c.num_workers <= 0) throw InvalidArgument("-n N (number of workers, at least 1) is required");
  if (c.num_servers < 0) c.num_servers = c.num_workers;
  if (c.num_servers == 0) throw InvalidArgument("-s must be at least 1: a pskv job needs a server");
  if (c.command.empty())
    throw InvalidArgument("no command given for the workers (put it after --)");
  if (c.launcher.empty()) c.launcher = c.hosts.empty() ? "local" : "ssh";
  bool ok = false;
  for (auto& v : kLaunchers) ok |= c.launcher == v;
  if (!ok)
    throw InvalidArgument("unknown launcher '" + c.launcher +
                          "'; valid: local, ssh, mpi, slurm, sge, yarn, kubernetes");
  if (c.launcher == "ssh" && c.hosts.empty())
    throw InvalidArgument("--launcher ssh needs hosts (-H host1:4,host2:4 or -H HOSTFILE)");
  if (!c.hosts.empty()) ParseHosts(c.hosts, c.ssh_port);  // report a bad -H now
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
  if (c.launcher != "kubernetes" && c.k8s_apply)
    throw InvalidArgument("--apply is for --launcher kubernetes");

  // The launcher's own environment (its one place that reads it).
  if (const char* v = EnvValue("PSKV_LOG_LEVEL")) SetLogLevels(v);
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
  // Every job-wide variable of the table (common/env_table.cc) set here reaches every
  // node (kHost ones: not in containers, see kubernetes.cc); the launcher sets the
  // kLauncher ones itself.
  for (const EnvVar& var : EnvVars())
    if (var.scope == EnvScope::kJob || var.scope == EnvScope::kHost)
      if (const char* v = EnvValue(var.name)) c.forward_env[var.name] = v;
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
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    std::string exe(buf, static_cast<size_t>(n));
    c.self_dir = exe.substr(0, exe.rfind('/'));
  }
  // The libpskv this launcher (and so its pskv-server) runs with: --sync-dst-dir
  // copies it next to pskv-server for hosts that have no pskv installed.
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
  return c;
}

bool IsSecretVar(const std::string& name) {
  return name == "PSKV_JOB_SECRET";
}

Plan MakePlan(const LaunchConfig& cfg, const std::string& job_id) {
  Plan plan;
  const int n = cfg.num_workers, S = cfg.num_servers;
  const int port = cfg.root_port ? cfg.root_port : FreePort(cfg.root_uri);
  std::map<std::string, std::string> common = {{"DMLC_PS_ROOT_URI", cfg.root_uri},
                                               {"DMLC_PS_ROOT_PORT", std::to_string(port)},
                                               {"DMLC_NUM_WORKER", std::to_string(n)},
                                               {"DMLC_NUM_SERVER", std::to_string(S)},
                                               {"PSKV_JOB_ID", job_id},
                                               {"DMLC_JOB_CLUSTER", cfg.launcher}};
  for (auto& [k, v] : cfg.env) common[k] = v;
  if (!cfg.job_secret.empty()) common["PSKV_JOB_SECRET"] = cfg.job_secret;
  auto role_env = [&](const std::string& role, int task) {
    auto e = common;
    e["DMLC_ROLE"] = role;
    if (task >= 0) e["DMLC_TASK_ID"] = std::to_string(task);
    for (auto& [k, v] : (role == "worker" ? cfg.env_worker : cfg.env_server)) e[k] = v;
    return e;
  };
  std::string server_bin = cfg.self_dir.empty() ? "pskv-server" : cfg.self_dir + "/pskv-server";
  if (::access(server_bin.c_str(), X_OK) != 0) server_bin = "pskv-server";
  const std::vector<std::string> server_argv =
      cfg.server_command.empty() ? std::vector<std::string>{server_bin}
                                 : std::vector<std::string>{"/bin/sh", "-c", cfg.server_command};

  // The scheduler always runs here, next to the launcher.
  plan.children.push_back(
      {"scheduler", server_argv, role_env("scheduler", -1), false, {}, false, StatusVia::kSocket});

  if (cfg.launcher == "local") {
    // Like torchrun: processes sharing this host's cores must not each start a
    // BLAS thread per core (2 workers x 2 OpenBLAS threads on 2 cores ran the
    // torch tests 2.6x slower). Unless the user chose, a worker's BLAS gets its
    // share of the cores and a server (no BLAS work) one thread.
    auto user_set = [&](const std::string& k) {
      auto has = [&](const auto& kvs) {
        for (auto& [key, v] : kvs)
          if (key == k) return true;
        return false;
      };
      return cfg.forward_env.count(k) || has(cfg.env) || has(cfg.env_worker);
    };
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const std::string share = std::to_string(std::max(1u, cores / static_cast<unsigned>(n)));
    for (int s = 0; s < S; ++s)
      plan.children.push_back({"server " + std::to_string(s),
                               server_argv,
                               role_env("server", n + s),
                               false,
                               {},
                               false,
                               StatusVia::kSocket});
    for (int w = 0; w < n; ++w)
      plan.children.push_back({"worker " + std::to_string(w),
                               cfg.command,
                               role_env("worker", w),
                               false,
                               {},
                               false,
                               StatusVia::kSocket});
    if (!user_set("OPENBLAS_NUM_THREADS"))
      for (auto& c : plan.children)
        c.env["OPENBLAS_NUM_THREADS"] = c.name.rfind("worker", 0) == 0 ? share : "1";
    // A server's merge/update threads: its share of the cores among all the
    // processes started here (more threads than cores only adds switching).
    if (!user_set("PSKV_SERVER_THREADS")) {
      const std::string server_share =
          std::to_string(std::max(1u, cores / static_cast<unsigned>(n + S)));
      for (auto& c : plan.children)
        if (c.name.rfind("server", 0) == 0) c.env["PSKV_SERVER_THREADS"] = server_share;
    }
    return plan;
  }

  if (cfg.launcher == "ssh") {
    auto hosts = ParseHosts(cfg.hosts, cfg.ssh_port);
    const Placement place = Place(hosts, S, n);
    char cwd[4096];
    std::string dir =
        cfg.sync_dst_dir.empty() ? (::getcwd(cwd, sizeof cwd) ? cwd : ".") : cfg.sync_dst_dir;
    auto ssh_base = [&](const Host& h) {
      std::vector<std::string> a = {"ssh",           "-o", "StrictHostKeyChecking=no", "-o",
                                    "BatchMode=yes", "-p", std::to_string(h.port)};
      for (auto& x : cfg.ssh_args) a.push_back(x);
      return a;
    };
    // Where pskv-server is on a remote host (see LaunchConfig::remote_server); the
    // shell sets $pskv_server, or says why there is none and exits 127.
    const std::string synced = dir + "/.pskv";
    auto find_server = [&](const Host& h) {
      if (!cfg.remote_server.empty()) return "pskv_server=" + ShellQuote(cfg.remote_server) + "; ";
      if (!cfg.sync_dst_dir.empty())
        return "pskv_server=" + ShellQuote(synced + "/pskv-server") +
               "; export LD_LIBRARY_PATH=" + ShellQuote(synced) +
               "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; ";
      const std::string why =
          "pskv-launch: host " + h.name + " has no pskv-server at " + server_bin +
          " (the launcher's own) nor in PATH: install pskv there, or give --remote-server PATH, "
          "or --sync-dst-dir DIR (copies pskv-server to every host)";
      return "pskv_server=" + ShellQuote(server_bin) +
             "; if [ ! -x \"$pskv_server\" ]; then pskv_server=$(command -v pskv-server) || { "
             "echo " +
             ShellQuote(why) + " >&2; exit 127; }; fi; ";
    };
    for (int i = 0; i < S + n; ++i) {
      const bool server = i < S;
      const Host& h = hosts[server ? place.server_host[static_cast<size_t>(i)]
                                   : place.worker_host[static_cast<size_t>(i - S)]];
      auto env = role_env(server ? "server" : "worker", server ? n + i : i - S);
      for (auto& [k, v] : cfg.forward_env) env.emplace(k, v);
      // The host's name as the address it advertises, unless DMLC_INTERFACE picks
      // the network (a host file names hosts by their ssh network; DMLC_INTERFACE
      // may choose a faster one, and DMLC_NODE_HOST would override it).
      if (!env.count("DMLC_INTERFACE")) env["DMLC_NODE_HOST"] = h.name;
      env["PSKV_STATUS"] = "stderr";  // status records among its output (ssh forwards it)
      // The environment travels on ssh's stdin, one K=V per line and an empty line,
      // so no value (the job secret above all) appears on a command line or in ps.
      std::string env_lines;
      for (auto& [k, v] : env) {
        if (v.find('\n') != std::string::npos || k.find('=') != std::string::npos)
          throw InvalidArgument("environment variable " + k +
                                " has a newline in its value; ssh plans cannot pass it");
        env_lines += k + "=" + v + "\n";
      }
      env_lines += "\n";
      const std::string exports = "while IFS= read -r l && [ -n \"$l\" ]; do export \"$l\"; done; ";
      const std::string cmd = !server                      ? JoinQuoted(cfg.command)
                              : cfg.server_command.empty() ? "\"$pskv_server\""
                                                           : cfg.server_command;
      // The remote shell runs the command in its own session and kills that session
      // when the ssh connection's stdin closes (the launcher exited or stopped it).
      std::string script = "cd " + ShellQuote(dir) + " || exit 1; " + exports +
                           (server && cfg.server_command.empty() ? find_server(h) : "") +
                           "exec 3<&0; setsid " + cmd +
                           " </dev/null & c=$!; "
                           "( while read -r _ <&3; do :; done; kill -TERM -- -$c 2>/dev/null; "
                           "sleep 3; kill -KILL -- -$c 2>/dev/null ) & w=$!; "
                           "wait $c; s=$?; kill $w 2>/dev/null; exit $s";
      auto argv = ssh_base(h);
      argv.push_back(h.name);
      argv.push_back("bash -c " + ShellQuote(script));
      std::string name = server ? "server " + std::to_string(i) : "worker " + std::to_string(i - S);
      plan.children.push_back({name, argv, {}, true, env_lines, false, StatusVia::kOutput});
    }
    if (!cfg.sync_dst_dir.empty()) {
      // rsync runs before the job: recorded as files-to-run in the plan's prelude.
      std::string pre;
      std::map<std::string, bool> seen;
      for (auto& h : hosts) {
        if (seen[h.name + ":" + std::to_string(h.port)]) continue;
        seen[h.name + ":" + std::to_string(h.port)] = true;
        std::string e =
            "ssh -o StrictHostKeyChecking=no -o BatchMode=yes -p " + std::to_string(h.port);
        for (auto& x : cfg.ssh_args) e += " " + ShellQuote(x);
        pre +=
            "rsync -az -e " + ShellQuote(e) + " ./ " + ShellQuote(h.name + ":" + dir + "/") + "\n";
        // pskv-server and its libpskv go with the job (DIR/.pskv/), so hosts need no
        // pskv installation of their own (only the runtime packages: libzmq5,
        // libsodium23); --copy-links: the library's soname link becomes a file.
        if (cfg.remote_server.empty() && cfg.server_command.empty()) {
          std::string files =
              ShellQuote(server_bin.find('/') == std::string::npos ? cfg.self_dir + "/pskv-server"
                                                                   : server_bin);
          if (!cfg.pskv_lib.empty()) files += " " + ShellQuote(cfg.pskv_lib);
          pre += "rsync -az --copy-links -e " + ShellQuote(e) + " " + files + " " +
                 ShellQuote(h.name + ":" + synced + "/") + "\n";
        }
      }
      plan.files["#prelude"] = pre;
    }
    return plan;
  }

  // Batch systems and MPI: workers and servers as two groups.
  auto env_flags = [&](const std::map<std::string, std::string>& env, const std::string& flag,
                       bool joined) {
    std::vector<std::string> out;
    for (auto& [k, v] : env) {
      if (joined) {
        out.push_back(flag + k + "=" + v);
      } else {
        out.push_back(flag);
        out.push_back(k + "=" + v);
      }
    }
    return out;
  };
  // Values reach the batch system through the environment of the command that
  // submits (mpirun -x NAME, srun --export=ALL, qsub -V), never through its argv;
  // the secret is taken out of `env` and set only in that environment.
  std::map<std::string, std::string> secret_env;
  if (!cfg.job_secret.empty()) secret_env["PSKV_JOB_SECRET"] = cfg.job_secret;
  auto group = [&](const std::string& role, int count) {
    auto env = role_env(role, -1);
    env.erase("DMLC_TASK_ID");
    env.erase("PSKV_JOB_SECRET");
    for (auto& [k, v] : cfg.forward_env)
      if (k != "PATH") env.emplace(k, v);
    // mpirun and srun forward their processes' output: status records travel in it.
    // qsub and YARN keep it in the batch system's files, out of the launcher's reach.
    if (cfg.launcher == "mpi" || cfg.launcher == "slurm") env["PSKV_STATUS"] = "stderr";
    const auto& prog = role == "worker" ? cfg.command : server_argv;
    std::vector<std::string> argv;
    if (cfg.launcher == "mpi") {
      argv = {"mpirun", "-n", std::to_string(count), "--oversubscribe"};
      if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
      if (!cfg.hosts.empty() && IsHostFile(cfg.hosts)) {
        argv.push_back("--hostfile");
        argv.push_back(cfg.hosts);
      } else if (!cfg.hosts.empty()) {
        std::string list;  // Open MPI's --host takes host:slots as horovodrun's -H
        for (auto& h : ParseHosts(cfg.hosts))
          list +=
              (list.empty() ? "" : ",") + h.name + (h.slots ? ":" + std::to_string(h.slots) : "");
        argv.push_back("--host");
        argv.push_back(list);
      }
      for (auto& f : env_flags(env, "-x", false)) argv.push_back(f);
      for (auto& [k, v] : secret_env) {
        argv.push_back("-x");
        argv.push_back(k);  // name only: mpirun takes the value from its environment
      }
    } else if (cfg.launcher == "slurm") {
      std::string exp = "--export=ALL";
      for (auto& [k, v] : env) exp += "," + k + "=" + v;
      argv = {"srun", "--ntasks=" + std::to_string(count), "--job-name=pskv-" + role, exp};
    } else if (cfg.launcher == "sge") {
      std::string script = "/tmp/pskv-" + job_id + "-" + role + ".sh";
      std::string body = "#!/bin/sh\n";
      for (auto& [k, v] : env) body += "export " + k + "=" + ShellQuote(v) + "\n";
      body += "export DMLC_TASK_ID=$((SGE_TASK_ID - 1))\nexec " + JoinQuoted(prog) + "\n";
      plan.files[script] = body;
      argv = {"qsub",         "-sync", "y",
              "-cwd",         "-V",    "-N",
              "pskv-" + role, "-t",    "1-" + std::to_string(count),
              script};
      return argv;
    } else {  // yarn: the distributed shell runs `count` containers of the command
      if (!cfg.job_secret.empty()) {
        // The distributed shell has no way to pass a value outside its argv: the
        // secret goes in a private file next to the job (on the shared filesystem
        // YARN jobs run from), removed when the launcher exits.
        char cwd[4096];
        std::string dir = ::getcwd(cwd, sizeof cwd) ? cwd : ".";
        std::string path = dir + "/.pskv-secret-" + job_id;
        plan.files[path] = cfg.job_secret + "\n";
        plan.secret_files.push_back(path);
        env["PSKV_JOB_SECRET_FILE"] = path;
      }
      // The jar's path depends on HADOOP_YARN_HOME, which only a shell expands: the
      // command runs under /bin/sh -c, every other word quoted, so what the shell
      // executes is exactly this argv with the variable expanded (or a clear error
      // when it is not set).
      std::vector<std::string> rest = {"-appname",        "pskv-" + role,
                                       "-num_containers", std::to_string(count),
                                       "-shell_command",  JoinQuoted(prog)};
      for (auto& f : env_flags(env, "-shell_env", false)) rest.push_back(f);
      const std::string line =
          "exec yarn org.apache.hadoop.yarn.applications.distributedshell.Client -jar "
          "\"${HADOOP_YARN_HOME:?is not set: set it to the Hadoop installation (the directory "
          "with share/hadoop/yarn)}\"/share/hadoop/yarn/"
          "hadoop-yarn-applications-distributedshell.jar " +
          JoinQuoted(rest);
      return std::vector<std::string>{"/bin/sh", "-c", line};
    }
    for (auto& a : prog) argv.push_back(a);
    return argv;
  };
  const StatusVia via =
      cfg.launcher == "mpi" || cfg.launcher == "slurm" ? StatusVia::kOutput : StatusVia::kNone;
  plan.children.push_back({"servers", group("server", S), secret_env, false, {}, false, via});
  plan.children.push_back({"workers", group("worker", n), secret_env, false, {}, false, via});
  return plan;
}

int Launch(const LaunchConfig& config) {
  LaunchConfig cfg = config;
  if (cfg.job_secret.empty() && !cfg.no_secret) cfg.job_secret = NewJobSecret();
  // The children get the secret's value (PSKV_JOB_SECRET) and inherit this
  // environment: a PSKV_JOB_SECRET_FILE given to the launcher must not reach them
  // too (a node refuses both at once), nor an old secret in --no-secret mode.
  ::unsetenv("PSKV_JOB_SECRET_FILE");
  ::unsetenv("PSKV_STATUS");  // a channel of whoever started the launcher, not of its children
  if (cfg.no_secret) ::unsetenv("PSKV_JOB_SECRET");
  std::random_device rd;
  char id[32];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
  if (cfg.launcher == "kubernetes") return LaunchKubernetes(cfg, id);
  Plan plan = MakePlan(cfg, id);
  if (cfg.dry_run) {
    for (auto& [path, content] : plan.files) {
      if (path == "#prelude")
        std::printf("# before the job:\n%s", content.c_str());
      else if (std::find(plan.secret_files.begin(), plan.secret_files.end(), path) !=
               plan.secret_files.end())
        std::printf("# file %s (mode 0600): <secret>\n", path.c_str());
      else
        std::printf("# file %s:\n%s", path.c_str(), content.c_str());
    }
    for (auto& c : plan.children) {
      std::printf("[%s] ", c.name.c_str());
      for (auto& [k, v] : c.env)
        std::printf("%s=%s ", k.c_str(), IsSecretVar(k) ? "<secret>" : ShellQuote(v).c_str());
      std::printf("%s\n", JoinQuoted(c.argv).c_str());
      if (!c.stdin_data.empty() && c.stdin_data.find('=') != std::string::npos) {
        // The environment an ssh child reads on its stdin ("K=V" lines), masked alike.
        std::printf("[%s] environment on stdin:", c.name.c_str());
        std::istringstream lines(c.stdin_data);
        for (std::string l; std::getline(lines, l) && !l.empty();) {
          const std::string k = l.substr(0, l.find('='));
          std::printf(" %s=%s", k.c_str(),
                      IsSecretVar(k) ? "<secret>" : ShellQuote(l.substr(k.size() + 1)).c_str());
        }
        std::printf("\n");
      }
    }
    return 0;
  }
  for (auto& [path, content] : plan.files) {
    if (path == "#prelude") {
      int rc = std::system(content.c_str());
      if (rc != 0) {
        Say("syncing the working directory failed:\n" + content, cfg.timestamps, LogLevel::kError);
        return 1;
      }
      continue;
    }
    // Private from the start: a secret file is never readable by others.
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 ||
        ::write(fd, content.data(), content.size()) != static_cast<ssize_t>(content.size())) {
      if (fd >= 0) ::close(fd);
      throw IOError("cannot write " + path);
    }
    ::close(fd);
  }
  SuperviseOptions so;
  so.timeout = std::chrono::seconds(cfg.timeout_s);
  so.log_dir = cfg.log_dir;
  so.timestamps = cfg.timestamps;
  int rc = Supervise(plan.children, so);
  // The job's files (SGE job scripts, YARN's secret file) go with it: `qsub -sync y`
  // and YARN's client return when their job ended.
  for (auto& [path, content] : plan.files)
    if (path != "#prelude") ::unlink(path.c_str());
  return rc;
}

}  // namespace pskv::launcher
