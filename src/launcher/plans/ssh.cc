// --launcher ssh: servers and workers on the hosts of -H, each through its own ssh
// connection (the environment on its stdin, never on a command line); status records
// as tagged lines of their output, which ssh forwards.
#include <unistd.h>

#include "launcher/hosts.h"
#include "launcher/plans/plan.h"
#include "pskv/error.h"

namespace pskv::launcher {

namespace {

std::vector<std::string> SshBase(const LaunchConfig& cfg, const Host& h) {
  std::vector<std::string> a = {"ssh",           "-o", "StrictHostKeyChecking=no", "-o",
                                "BatchMode=yes", "-p", std::to_string(h.port)};
  for (auto& x : cfg.ssh_args) a.push_back(x);
  return a;
}

// Where pskv-server is on a remote host (see LaunchConfig::remote_server); the
// shell sets $pskv_server, or says why there is none and exits 127.
std::string FindServer(const PlanContext& ctx, const std::string& synced, const Host& h) {
  const LaunchConfig& cfg = ctx.cfg;
  if (!cfg.remote_server.empty()) return "pskv_server=" + ShellQuote(cfg.remote_server) + "; ";
  if (!cfg.sync_dst_dir.empty())
    return "pskv_server=" + ShellQuote(synced + "/pskv-server") +
           "; export LD_LIBRARY_PATH=" + ShellQuote(synced) +
           "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; ";
  const std::string why =
      "pskv-launch: host " + h.name + " has no pskv-server at " + ctx.server_bin +
      " (the launcher's own) nor in PATH: install pskv there, or give --remote-server PATH, "
      "or --sync-dst-dir DIR (copies pskv-server to every host)";
  return "pskv_server=" + ShellQuote(ctx.server_bin) +
         "; if [ ! -x \"$pskv_server\" ]; then pskv_server=$(command -v pskv-server) || { "
         "echo " +
         ShellQuote(why) + " >&2; exit 127; }; fi; ";
}

// The environment travels on ssh's stdin, one K=V per line and an empty line,
// so no value (the job secret above all) appears on a command line or in ps.
std::string EnvLines(const Env& env) {
  std::string env_lines;
  for (auto& [k, v] : env) {
    if (v.find('\n') != std::string::npos || k.find('=') != std::string::npos)
      throw InvalidArgument("environment variable " + k +
                            " has a newline in its value; ssh plans cannot pass it");
    env_lines += k + "=" + v + "\n";
  }
  return env_lines + "\n";
}

// Process i of the job (servers first, then workers) on host h.
ChildSpec SshChild(const PlanContext& ctx, const std::string& dir, const std::string& synced,
                   const Host& h, int i) {
  const LaunchConfig& cfg = ctx.cfg;
  const int n = cfg.num_workers, S = cfg.num_servers;
  const bool server = i < S;
  auto env = ctx.RoleEnv(server ? "server" : "worker", server ? n + i : i - S);
  for (auto& [k, v] : cfg.forward_env) env.emplace(k, v);
  // The host's name as the address it advertises, unless DMLC_INTERFACE picks
  // the network (a host file names hosts by their ssh network; DMLC_INTERFACE
  // may choose a faster one, and DMLC_NODE_HOST would override it).
  if (!env.count("DMLC_INTERFACE")) env["DMLC_NODE_HOST"] = h.name;
  env["PSKV_STATUS"] = "stderr";  // status records among its output (ssh forwards it)
  const std::string exports = "while IFS= read -r l && [ -n \"$l\" ]; do export \"$l\"; done; ";
  const std::string cmd = !server                      ? JoinQuoted(cfg.command)
                          : cfg.server_command.empty() ? "\"$pskv_server\""
                                                       : cfg.server_command;
  // The remote shell runs the command in its own session and kills that session
  // when the ssh connection's stdin closes (the launcher exited or stopped it).
  std::string script = "cd " + ShellQuote(dir) + " || exit 1; " + exports +
                       (server && cfg.server_command.empty() ? FindServer(ctx, synced, h) : "") +
                       "exec 3<&0; setsid " + cmd +
                       " </dev/null & c=$!; "
                       "( while read -r _ <&3; do :; done; kill -TERM -- -$c 2>/dev/null; "
                       "sleep 3; kill -KILL -- -$c 2>/dev/null ) & w=$!; "
                       "wait $c; s=$?; kill $w 2>/dev/null; exit $s";
  auto argv = SshBase(cfg, h);
  argv.push_back(h.name);
  argv.push_back("bash -c " + ShellQuote(script));
  std::string name = server ? "server " + std::to_string(i) : "worker " + std::to_string(i - S);
  std::string check = "ssh -o BatchMode=yes -p " + std::to_string(h.port);
  for (auto& x : cfg.ssh_args) check += " " + ShellQuote(x);
  check += " " + ShellQuote(h.name) + " true";
  return {name, argv, {}, true, EnvLines(env), false, StatusVia::kOutput, h.name, check};
}

// --sync-dst-dir: the rsync commands that run before the job, once per host.
std::string SyncPrelude(const PlanContext& ctx, const std::vector<Host>& hosts,
                        const std::string& dir, const std::string& synced) {
  const LaunchConfig& cfg = ctx.cfg;
  std::string pre;
  std::map<std::string, bool> seen;
  for (auto& h : hosts) {
    if (seen[h.name + ":" + std::to_string(h.port)]) continue;
    seen[h.name + ":" + std::to_string(h.port)] = true;
    std::string e = "ssh -o StrictHostKeyChecking=no -o BatchMode=yes -p " + std::to_string(h.port);
    for (auto& x : cfg.ssh_args) e += " " + ShellQuote(x);
    pre += "rsync -az -e " + ShellQuote(e) + " ./ " + ShellQuote(h.name + ":" + dir + "/") + "\n";
    // pskv-server and its libpskv go with the job (DIR/.pskv/), so hosts need no
    // pskv installation of their own (only the runtime packages: libzmq5,
    // libsodium23); --copy-links: the library's soname link becomes a file.
    if (cfg.remote_server.empty() && cfg.server_command.empty()) {
      std::string files =
          ShellQuote(ctx.server_bin.find('/') == std::string::npos ? cfg.self_dir + "/pskv-server"
                                                                   : ctx.server_bin);
      if (!cfg.pskv_lib.empty()) files += " " + ShellQuote(cfg.pskv_lib);
      pre += "rsync -az --copy-links -e " + ShellQuote(e) + " " + files + " " +
             ShellQuote(h.name + ":" + synced + "/") + "\n";
    }
  }
  return pre;
}

}  // namespace

void PlanSsh(const PlanContext& ctx, Plan& plan) {
  const LaunchConfig& cfg = ctx.cfg;
  const int n = cfg.num_workers, S = cfg.num_servers;
  auto hosts = ParseHosts(cfg.hosts, cfg.ssh_port);
  const Placement place = Place(hosts, S, n);
  char cwd[4096];
  std::string dir =
      cfg.sync_dst_dir.empty() ? (::getcwd(cwd, sizeof cwd) ? cwd : ".") : cfg.sync_dst_dir;
  const std::string synced = dir + "/.pskv";
  for (int i = 0; i < S + n; ++i) {
    const bool server = i < S;
    const Host& h = hosts[server ? place.server_host[static_cast<size_t>(i)]
                                 : place.worker_host[static_cast<size_t>(i - S)]];
    plan.children.push_back(SshChild(ctx, dir, synced, h, i));
  }
  // rsync runs before the job: recorded as files-to-run in the plan's prelude.
  if (!cfg.sync_dst_dir.empty()) plan.files["#prelude"] = SyncPrelude(ctx, hosts, dir, synced);
}

}  // namespace pskv::launcher
