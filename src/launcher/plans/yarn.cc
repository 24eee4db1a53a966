// --launcher yarn: servers and workers as two runs of YARN's distributed shell. Their
// output stays in YARN's logs: no status records reach the launcher, which knows only
// the client's exit status.
#include <unistd.h>

#include <algorithm>

#include "launcher/plans/plan.h"

namespace pskv::launcher {

void PlanYarn(const PlanContext& ctx, Plan& plan) {
  const LaunchConfig& cfg = ctx.cfg;
  PlanGroups(ctx, plan, StatusVia::kNone, Servers::kGrouped, [&](Group& g, Plan& p) {
    if (!cfg.job_secret.empty()) {
      // The distributed shell has no way to pass a value outside its argv: the
      // secret goes in a private file next to the job (on the shared filesystem
      // YARN jobs run from), removed when the launcher exits.
      char cwd[4096];
      std::string dir = ::getcwd(cwd, sizeof cwd) ? cwd : ".";
      std::string path = dir + "/.pskv-secret-" + ctx.job_id;
      p.files[path] = cfg.job_secret + "\n";
      if (std::find(p.secret_files.begin(), p.secret_files.end(), path) == p.secret_files.end())
        p.secret_files.push_back(path);
      g.env["PSKV_JOB_SECRET_FILE"] = path;
    }
    // The jar's path depends on HADOOP_YARN_HOME, which only a shell expands: the
    // command runs under /bin/sh -c, every other word quoted, so what the shell
    // executes is exactly this argv with the variable expanded (or a clear error
    // when it is not set).
    std::vector<std::string> rest = {"-appname",        "pskv-" + g.role,
                                     "-num_containers", std::to_string(g.count),
                                     "-shell_command",  JoinQuoted(g.prog)};
    for (auto& f : EnvFlags(g.env, "-shell_env")) rest.push_back(f);
    const std::string line =
        "exec yarn org.apache.hadoop.yarn.applications.distributedshell.Client -jar "
        "\"${HADOOP_YARN_HOME:?is not set: set it to the Hadoop installation (the directory "
        "with share/hadoop/yarn)}\"/share/hadoop/yarn/"
        "hadoop-yarn-applications-distributedshell.jar " +
        JoinQuoted(rest);
    return std::vector<std::string>{"/bin/sh", "-c", line};
  });
}

}  // namespace pskv::launcher
