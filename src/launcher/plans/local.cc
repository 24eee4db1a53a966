// --launcher local: every process on this host, as children of the launcher; status
// records on a socket per process.
#include <algorithm>
#include <thread>

#include "launcher/plans/plan.h"

namespace pskv::launcher {

void PlanLocal(const PlanContext& ctx, Plan& plan) {
  const LaunchConfig& cfg = ctx.cfg;
  const int n = cfg.num_workers, S = cfg.num_servers;
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
  auto child = [](std::string name, std::vector<std::string> argv, Env env) {
    return ChildSpec{std::move(name),
                     std::move(argv),
                     std::move(env),
                     false,
                     {},
                     false,
                     StatusVia::kSocket,
                     {},
                     {}};
  };
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string share = std::to_string(std::max(1u, cores / static_cast<unsigned>(n)));
  for (int s = 0; s < S; ++s)
    plan.children.push_back(
        child("server " + std::to_string(s), ctx.server_argv, ctx.RoleEnv("server", n + s)));
  for (int k = 0; k < cfg.spare_servers; ++k) {  // ranks S.. (after the others)
    Env env = ctx.RoleEnv("server", n + S + k);
    env["PSKV_SPARE_SERVER"] = "1";
    plan.children.push_back(child("server " + std::to_string(S + k), ctx.server_argv, env));
  }
  for (int w = 0; w < n; ++w)
    plan.children.push_back(
        child("worker " + std::to_string(w), cfg.command, ctx.RoleEnv("worker", w)));
  if (!user_set("OPENBLAS_NUM_THREADS"))
    for (auto& c : plan.children)
      c.env["OPENBLAS_NUM_THREADS"] = c.name.rfind("worker", 0) == 0 ? share : "1";
  // A server's merge/update threads: its share of the cores among all the
  // processes started here (more threads than cores only adds switching).
  if (!user_set("PSKV_SERVER_THREADS")) {
    const std::string server_share =
        std::to_string(std::max(1u, cores / static_cast<unsigned>(n + S + cfg.spare_servers)));
    for (auto& c : plan.children)
      if (c.name.rfind("server", 0) == 0) c.env["PSKV_SERVER_THREADS"] = server_share;
  }
}

}  // namespace pskv::launcher
