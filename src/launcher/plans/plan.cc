// MakePlan and what the cluster types share (launcher/plans/plan.h).
#include "launcher/plans/plan.h"

#include <unistd.h>

#include "common/net.h"

namespace pskv::launcher {

std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./=:,+@%") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

bool IsSecretVar(const std::string& name) {
  return name == "PSKV_JOB_SECRET";
}

std::string JoinQuoted(const std::vector<std::string>& argv) {
  std::string s;
  for (auto& a : argv) s += (s.empty() ? "" : " ") + ShellQuote(a);
  return s;
}

std::vector<std::string> EnvFlags(const Env& env, const std::string& flag) {
  std::vector<std::string> out;
  for (auto& [k, v] : env) {
    out.push_back(flag);
    out.push_back(k + "=" + v);
  }
  return out;
}

Env PlanContext::RoleEnv(const std::string& role, int task) const {
  Env e = common;
  e["DMLC_ROLE"] = role;
  if (task >= 0) e["DMLC_TASK_ID"] = std::to_string(task);
  for (auto& [k, v] : (role == "worker" ? cfg.env_worker : cfg.env_server)) e[k] = v;
  return e;
}

std::span<const ClusterType> ClusterTypes() {
  static const ClusterType kTypes[] = {
      {"local", PlanLocal}, {"ssh", PlanSsh},   {"mpi", PlanMpi},        {"slurm", PlanSlurm},
      {"sge", PlanSge},     {"yarn", PlanYarn}, {"kubernetes", nullptr},
  };
  return kTypes;
}

void PlanGroups(const PlanContext& ctx, Plan& plan, StatusVia status, Servers servers,
                const std::function<std::vector<std::string>(Group&, Plan&)>& command) {
  const LaunchConfig& cfg = ctx.cfg;
  Env secret_env;
  if (!cfg.job_secret.empty()) secret_env["PSKV_JOB_SECRET"] = cfg.job_secret;
  // `index` >= 0: server `index` alone, with its rank hint as the local launcher gives it.
  auto group = [&](const std::string& role, int count, int index) {
    Group g{role, count, index, ctx.RoleEnv(role, index >= 0 ? cfg.num_workers + index : -1),
            role == "worker" ? cfg.command : ctx.server_argv};
    if (index < 0) g.env.erase("DMLC_TASK_ID");
    if (index >= cfg.num_servers) g.env["PSKV_SPARE_SERVER"] = "1";
    g.env.erase("PSKV_JOB_SECRET");
    for (auto& [k, v] : cfg.forward_env)
      if (k != "PATH") g.env.emplace(k, v);
    // Where the system forwards its processes' output, their status records travel in
    // it as tagged lines.
    if (status == StatusVia::kOutput) g.env["PSKV_STATUS"] = "stderr";
    return command(g, plan);
  };
  auto child = [&](std::string name, std::vector<std::string> argv) {
    return ChildSpec{std::move(name), std::move(argv), secret_env, false, {},
                     false,           status,          {},         {}};
  };
  if (servers == Servers::kSeparate)
    for (int s = 0; s < cfg.num_servers + cfg.spare_servers; ++s)  // spares after the others
      plan.children.push_back(child("server " + std::to_string(s), group("server", 1, s)));
  else
    plan.children.push_back(child("servers", group("server", cfg.num_servers, -1)));
  plan.children.push_back(child("workers", group("worker", cfg.num_workers, -1)));
}

ChildSpec NextStandby(const ChildSpec& active, int number) {
  ChildSpec c = active;
  auto env = [&](const char* k) {
    auto it = active.env.find(k);
    return it == active.env.end() ? std::string() : it->second;
  };
  // Where the job's scheduler listens: a standby that took over, at its own address;
  // the first scheduler, at the job's root address.
  const std::string at = env("PSKV_STANDBY") == "1"
                             ? env("PSKV_SCHEDULER_STANDBY")
                             : env("DMLC_PS_ROOT_URI") + ":" + env("DMLC_PS_ROOT_PORT");
  const std::string host = at.substr(0, at.rfind(':')), port = at.substr(at.rfind(':') + 1);
  c.env["DMLC_PS_ROOT_URI"] = host;
  c.env["DMLC_PS_ROOT_PORT"] = port;
  int mine = 0;
  do mine = FreePort(host);
  while (std::to_string(mine) == port);
  c.env["PSKV_SCHEDULER_STANDBY"] = host + ":" + std::to_string(mine);
  c.env["PSKV_STANDBY"] = "1";
  c.name = "standby scheduler " + std::to_string(number);
  return c;
}

Plan MakePlan(const LaunchConfig& cfg, const std::string& job_id) {
  const int port = cfg.root_port ? cfg.root_port : FreePort(cfg.root_uri);
  PlanContext ctx{cfg, job_id, {}, {}, {}};
  ctx.common = {{"DMLC_PS_ROOT_URI", cfg.root_uri},
                {"DMLC_PS_ROOT_PORT", std::to_string(port)},
                {"DMLC_NUM_WORKER", std::to_string(cfg.num_workers)},
                {"DMLC_NUM_SERVER", std::to_string(cfg.num_servers)},
                {"PSKV_JOB_ID", job_id},
                {"DMLC_JOB_CLUSTER", cfg.launcher}};
  if (cfg.spare_servers > 0) ctx.common["PSKV_SPARE_SERVERS"] = std::to_string(cfg.spare_servers);
  if (cfg.min_workers > 0) {
    ctx.common["PSKV_ELASTIC"] = "1";
    ctx.common["PSKV_MIN_WORKERS"] = std::to_string(cfg.min_workers);
  }
  int standby_port = 0;
  if (cfg.standby_scheduler) {
    do standby_port = FreePort(cfg.root_uri);
    while (standby_port == port);
    ctx.common["PSKV_SCHEDULER_STANDBY"] = cfg.root_uri + ":" + std::to_string(standby_port);
  }
  for (auto& [k, v] : cfg.env) ctx.common[k] = v;
  if (!cfg.job_secret.empty()) ctx.common["PSKV_JOB_SECRET"] = cfg.job_secret;
  ctx.server_bin = cfg.self_dir.empty() ? "pskv-server" : cfg.self_dir + "/pskv-server";
  if (::access(ctx.server_bin.c_str(), X_OK) != 0) ctx.server_bin = "pskv-server";
  ctx.server_argv = cfg.server_command.empty()
                        ? std::vector<std::string>{ctx.server_bin}
                        : std::vector<std::string>{"/bin/sh", "-c", cfg.server_command};

  Plan plan;
  // The scheduler always runs here, next to the launcher: its status comes on a socket.
  plan.children.push_back({"scheduler",
                           ctx.server_argv,
                           ctx.RoleEnv("scheduler", -1),
                           false,
                           {},
                           false,
                           StatusVia::kSocket,
                           {},
                           {}});
  if (cfg.standby_scheduler) {  // next to it, here too (supervise.cc lets either die)
    auto env = ctx.RoleEnv("scheduler", -1);
    env["PSKV_STANDBY"] = "1";
    plan.children.push_back(
        {"standby scheduler", ctx.server_argv, env, false, {}, false, StatusVia::kSocket, {}, {}});
  }
  for (const ClusterType& t : ClusterTypes())
    if (cfg.launcher == t.name && t.plan) t.plan(ctx, plan);
  return plan;
}

}  // namespace pskv::launcher
