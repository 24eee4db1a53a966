// One child of the launcher: starting it and reading what it sends (its output
// lines, its status records). Internal to launcher/process.cc and supervise.cc.
//
// Output lines go to the console with the child's name, to its log file, and to the
// last lines kept for failure reports; status records go to the StatusBoard. A
// child's output is text, except the tagged lines of a StatusVia::kOutput child,
// which are records (and are neither printed nor kept as its last lines).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "launcher/process.h"
#include "launcher/status_board.h"

namespace pskv::launcher {

struct Child {
  size_t index = 0;  // in the plan, and on the StatusBoard
  ChildSpec spec;
  ChildResult result;
  pid_t pid = -1;
  int out_fd = -1;     // its stdout and stderr
  int in_fd = -1;      // its stdin (ssh)
  int status_fd = -1;  // the launcher's end of its status socket (StatusVia::kSocket)
  int log_fd = -1;     // log_dir/<name>.log
  bool exited = false;
  std::chrono::steady_clock::time_point start_time, exit_time;
  std::string partial;
  // Started again (restarted worker): the scheduler's departed list then, which still
  // names the rank it takes over until the scheduler admits it.
  std::vector<NodeRef> departed_at_restart;
  // Scheduler children: the one acting as the job's scheduler, and its standby.
  enum class Scheduling { kNone, kActive, kStandby } scheduling = Scheduling::kNone;
};

/// Starts the child in its own process group; -1 (errno set) if it cannot.
pid_t Spawn(Child& c);

/// Reads what is available on the child's output; false at EOF.
bool PumpOutput(Child& c, const SuperviseOptions& o, StatusBoard& board);
/// Reads the records waiting on its status socket; false at EOF or on error.
bool PumpStatus(Child& c, StatusBoard& board);

/// "HH:MM:SS.mmm" (local time, console) or "YYYY-MM-DDTHH:MM:SS.mmmZ" (UTC, log files).
std::string Now(bool full);
/// "worker 0" -> "worker-0.log".
std::string LogFileName(const std::string& name);
void WriteAll(int fd, const std::string& s);
/// Where Say also writes its messages (launcher.log; -1: nowhere).
void SetLauncherLog(int fd);

}  // namespace pskv::launcher
