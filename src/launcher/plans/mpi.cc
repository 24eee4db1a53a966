// --launcher mpi: each server as an mpirun of its own, the workers as one mpirun group
// (Open MPI); status records as tagged lines of their output, which mpirun forwards.
//
// Open MPI aborts a whole mpirun job when one of its processes dies, so servers in one
// group would all go with the first (a replicated job then fails, "no live copy
// left"). Alone, a server's death ends only its own mpirun, which the launcher sees as
// that server's exit. `--enable-recovery` keeps a group alive instead, but mpirun then
// exits 0 whatever its processes did (Open MPI 4.1): the launcher would learn of no
// death. A worker's death ends the job anyway: the workers stay one group.
#include <unistd.h>

#include "launcher/hosts.h"
#include "launcher/plans/plan.h"

namespace pskv::launcher {

void PlanMpi(const PlanContext& ctx, Plan& plan) {
  const LaunchConfig& cfg = ctx.cfg;
  std::vector<Host> hosts;
  Placement place;
  if (!cfg.hosts.empty()) {
    hosts = ParseHosts(cfg.hosts);
    place = Place(hosts, cfg.num_servers + cfg.spare_servers, 0);  // round-robin
  }
  PlanGroups(ctx, plan, StatusVia::kOutput, Servers::kSeparate, [&](Group& g, Plan&) {
    std::vector<std::string> argv = {"mpirun", "-n", std::to_string(g.count), "--oversubscribe"};
    if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
    if (g.index >= 0 && !hosts.empty()) {
      argv.push_back("--host");
      argv.push_back(hosts[place.server_host[static_cast<size_t>(g.index)]].name);
    } else if (!cfg.hosts.empty() && IsHostFile(cfg.hosts)) {
      argv.push_back("--hostfile");
      argv.push_back(cfg.hosts);
    } else if (!cfg.hosts.empty()) {
      std::string list;  // Open MPI's --host takes host:slots as horovodrun's -H
      for (auto& h : hosts)
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
