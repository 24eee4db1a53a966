// Supervise (launcher/process.h): one loop that reaps children, reads their output and
// status records, and stops the whole job on the first failure, a timeout or a signal
// (a server's death in a job that survives it is not a failure: launcher/server_loss.h);
// then the end-of-job summary.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "launcher/child.h"
#include "launcher/server_loss.h"

namespace pskv::launcher {

namespace {

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  unsigned char c = static_cast<unsigned char>(sig);
  ssize_t r = ::write(g_signal_pipe[1], &c, 1);
  (void)r;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.2f s" : "%.1f s", s);
  return buf;
}

void Close(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;

  Supervisor(const std::vector<ChildSpec>& specs, const SuperviseOptions& opts)
      : opts_(opts), kids_(specs.size()), board_(Names(specs)), start_(Clock::now()) {
    for (size_t i = 0; i < specs.size(); ++i) {
      kids_[i].index = i;
      kids_[i].spec = specs[i];
      kids_[i].result.name = specs[i].name;
      kids_[i].scheduling = specs[i].name == "scheduler"           ? Child::Scheduling::kActive
                            : specs[i].name == "standby scheduler" ? Child::Scheduling::kStandby
                                                                   : Child::Scheduling::kNone;
    }
    losses_.set_elastic_workers(opts.elastic_workers);
    restarts_left_ = opts.restart_workers;
  }

  int Run(std::vector<ChildResult>* results);

 private:
  static std::vector<std::string> Names(const std::vector<ChildSpec>& specs) {
    std::vector<std::string> names;
    for (auto& s : specs) names.push_back(s.name);
    return names;
  }
  void StartAll();
  /// Starts child `k` (its log file first); false if it cannot (then the job fails,
  /// unless `optional`: a warning).
  bool Start(Child& k, bool optional = false);
  /// After a takeover: starts a fresh standby that follows the new scheduler
  /// (SuperviseOptions::next_standby). Outside Reap: it adds a child.
  void StartFreshStandby();
  /// The job's scheduler exited 0 (the job ended): a standby that has not seen the
  /// end (a fresh one still registering) is stopped after a grace period.
  void StopIdleStandbys();
  void Reap();
  void Poll();
  void StopAll(int sig);
  std::vector<bool> Alive() const;
  /// Acts on the scheduler's verdicts on dead servers (launcher/server_loss.h) and
  /// stops the children it declared dead; says when a spare server joined.
  void FollowVerdicts();
  /// Reads the records waiting from the scheduler (its last ones before a decision).
  void PumpScheduler();
  /// Names the spares the scheduler lists as joined since the last call.
  void SayJoined();
  /// The headline's "X (pid N) appears hung: Y was waiting for it", from the status
  /// records (launcher/status_board.h); "" when no running process is waited for.
  std::string HungHeadline(const Child* who) const;
  void BeginFailure(int status, const std::string& why, const Child* who);
  /// `k` (dead: `how`) is the scheduler or its standby and the other still runs: the
  /// job goes on (the standby takes over, and a fresh standby follows it). False
  /// otherwise.
  bool SchedulerReplaced(Child& k, const std::string& how);
  /// Worker child `k`, dropped by the scheduler, is started again (--restart-workers).
  void Restart(Child& k);
  std::string Summary() const;

  const SuperviseOptions& opts_;
  std::vector<Child> kids_;
  StatusBoard board_;
  ServerLosses losses_;
  const Clock::time_point start_;
  int status_ = 0;
  bool failing_ = false;
  std::vector<std::string> joined_;  // spare servers that joined key ranges, as said
  int restarts_left_ = 0;            // --restart-workers
  Clock::time_point kill_at_{};
  std::optional<size_t> standby_due_;  // the scheduler a fresh standby is to follow
  int standbys_ = 1;                   // standby schedulers started so far
  static constexpr int kMaxStandbyReplacements = 3;
  int standby_replacements_ = 0;          // fresh standbys started after a standby's death
  Clock::time_point stop_standbys_at_{};  // StopIdleStandbys: set when the scheduler ended
};

void Supervisor::StopAll(int sig) {
  for (auto& k : kids_)
    if (!k.exited && k.pid > 0) {
      ::kill(-k.pid, sig);
      k.result.stopped_by_us = true;
    }
}

std::vector<bool> Supervisor::Alive() const {
  std::vector<bool> alive;
  for (auto& k : kids_) alive.push_back(!k.exited && k.pid > 0);
  return alive;
}

void Supervisor::FollowVerdicts() {
  if (failing_) return;
  const auto alive = Alive();
  for (auto& v : losses_.Decide(board_, alive, Clock::now())) {
    Child& k = kids_[v.child];
    if (v.survived) {
      (v.after_end ? k.result.after_end : k.result.survived) = true;
      Say(v.message, opts_.timestamps, LogLevel::kWarn);
      if (!v.after_end && restarts_left_ > 0 && ServerLosses::IsWorker(v.child, board_) && k.exited)
        Restart(k);
    } else {
      BeginFailure(v.status, v.message, &k);
      return;
    }
  }
  for (size_t c : losses_.Departed(board_, alive)) {
    Child& k = kids_[c];
    if (k.result.stopped_by_us) continue;
    // A restarted worker, until the scheduler admitted it, has the rank the departed
    // list still names.
    if (k.result.restarts > 0 && board_.Scheduler() &&
        board_.Scheduler()->second->departed == k.departed_at_restart)
      continue;
    Say(k.spec.name + " (pid " + std::to_string(k.pid) +
            ") was declared dead by the scheduler, which goes on without it: stopping it",
        opts_.timestamps, LogLevel::kWarn);
    ::kill(-k.pid, SIGKILL);
    k.result.stopped_by_us = true;
    k.result.survived = true;
  }
  SayJoined();
}

void Supervisor::PumpScheduler() {
  const auto sched = board_.Scheduler();
  if (sched && kids_[sched->first].status_fd >= 0) PumpStatus(kids_[sched->first], board_);
}

void Supervisor::SayJoined() {
  const auto sched = board_.Scheduler();
  if (!sched) return;
  const auto& joined = sched->second->joined;
  for (size_t i = joined_.size(); i < joined.size(); ++i) {
    const NodeRef& n = joined[i];
    std::string name = n.role + "." + std::to_string(n.rank);
    for (auto& k : kids_) {
      const auto nodes = board_.NodesOf(k.index);
      if (std::find(nodes.begin(), nodes.end(), n) != nodes.end())
        name = k.spec.name + " (pid " + std::to_string(k.pid) + ")";
    }
    Say(name +
            ", a spare server, joined the key ranges left short of a copy: it is their "
            "replica now (the job is back to full strength)",
        opts_.timestamps, LogLevel::kWarn);
    joined_.push_back(name);
  }
}

std::string Supervisor::HungHeadline(const Child* who) const {
  auto b = board_.Hung(Alive(), who ? std::optional<size_t>(who->index) : std::nullopt);
  if (!b) return {};
  const Child& h = kids_[b->hung];
  const std::string pid = "pid " + std::to_string(h.pid);
  return (b->node == h.spec.name ? b->node + " (" + pid
                                 : b->node + " (in " + h.spec.name + ", " + pid) +
         ") appears hung: " + b->by + " was waiting for it";
}

void Supervisor::BeginFailure(int status, const std::string& why, const Child* who) {
  if (failing_) return;
  failing_ = true;
  status_ = status;
  const std::string h = HungHeadline(who);
  std::string msg = (h.empty() ? why : h + "; " + why) + "; stopping the job";
  // Its output was forwarded line by line already (a traceback is printed once):
  // point at it instead of repeating it, unless nothing was shown.
  if (who && !who->result.last_lines.empty()) {
    if (opts_.quiet) {
      msg += "\nlast lines of " + who->spec.name + ":";
      for (auto& l : who->result.last_lines) msg += "\n    " + l;
    } else {
      msg += "\nits output is above, prefixed [" + who->spec.name + "]";
    }
    if (!who->result.log_file.empty()) msg += "; full log: " + who->result.log_file;
  }
  Say(msg, opts_.timestamps, LogLevel::kError);
  StopAll(SIGTERM);
  kill_at_ = Clock::now() + opts_.grace;
}

bool Supervisor::SchedulerReplaced(Child& k, const std::string& how) {
  using S = Child::Scheduling;
  if (k.scheduling == S::kNone) return false;
  const bool sched = k.scheduling == S::kActive;
  for (auto& other : kids_) {
    if (&other == &k || other.exited || other.pid <= 0 ||
        other.scheduling != (sched ? S::kStandby : S::kActive))
      continue;
    k.result.survived = true;
    k.scheduling = S::kNone;
    if (sched) {
      other.scheduling = S::kActive;
      board_.Rename(k.index, "scheduler (dead)");
      board_.Rename(other.index, "scheduler");
      if (opts_.next_standby) standby_due_ = other.index;
      Say(how + "; the standby scheduler takes over and the job goes on" +
              (opts_.next_standby ? " (" + other.spec.name +
                                        " is the job's scheduler now; a "
                                        "fresh standby is started to follow it)"
                                  : std::string()),
          opts_.timestamps, LogLevel::kWarn);
    } else {
      // A standby that keeps dying (cut off from the scheduler, say) is not replaced
      // forever: kMaxStandbyReplacements at most.
      const bool fresh = opts_.next_standby && standby_replacements_ < kMaxStandbyReplacements;
      if (fresh) {
        ++standby_replacements_;
        standby_due_ = other.index;
      }
      Say(how + "; the job goes on without a standby scheduler" +
              (fresh ? " until a fresh one, started now, follows the scheduler" : ""),
          opts_.timestamps, LogLevel::kWarn);
    }
    return true;
  }
  return false;
}

void Supervisor::Restart(Child& k) {
  --restarts_left_;
  // What the previous process left unread, then its pipes; its records go (the new
  // process reports afresh: until it is admitted, its rank is the departed one).
  PumpOutput(k, opts_, board_);
  if (k.status_fd >= 0) PumpStatus(k, board_);
  Close(k.out_fd);
  Close(k.status_fd);
  Close(k.in_fd);
  board_.Forget(k.index);
  const auto sched = board_.Scheduler();
  k.departed_at_restart = sched ? sched->second->departed : std::vector<NodeRef>{};
  k.partial.clear();
  k.exited = false;
  k.start_time = Clock::now();
  k.pid = Spawn(k);
  k.result.pid = k.pid;
  k.result.stopped_by_us = false;
  k.result.signaled = false;
  ++k.result.restarts;
  if (k.pid < 0) {
    k.exited = true;
    BeginFailure(1, "cannot restart " + k.spec.name + ": " + std::strerror(errno), nullptr);
    return;
  }
  Say(k.spec.name + " started again (pid " + std::to_string(k.pid) +
          ", --restart-workers: " + std::to_string(restarts_left_) +
          " restart(s) left): it joins the running job in place of the worker that left, at "
          "the workers' next epoch barrier",
      opts_.timestamps, LogLevel::kWarn);
}

bool Supervisor::Start(Child& k, bool optional) {
  if (!opts_.log_dir.empty()) {
    k.result.log_file = opts_.log_dir + "/" + LogFileName(k.spec.name);
    k.log_fd = ::open(k.result.log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  k.start_time = Clock::now();
  k.pid = Spawn(k);
  k.result.pid = k.pid;
  if (k.pid < 0) {
    k.exited = true;
    const std::string why = "cannot start " + k.spec.name + ": " + std::strerror(errno);
    if (optional)
      Say(why, opts_.timestamps, LogLevel::kWarn);
    else
      BeginFailure(1, why, nullptr);
    return false;
  }
  return true;
}

void Supervisor::StartAll() {
  for (auto& k : kids_)
    if (!Start(k)) break;
}

void Supervisor::StartFreshStandby() {
  if (!standby_due_) return;
  const size_t active = *standby_due_;
  standby_due_.reset();
  if (failing_ || kids_[active].exited || kids_[active].scheduling != Child::Scheduling::kActive)
    return;
  Child c;
  try {
    c.spec = opts_.next_standby(kids_[active].spec, ++standbys_);
  } catch (const std::exception& e) {
    Say(std::string("cannot make a fresh standby scheduler: ") + e.what() +
            "; the job goes on without a standby",
        opts_.timestamps, LogLevel::kWarn);
    return;
  }
  c.index = board_.AddChild(c.spec.name);
  c.result.name = c.spec.name;
  c.scheduling = Child::Scheduling::kStandby;
  kids_.push_back(std::move(c));
  Child& k = kids_.back();
  if (!Start(k, /*optional=*/true)) return;
  Say(k.spec.name + " (pid " + std::to_string(k.pid) + ") started: it follows " +
          kids_[active].spec.name + ", the job's scheduler, as its standby",
      opts_.timestamps, LogLevel::kWarn);
}

void Supervisor::StopIdleStandbys() {
  if (stop_standbys_at_ == Clock::time_point{} || Clock::now() < stop_standbys_at_) return;
  stop_standbys_at_ = {};
  for (auto& k : kids_)
    if (k.scheduling == Child::Scheduling::kStandby && !k.exited && k.pid > 0) {
      Say(k.spec.name + " (pid " + std::to_string(k.pid) +
              ") still runs after the job's scheduler ended the job: stopping it",
          opts_.timestamps, LogLevel::kInfo);
      ::kill(-k.pid, SIGTERM);
      k.result.stopped_by_us = true;
    }
}

void Supervisor::Reap() {
  for (;;) {
    int st;
    pid_t p = ::waitpid(-1, &st, WNOHANG);
    if (p <= 0) return;
    for (auto& k : kids_) {
      if (k.pid != p) continue;
      k.exited = true;
      k.exit_time = Clock::now();
      k.result.seconds = std::chrono::duration<double>(k.exit_time - k.start_time).count();
      k.result.signaled = WIFSIGNALED(st);
      k.result.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      Close(k.in_fd);
      ::kill(-k.pid, SIGKILL);  // whatever it left behind in its group
      const bool failed = k.result.status != 0 && !k.result.stopped_by_us;
      // The job's end: a standby sees the final release and exits by itself; one that
      // never saw it (a fresh standby still registering) is stopped soon.
      if (k.result.status == 0 && k.scheduling == Child::Scheduling::kActive)
        stop_standbys_at_ = k.exit_time + std::chrono::seconds(3);
      if (failed || losses_.pending()) {
        // Its last words, read before anything is decided on its exit: a scheduler
        // that finished may have sent the verdict on a dead server just before.
        PumpOutput(k, opts_, board_);
        if (k.status_fd >= 0) PumpStatus(k, board_);
      }
      if (failed) {
        std::string how = k.result.signaled
                              ? "was killed by signal " + std::to_string(k.result.status - 128) +
                                    " (" + strsignal(k.result.status - 128) + ")"
                              : "exited with status " + std::to_string(k.result.status);
        how = k.spec.name + " (pid " + std::to_string(p) + ") " + how;
        // 255 is ssh's own failure (refused, no route, key not accepted); a node that
        // never reported did not start, so the connection is what failed.
        if (!k.result.signaled && k.result.status == 255 && !k.spec.ssh_check.empty() &&
            !board_.Latest(k.index))
          how += ": ssh to " + k.spec.ssh_host +
                 " failed before the process started (ssh's message is above); test the "
                 "connection with: " +
                 k.spec.ssh_check +
                 " (it must exit 0 without asking for a password; checklist: docs/ssh.md)";
        if (SchedulerReplaced(k, how)) continue;
        // After the job's end a server's death fails nothing, and the workers still
        // running their own code after close() are left to finish it.
        PumpScheduler();
        if (ServerLosses::AfterEnd(k.index, board_)) {
          k.result.after_end = true;
          Say(how +
                  " after the job had finished (the scheduler had released every node from "
                  "the final barrier): nothing needed it any more, not a failure",
              opts_.timestamps, LogLevel::kWarn);
          continue;
        }
        if (losses_.Died(k.index, how, k.result.status, board_, Alive(), k.exit_time)) {
          Say(how + (losses_.IsWorker(k.index, board_)
                         ? "; waiting for the scheduler's verdict: does the job go on without "
                           "it (PSKV_ELASTIC)?"
                         : "; waiting for the scheduler's verdict: do its key ranges have live "
                           "copies?"),
              opts_.timestamps, LogLevel::kWarn);
          FollowVerdicts();
          continue;
        }
        // The scheduler's verdict on a dead server may explain this death (the ranges
        // lost): its records were read above.
        if (losses_.pending()) FollowVerdicts();
        BeginFailure(k.result.status, how, &k);
      }
    }
  }
}

void Supervisor::Poll() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Child*, bool>> owners;  // (child, is its status socket)
  fds.push_back({g_signal_pipe[0], POLLIN, 0});
  owners.push_back({nullptr, false});
  for (auto& k : kids_) {
    if (k.out_fd >= 0) {
      fds.push_back({k.out_fd, POLLIN, 0});
      owners.push_back({&k, false});
    }
    if (k.status_fd >= 0) {
      fds.push_back({k.status_fd, POLLIN, 0});
      owners.push_back({&k, true});
    }
  }
  ::poll(fds.data(), fds.size(), 50);
  if (fds[0].revents & POLLIN) {
    unsigned char sig = 0;
    while (::read(g_signal_pipe[0], &sig, 1) == 1)
      BeginFailure(128 + sig, std::string("received ") + strsignal(sig), nullptr);
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    auto [k, status] = owners[i];
    int& fd = status ? k->status_fd : k->out_fd;
    const bool ready = fds[i].revents & (POLLIN | POLLHUP | POLLERR);
    if (ready) {
      if (!(status ? PumpStatus(*k, board_) : PumpOutput(*k, opts_, board_))) Close(fd);
    } else if (k->exited && Clock::now() - k->exit_time > std::chrono::seconds(1)) {
      // The child exited but something that left its process group still holds
      // the pipe (or the socket): stop reading it.
      if (status)
        PumpStatus(*k, board_);
      else
        PumpOutput(*k, opts_, board_);
      Close(fd);
    }
  }
}

int Supervisor::Run(std::vector<ChildResult>* results) {
  if (g_signal_pipe[0] < 0) {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int, old_term, old_hup;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  signal(SIGPIPE, SIG_IGN);

  int launcher_log = -1;
  if (!opts_.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opts_.log_dir, ec);
    const std::string path = opts_.log_dir + "/launcher.log";
    launcher_log = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (launcher_log < 0) {
      Say("cannot write " + path + ": " + std::strerror(errno) +
              " (--log-dir must name a writable directory)",
          opts_.timestamps, LogLevel::kError);
      return 2;
    }
    SetLauncherLog(launcher_log);
  }
  StartAll();
  for (;;) {
    Reap();
    bool alive = false, open = false;
    for (auto& k : kids_) {
      alive |= !k.exited && k.pid > 0;
      open |= k.out_fd >= 0 || k.status_fd >= 0;
    }
    if (!alive && !open) break;
    FollowVerdicts();
    StartFreshStandby();
    StopIdleStandbys();
    if (failing_ && alive && Clock::now() >= kill_at_) StopAll(SIGKILL);
    if (!failing_ && opts_.timeout.count() > 0 && Clock::now() - start_ > opts_.timeout)
      BeginFailure(124, "timeout of " + std::to_string(opts_.timeout.count() / 1000) + " s reached",
                   nullptr);
    Poll();
  }
  // A death still awaiting the scheduler's verdict when the last process exited is
  // decided now, on the scheduler's last records: none ends the job undecided.
  FollowVerdicts();
  for (auto& k : kids_)
    if (k.pid > 0) ::kill(-k.pid, SIGKILL);
  if (!failing_) SayJoined();  // the scheduler's last records
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  for (auto& k : kids_) k.result.status_text = board_.Describe(k.index);
  if (opts_.summary)
    Say(Summary(), opts_.timestamps, status_ == 0 ? LogLevel::kInfo : LogLevel::kError);
  for (auto& k : kids_) Close(k.log_fd);
  if (launcher_log >= 0) {
    SetLauncherLog(-1);
    ::close(launcher_log);
  }
  if (results) {
    results->clear();
    for (auto& k : kids_) results->push_back(k.result);
  }
  return status_;
}

// Every process, how it ended, its wall time; for a failed job, what each process
// that did not finish said last about itself.
std::string Supervisor::Summary() const {
  const double total = std::chrono::duration<double>(Clock::now() - start_).count();
  size_t width = 7;
  for (auto& k : kids_) width = std::max(width, k.spec.name.size());
  std::string lost;
  bool lost_servers = false, lost_workers = false, lost_schedulers = false;
  for (auto& k : kids_)
    if (k.result.survived) {
      lost += (lost.empty() ? "" : ", ") + k.spec.name;
      const bool sched = k.spec.name.find("scheduler") != std::string::npos;
      lost_schedulers |= sched;
      (ServerLosses::IsWorker(k.index, board_) ? lost_workers : lost_servers) |= !sched;
    }
  std::string spares, late;
  for (auto& j : joined_) spares += "; " + j + ", a spare, joined";
  std::string restarted;  // --restart-workers
  for (auto& k : kids_)
    if (k.result.restarts > 0)
      restarted +=
          "; " + k.spec.name + " started again" +
          (k.result.restarts > 1 ? " " + std::to_string(k.result.restarts) + " times" : "");
  for (auto& k : kids_)
    if (k.result.after_end) late += (late.empty() ? "" : ", ") + k.spec.name;
  if (!late.empty()) late = " (" + late + " died after its end, which fails nothing)";
  std::string how;
  if (lost_servers) how += "key ranges moved to replicas" + spares;
  if (lost_workers)
    how += (how.empty() ? "" : "; ") + ("workers dropped: PSKV_ELASTIC" + restarted);
  if (lost_schedulers)
    how += (how.empty() ? "" : "; ") + std::string("a standby scheduler took over");
  std::string text =
      status_ == 0
          ? "job succeeded in " + Seconds(total) +
                (!lost.empty()   ? ", surviving the loss of " + lost + " (" + how + ")" + late
                 : !late.empty() ? late
                                 : ": all " + std::to_string(kids_.size()) + " processes exited 0")
          : "job FAILED (exit status " + std::to_string(status_) + ") after " + Seconds(total);
  char row[512];
  std::snprintf(row, sizeof row, "\n  %-*s %8s  %-28s %9s", static_cast<int>(width), "process",
                "pid", "status", "wall");
  text += row;
  std::string reported;
  for (auto& k : kids_) {
    std::string how;
    const std::string survived = k.result.survived    ? " (survived)"
                                 : k.result.after_end ? " (after the end)"
                                                      : "";
    if (k.pid < 0)
      how = "not started";
    else if (!k.exited)
      how = "left running (killed)";
    else if (k.result.stopped_by_us)
      how = k.result.status == 0 ? "exited 0 (stopped)"
            : k.result.signaled
                ? std::string("stopped (") + sigabbrev_np(k.result.status - 128) + ")" + survived
                : "exited " + std::to_string(k.result.status) + " (stopped)";
    else if (k.result.signaled)
      how = std::string("killed by SIG") + sigabbrev_np(k.result.status - 128) + survived;
    else
      how = k.result.status == 0 ? "exited 0"
            : !survived.empty()  ? "exited " + std::to_string(k.result.status) + survived
                                 : "exited " + std::to_string(k.result.status) + "  <-- failed";
    std::snprintf(row, sizeof row, "\n  %-*s %8d  %-28s %9s", static_cast<int>(width),
                  k.spec.name.c_str(), static_cast<int>(k.pid), how.c_str(),
                  Seconds(k.result.seconds).c_str());
    text += row;
    const std::string& st = k.result.status_text;
    if (status_ != 0 && !st.empty() && st != "finished")
      reported += "\n  " + k.spec.name + ": " + (st.size() > 300 ? st.substr(0, 300) + "..." : st);
  }
  if (!reported.empty()) text += "\nlast status reported:" + reported;
  if (!opts_.log_dir.empty()) text += "\nlogs: " + opts_.log_dir + "/";
  return text;
}

}  // namespace

int Supervise(const std::vector<ChildSpec>& specs, const SuperviseOptions& opts,
              std::vector<ChildResult>* results) {
  Supervisor s(specs, opts);
  return s.Run(results);
}

}  // namespace pskv::launcher
