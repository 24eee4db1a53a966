#include "launcher/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>
#include <sys/time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <regex>
#include <sstream>

namespace pskv::launcher {

namespace {

int g_signal_pipe[2] = {-1, -1};
int g_launcher_log = -1;  // launcher.log while Supervise runs with a log_dir

// "HH:MM:SS.mmm" (local time, console) or "YYYY-MM-DDTHH:MM:SS.mmmZ" (UTC, log files).
std::string Now(bool full) {
  timeval tv{};
  ::gettimeofday(&tv, nullptr);
  std::tm tm{};
  if (full)
    ::gmtime_r(&tv.tv_sec, &tm);
  else
    ::localtime_r(&tv.tv_sec, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, full ? "%Y-%m-%dT%H:%M:%S" : "%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, full ? ".%03dZ" : ".%03d",
                static_cast<int>(tv.tv_usec / 1000));
  return buf;
}

void OnSignal(int sig) {
  unsigned char c = static_cast<unsigned char>(sig);
  ssize_t r = ::write(g_signal_pipe[1], &c, 1);
  (void)r;
}

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

struct Child {
  ChildSpec spec;
  ChildResult result;
  pid_t pid = -1;
  int out_fd = -1;
  int in_fd = -1;
  int log_fd = -1;  // log_dir/<name>.log
  bool exited = false;
  std::chrono::steady_clock::time_point start_time, exit_time;
  std::string partial;
};

// The library starts its lines with its own process tag ("[scheduler] INFO: ...",
// "[server[0]] ...", "[pskv] ..."); after the launcher's "[server 0] " that is said
// twice. It is dropped for a child that is one process of the same role (a group
// such as mpi's "workers" keeps it: there it tells the ranks apart).
std::string WithoutOwnTag(const std::string& child, const std::string& line) {
  if (line.empty() || line[0] != '[') return line;
  const auto close = line.find("] ");
  if (close == std::string::npos || close > 32) return line;
  const std::string tag = line.substr(1, close - 1);
  const std::string role = child.substr(0, child.find(' '));
  if (role != "scheduler" && role != "server" && role != "worker") return line;
  const bool same =
      tag == "pskv" || tag == role || (tag.rfind(role + "[", 0) == 0 && tag.back() == ']');
  return same ? line.substr(close + 2) : line;
}

pid_t Spawn(Child& c) {
  int out[2], in[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0) return -1;
  if (c.spec.stdin_pipe && ::pipe2(in, O_CLOEXEC) != 0) return -1;
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(128 + SIGKILL);  // the launcher died meanwhile
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    if (c.spec.stdin_pipe) {
      ::dup2(in[0], 0);
    } else {
      int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, 0);
    }
    for (auto& [k, v] : c.spec.env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (auto& a : c.spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::string msg =
        "pskv-launch: cannot run '" + c.spec.argv[0] + "': " + std::strerror(errno) + "\n";
    WriteAll(2, msg);
    _exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out[1]);
  c.out_fd = out[0];
  ::fcntl(c.out_fd, F_SETFL, O_NONBLOCK);
  if (c.spec.stdin_pipe) {
    ::close(in[0]);
    c.in_fd = in[1];
    if (!c.spec.stdin_data.empty()) WriteAll(c.in_fd, c.spec.stdin_data);
    if (c.spec.close_stdin) {
      ::close(c.in_fd);
      c.in_fd = -1;
    }
  }
  return pid;
}

void EmitLine(Child& c, const std::string& raw, const SuperviseOptions& o) {
  const std::string line = WithoutOwnTag(c.spec.name, raw);
  c.result.last_lines.push_back(line);
  while (c.result.last_lines.size() > o.keep_lines) c.result.last_lines.pop_front();
  if (!o.quiet)
    WriteAll(1, (o.timestamps ? Now(false) + " [" : "[") + c.spec.name + "] " + line + "\n");
  if (c.log_fd >= 0) WriteAll(c.log_fd, Now(true) + " " + line + "\n");
}

std::string LogFileName(const std::string& name) {
  std::string f = name;
  for (char& ch : f)
    if (ch == ' ' || ch == '/') ch = '-';
  return f + ".log";
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.2f s" : "%.1f s", s);
  return buf;
}

// Reads what is available; returns false on EOF.
bool Pump(Child& c, const SuperviseOptions& o) {
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(c.out_fd, buf, sizeof buf);
    if (n > 0) {
      c.partial.append(buf, static_cast<size_t>(n));
      size_t pos;
      while ((pos = c.partial.find('\n')) != std::string::npos) {
        std::string line = c.partial.substr(0, pos);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        EmitLine(c, line, o);
        c.partial.erase(0, pos + 1);
      }
      if (c.partial.size() > 65536) {
        EmitLine(c, c.partial, o);
        c.partial.clear();
      }
      continue;
    }
    if (n == 0) {
      if (!c.partial.empty()) EmitLine(c, c.partial, o);
      c.partial.clear();
      return false;
    }
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

// The node a child's last lines blame, as the child name the plans use
// ("worker 1"); "" if none. Lines name nodes as "worker[1]": in "waiting for A,
// B", "cannot reach A" or "A ... is dead". A node named in more of the lines
// (missing from every stalled barrier) is blamed before one named in fewer.
std::string Blamed(const std::deque<std::string>& lines) {
  static const std::regex kContext(R"(waiting for|cannot reach|is dead)");
  static const std::regex kNode(R"((worker|server)\[(\d+)\])");
  std::map<std::string, int> count;
  std::vector<std::string> order;
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (!std::regex_search(*it, kContext)) continue;
    for (std::sregex_iterator m(it->begin(), it->end(), kNode), end; m != end; ++m) {
      std::string name = (*m)[1].str() + " " + (*m)[2].str();
      if (count[name]++ == 0) order.push_back(name);
    }
  }
  std::string best;
  for (auto& n : order)
    if (best.empty() || count[n] > count[best]) best = n;
  return best;
}

}  // namespace

void Say(const std::string& msg, bool timestamp, LogLevel level) {
  if (!LogEnabled(__FILE__, level)) return;
  std::string text;
  std::istringstream lines(msg);
  for (std::string l; std::getline(lines, l);)
    text += (timestamp ? Now(false) + " " : std::string()) + "pskv-launch: " + l + "\n";
  WriteAll(2, text);
  if (g_launcher_log >= 0) {
    std::string file;
    std::istringstream again(msg);
    for (std::string l; std::getline(again, l);) file += Now(true) + " " + l + "\n";
    WriteAll(g_launcher_log, file);
  }
}

int Supervise(const std::vector<ChildSpec>& specs, const SuperviseOptions& opts,
              std::vector<ChildResult>* results) {
  using Clock = std::chrono::steady_clock;
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

  std::vector<Child> kids(specs.size());
  int status = 0;
  bool failing = false;
  Clock::time_point kill_at{};
  const auto start = Clock::now();

  auto stop_all = [&](int sig) {
    for (auto& k : kids)
      if (!k.exited && k.pid > 0) {
        ::kill(-k.pid, sig);
        k.result.stopped_by_us = true;
      }
  };
  // A process that is still running while another reports waiting for it (or
  // not reaching it) is the one that hung: the headline names it first.
  auto hung = [&](const Child* who) -> std::string {
    std::vector<const Child*> witnesses;
    if (who) {
      witnesses.push_back(who);
    } else {
      for (auto& k : kids) witnesses.push_back(&k);
    }
    for (const Child* w : witnesses) {
      const std::string name = Blamed(w->result.last_lines);
      if (name.empty()) continue;
      for (auto& k : kids)
        if (k.spec.name == name && !k.exited && &k != w)
          return name + " (pid " + std::to_string(k.pid) + ") appears hung: " + w->spec.name +
                 " was waiting for it";
    }
    return {};
  };
  auto begin_failure = [&](int st, const std::string& why, const Child* who) {
    if (failing) return;
    failing = true;
    status = st;
    const std::string h = hung(who);
    std::string msg = (h.empty() ? why : h + "; " + why) + "; stopping the job";
    // Its output was forwarded line by line already (a traceback is printed once):
    // point at it instead of repeating it, unless nothing was shown.
    if (who && !who->result.last_lines.empty()) {
      if (opts.quiet) {
        msg += "\nlast lines of " + who->spec.name + ":";
        for (auto& l : who->result.last_lines) msg += "\n    " + l;
      } else {
        msg += "\nits output is above, prefixed [" + who->spec.name + "]";
      }
      if (!who->result.log_file.empty()) msg += "; full log: " + who->result.log_file;
    }
    Say(msg, opts.timestamps, LogLevel::kError);
    stop_all(SIGTERM);
    kill_at = Clock::now() + opts.grace;
  };

  if (!opts.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opts.log_dir, ec);
    const std::string path = opts.log_dir + "/launcher.log";
    g_launcher_log = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (g_launcher_log < 0) {
      Say("cannot write " + path + ": " + std::strerror(errno) +
              " (--log-dir must name a writable directory)",
          opts.timestamps, LogLevel::kError);
      return 2;
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    kids[i].spec = specs[i];
    kids[i].result.name = specs[i].name;
    if (!opts.log_dir.empty()) {
      kids[i].result.log_file = opts.log_dir + "/" + LogFileName(specs[i].name);
      kids[i].log_fd =
          ::open(kids[i].result.log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    kids[i].start_time = Clock::now();
    kids[i].pid = Spawn(kids[i]);
    kids[i].result.pid = kids[i].pid;
    if (kids[i].pid < 0) {
      kids[i].exited = true;
      begin_failure(1, "cannot start " + specs[i].name + ": " + std::strerror(errno), nullptr);
      break;
    }
  }

  for (;;) {
    // Reap.
    for (;;) {
      int st;
      pid_t p = ::waitpid(-1, &st, WNOHANG);
      if (p <= 0) break;
      for (auto& k : kids) {
        if (k.pid != p) continue;
        k.exited = true;
        k.exit_time = Clock::now();
        k.result.seconds = std::chrono::duration<double>(k.exit_time - k.start_time).count();
        k.result.signaled = WIFSIGNALED(st);
        k.result.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (k.in_fd >= 0) {
          ::close(k.in_fd);
          k.in_fd = -1;
        }
        ::kill(-k.pid, SIGKILL);  // whatever it left behind in its group
        if (k.result.status != 0 && !k.result.stopped_by_us) {
          Pump(k, opts);
          std::string how = k.result.signaled
                                ? "was killed by signal " + std::to_string(k.result.status - 128) +
                                      " (" + strsignal(k.result.status - 128) + ")"
                                : "exited with status " + std::to_string(k.result.status);
          begin_failure(k.result.status, k.spec.name + " (pid " + std::to_string(p) + ") " + how,
                        &k);
        }
      }
    }
    bool alive = false, open = false;
    for (auto& k : kids) {
      alive |= !k.exited && k.pid > 0;
      open |= k.out_fd >= 0;
    }
    if (!alive && !open) break;
    if (failing && alive && Clock::now() >= kill_at) stop_all(SIGKILL);
    if (!failing && opts.timeout.count() > 0 && Clock::now() - start > opts.timeout)
      begin_failure(124, "timeout of " + std::to_string(opts.timeout.count() / 1000) + " s reached",
                    nullptr);

    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    fds.push_back({g_signal_pipe[0], POLLIN, 0});
    owners.push_back(nullptr);
    for (auto& k : kids)
      if (k.out_fd >= 0) {
        fds.push_back({k.out_fd, POLLIN, 0});
        owners.push_back(&k);
      }
    ::poll(fds.data(), fds.size(), 50);
    if (fds[0].revents & POLLIN) {
      unsigned char sig = 0;
      while (::read(g_signal_pipe[0], &sig, 1) == 1) {
        begin_failure(128 + sig, std::string("received ") + strsignal(sig), nullptr);
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      Child& k = *owners[i];
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (!Pump(k, opts)) {
          ::close(k.out_fd);
          k.out_fd = -1;
        }
      } else if (k.exited && Clock::now() - k.exit_time > std::chrono::seconds(1)) {
        // The child exited but something that left its process group still holds
        // the pipe: stop reading it.
        Pump(k, opts);
        ::close(k.out_fd);
        k.out_fd = -1;
      }
    }
  }
  for (auto& k : kids)
    if (k.pid > 0) ::kill(-k.pid, SIGKILL);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);

  // The end-of-job summary: every process, how it ended, its wall time.
  if (opts.summary) {
    const double total = std::chrono::duration<double>(Clock::now() - start).count();
    size_t width = 7;
    for (auto& k : kids) width = std::max(width, k.spec.name.size());
    std::string text = status == 0 ? "job succeeded in " + Seconds(total) + ": all " +
                                         std::to_string(kids.size()) + " processes exited 0"
                                   : "job FAILED (exit status " + std::to_string(status) +
                                         ") after " + Seconds(total);
    char row[512];
    std::snprintf(row, sizeof row, "\n  %-*s %8s  %-28s %9s", static_cast<int>(width), "process",
                  "pid", "status", "wall");
    text += row;
    for (auto& k : kids) {
      std::string how;
      if (k.pid < 0)
        how = "not started";
      else if (!k.exited)
        how = "left running (killed)";
      else if (k.result.stopped_by_us)
        how = k.result.status == 0 ? "exited 0 (stopped)"
              : k.result.signaled
                  ? std::string("stopped (") + sigabbrev_np(k.result.status - 128) + ")"
                  : "exited " + std::to_string(k.result.status) + " (stopped)";
      else if (k.result.signaled)
        how = std::string("killed by SIG") + sigabbrev_np(k.result.status - 128);
      else
        how = k.result.status == 0 ? "exited 0"
                                   : "exited " + std::to_string(k.result.status) + "  <-- failed";
      std::snprintf(row, sizeof row, "\n  %-*s %8d  %-28s %9s", static_cast<int>(width),
                    k.spec.name.c_str(), static_cast<int>(k.pid), how.c_str(),
                    Seconds(k.result.seconds).c_str());
      text += row;
    }
    if (!opts.log_dir.empty()) text += "\nlogs: " + opts.log_dir + "/";
    Say(text, opts.timestamps, status == 0 ? LogLevel::kInfo : LogLevel::kError);
  }
  for (auto& k : kids)
    if (k.log_fd >= 0) ::close(k.log_fd);
  if (g_launcher_log >= 0) {
    ::close(g_launcher_log);
    g_launcher_log = -1;
  }
  if (results) {
    results->clear();
    for (auto& k : kids) results->push_back(k.result);
  }
  return status;
}

}  // namespace pskv::launcher
