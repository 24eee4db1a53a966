// --launcher sge: servers and workers as two array jobs (qsub -sync y), each task
// running a job script. Their output stays in SGE's files: no status records reach
// the launcher, which knows only qsub's exit status.
#include "launcher/plans/plan.h"

namespace pskv::launcher {

void PlanSge(const PlanContext& ctx, Plan& plan) {
  PlanGroups(ctx, plan, StatusVia::kNone, Servers::kGrouped, [&](Group& g, Plan& p) {
    std::string script = "/tmp/pskv-" + ctx.job_id + "-" + g.role + ".sh";
    std::string body = "#!/bin/sh\n";
    for (auto& [k, v] : g.env) body += "export " + k + "=" + ShellQuote(v) + "\n";
    body += "export DMLC_TASK_ID=$((SGE_TASK_ID - 1))\nexec " + JoinQuoted(g.prog) + "\n";
    p.files[script] = body;
    return std::vector<std::string>{"qsub",
                                    "-sync",
                                    "y",
                                    "-cwd",
                                    "-V",
                                    "-N",
                                    "pskv-" + g.role,
                                    "-t",
                                    "1-" + std::to_string(g.count),
                                    script};
  });
}

}  // namespace pskv::launcher
