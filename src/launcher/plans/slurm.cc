// --launcher slurm: each server as an srun step of its own, the workers as one step;
// status records as tagged lines of their output, which srun forwards.
//
// A step is one process group for SLURM: a task that dies ends only its own step when
// the step has one task, so a replicated job survives a server's death as under the
// local launcher (inside an allocation each srun is a step of it; outside, a job of
// its own). A worker's death ends the job anyway: the workers stay one step.
#include "launcher/plans/plan.h"

namespace pskv::launcher {

void PlanSlurm(const PlanContext& ctx, Plan& plan) {
  PlanGroups(ctx, plan, StatusVia::kOutput, Servers::kSeparate, [&](Group& g, Plan&) {
    std::string exp = "--export=ALL";
    for (auto& [k, v] : g.env) exp += "," + k + "=" + v;
    std::vector<std::string> argv = {"srun", "--ntasks=" + std::to_string(g.count),
                                     "--job-name=pskv-" + g.role, exp};
    for (auto& a : g.prog) argv.push_back(a);
    return argv;
  });
}

}  // namespace pskv::launcher
