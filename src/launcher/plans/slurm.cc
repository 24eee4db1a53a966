// --launcher slurm: servers and workers as two srun steps; status records as tagged
// lines of their output, which srun forwards.
#include "launcher/plans/plan.h"

namespace pskv::launcher {

void PlanSlurm(const PlanContext& ctx, Plan& plan) {
  PlanGroups(ctx, plan, StatusVia::kOutput, [&](Group& g, Plan&) {
    std::string exp = "--export=ALL";
    for (auto& [k, v] : g.env) exp += "," + k + "=" + v;
    std::vector<std::string> argv = {"srun", "--ntasks=" + std::to_string(g.count),
                                     "--job-name=pskv-" + g.role, exp};
    for (auto& a : g.prog) argv.push_back(a);
    return argv;
  });
}

}  // namespace pskv::launcher
