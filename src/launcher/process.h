// Process supervision for pskv-launch: start children in their own process
// groups, prefix every line of their output with their name, and stop the whole
// job when one fails, when a timeout passes, or when the launcher is signalled.
//
// Children get PR_SET_PDEATHSIG(SIGKILL), so even a SIGKILL of the launcher does
// not leave them running; every child is its own process-group leader, so its own
// children are stopped with it (kill(-pgid)).
#pragma once

#include <sys/types.h>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/logging.h"

namespace pskv::launcher {

/// Where a child's status records (common/status_record.h) come from.
enum class StatusVia {
  kNone,    ///< nowhere: the child reports nothing the launcher can read
  kSocket,  ///< a socket made for it, named in its PSKV_STATUS (local children)
  kOutput,  ///< tagged lines of its output (remote children: PSKV_STATUS=stderr)
};

struct ChildSpec {
  std::string name;                        ///< "worker 1": printed as "[worker 1] ..."
  std::vector<std::string> argv;           ///< argv[0] is looked up in PATH
  std::map<std::string, std::string> env;  ///< set on top of the launcher's environment
  bool stdin_pipe = false;                 ///< keep a pipe to the child's stdin (ssh)
  /// Written to the stdin pipe right after start (ssh: the remote environment,
  /// which must not appear on any command line). Small: at most a pipe buffer.
  std::string stdin_data;
  bool close_stdin = false;  ///< close the pipe after stdin_data (the child reads to EOF)
  /// kSocket: Supervise makes the socket and sets PSKV_STATUS=fd:N; kOutput: the plan
  /// set PSKV_STATUS=stderr where the child runs. Tagged lines of a kSocket or kNone
  /// child's output are output, not records.
  StatusVia status = StatusVia::kNone;
  /// ssh children: the host, and a command that tests the connection alone ("ssh -o
  /// BatchMode=yes -p 22 node1 true"). A child that exits with ssh's own status 255
  /// before any of its nodes reported is reported as "ssh to HOST failed", with it.
  std::string ssh_host;
  std::string ssh_check;
};

struct ChildResult {
  std::string name;
  pid_t pid = -1;
  int status = 0;  ///< exit code, or 128 + signal
  bool signaled = false;
  bool stopped_by_us = false;
  /// A server the job went on without: it died (or was stopped after the scheduler
  /// declared it dead) and the scheduler's range table kept every key range alive.
  bool survived = false;
  /// A server (or the scheduler) that died after the job's end, when the scheduler had
  /// released every node from the final barrier: not a failure (server_loss.h).
  bool after_end = false;
  int restarts = 0;      ///< times it was started again (SuperviseOptions::restart_workers)
  double seconds = 0;    ///< wall time from start to exit
  std::string log_file;  ///< SuperviseOptions::log_dir/<name>.log, or ""
  std::deque<std::string> last_lines;
  std::string status_text;  ///< its last status record, described ("waiting for worker 1 (...)")
};

struct SuperviseOptions {
  std::chrono::milliseconds timeout{0};   ///< 0: none
  std::chrono::milliseconds grace{3000};  ///< SIGTERM -> SIGKILL delay
  size_t keep_lines = 20;                 ///< lines kept per child for failure reports
  bool quiet = false;                     ///< do not forward output (tests)
  bool timestamps = true;                 ///< "HH:MM:SS.mmm [worker 0] line" on the console
  /// Non-empty: every child's output also goes to log_dir/<name>.log ("worker 0" ->
  /// worker-0.log), each line with a full UTC timestamp; the launcher's own messages
  /// and the summary to log_dir/launcher.log. Created if missing.
  std::string log_dir;
  bool summary = true;  ///< print the end-of-job summary (every process, status, wall time)
  /// Elastic workers (PSKV_ELASTIC): a worker's death waits for the scheduler's verdict
  /// (dropped: the job goes on) instead of ending the job (launcher/server_loss.h).
  bool elastic_workers = false;
  /// Elastic workers: a worker child the scheduler dropped is started again (its spec
  /// unchanged), at most this many times in all.
  int restart_workers = 0;
  /// Standby scheduler: the children named "scheduler" and "standby scheduler" may each
  /// die while the other runs (the standby takes over). Set: after a takeover, or a
  /// standby's death (3 times at most), the spec of a fresh standby that follows
  /// `active` (the job's scheduler), the `number`th standby of the job; it is started
  /// so a later death is survived too.
  std::function<ChildSpec(const ChildSpec& active, int number)> next_standby;
};

/// The launcher's messages: "HH:MM:SS.mmm pskv-launch: <msg>" on stderr (and in
/// launcher.log when Supervise runs with a log_dir). One write per message. Through
/// the common log levels as module "launcher" (PSKV_LOG_LEVEL=launcher=warn hides
/// the summary of a successful job; failures are errors).
void Say(const std::string& msg, bool timestamp = true, LogLevel level = LogLevel::kInfo);

/// Runs all children to completion. Returns the launcher's exit status: 0 if
/// every child exited 0, else the first failure's status (124 on timeout,
/// 128+signal when the launcher itself was interrupted). Prints which child failed,
/// its status and its last lines; when the others were waiting for a process still
/// running, the headline names it ("worker 1 (pid N) appears hung: scheduler was
/// waiting for it"), from the children's status records (launcher/status_board.h),
/// never from their output text. `results` receives every child's outcome.
int Supervise(const std::vector<ChildSpec>& specs, const SuperviseOptions& opts,
              std::vector<ChildResult>* results = nullptr);

}  // namespace pskv::launcher
