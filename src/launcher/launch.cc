// Launch (launcher.h): runs a plan, or prints it (--dry-run).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

#include "launcher/plans/kubernetes.h"
#include "launcher/plans/plan.h"
#include "pskv/error.h"
#include "transport/auth.h"

namespace pskv::launcher {

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
  so.elastic_workers = cfg.elastic;
  so.restart_workers = cfg.restart_workers;
  if (cfg.standby_scheduler) so.next_standby = NextStandby;
  int rc = Supervise(plan.children, so);
  // The job's files (SGE job scripts, YARN's secret file) go with it: `qsub -sync y`
  // and YARN's client return when their job ended.
  for (auto& [path, content] : plan.files)
    if (path != "#prelude") ::unlink(path.c_str());
  return rc;
}

}  // namespace pskv::launcher
