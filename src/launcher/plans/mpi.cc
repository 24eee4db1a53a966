// --launcher mpi: servers and workers as two mpirun groups (Open MPI); status records
// as tagged lines of their output, which mpirun forwards.
#include <unistd.h>

#include "launcher/hosts.h"
#include "launcher/plans/plan.h"

namespace pskv::launcher {

void PlanMpi(const PlanContext& ctx, Plan& plan) {
  const LaunchConfig& cfg = ctx.cfg;
  PlanGroups(ctx, plan, StatusVia::kOutput, [&](Group& g, Plan&) {
    std::vector<std::string> argv = {"mpirun", "-n", std::to_string(g.count), "--oversubscribe"};
    if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
    if (!cfg.hosts.empty() && IsHostFile(cfg.hosts)) {
      argv.push_back("--hostfile");
      argv.push_back(cfg.hosts);
    } else if (!cfg.hosts.empty()) {
      std::string list;  // Open MPI's --host takes host:slots as horovodrun's -H
      for (auto& h : ParseHosts(cfg.hosts))
        list += (list.empty() ? "" : ",") + h.name + (h.slots ? ":" + std::to_string(h.slots) : "");
      argv.push_back("--host");
      argv.push_back(list);
    }
    for (auto& f : EnvFlags(g.env, "-x")) argv.push_back(f);
    if (!cfg.job_secret.empty()) {
      argv.push_back("-x");
      argv.push_back("PSKV_JOB_SECRET");  // name only: mpirun takes the value from its environment
    }
    for (auto& a : g.prog) argv.push_back(a);
    return argv;
  });
}

}  // namespace pskv::launcher
