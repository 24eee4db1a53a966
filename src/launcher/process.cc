// The launcher's children: starting them, reading their output and status records,
// and the launcher's own messages (launcher/child.h, launcher/process.h).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <sstream>

#include "launcher/child.h"

namespace pskv::launcher {

namespace {

int g_launcher_log = -1;  // launcher.log while Supervise runs with a log_dir

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

void EmitLine(Child& c, const std::string& raw, const SuperviseOptions& o, StatusBoard& board) {
  if (c.spec.status == StatusVia::kOutput && LooksLikeStatus(raw)) {
    board.Add(c.index, raw);  // a record, not output (an invalid one is dropped)
    if (c.log_fd >= 0) WriteAll(c.log_fd, Now(true) + " " + raw + "\n");
    return;
  }
  const std::string line = WithoutOwnTag(c.spec.name, raw);
  c.result.last_lines.push_back(line);
  while (c.result.last_lines.size() > o.keep_lines) c.result.last_lines.pop_front();
  if (!o.quiet)
    WriteAll(1, (o.timestamps ? Now(false) + " [" : "[") + c.spec.name + "] " + line + "\n");
  if (c.log_fd >= 0) WriteAll(c.log_fd, Now(true) + " " + line + "\n");
}

}  // namespace

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

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::string LogFileName(const std::string& name) {
  std::string f = name;
  for (char& ch : f)
    if (ch == ' ' || ch == '/') ch = '-';
  return f + ".log";
}

void SetLauncherLog(int fd) {
  g_launcher_log = fd;
}

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

pid_t Spawn(Child& c) {
  int out[2], in[2] = {-1, -1}, st[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0) return -1;
  if (c.spec.stdin_pipe && ::pipe2(in, O_CLOEXEC) != 0) return -1;
  // A packet socket: one record per packet, so a record is never torn or mixed with
  // another, and the child's writes fail instead of blocking or raising SIGPIPE.
  if (c.spec.status == StatusVia::kSocket &&
      ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, st) != 0)
    return -1;
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
    if (st[1] >= 0) {
      ::fcntl(st[1], F_SETFD, 0);  // kept across exec: the child's end
      ::setenv("PSKV_STATUS", ("fd:" + std::to_string(st[1])).c_str(), 1);
    }
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
  if (st[1] >= 0) {
    ::close(st[1]);
    c.status_fd = st[0];
    ::fcntl(c.status_fd, F_SETFL, O_NONBLOCK);
  }
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

bool PumpOutput(Child& c, const SuperviseOptions& o, StatusBoard& board) {
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(c.out_fd, buf, sizeof buf);
    if (n > 0) {
      c.partial.append(buf, static_cast<size_t>(n));
      size_t pos;
      while ((pos = c.partial.find('\n')) != std::string::npos) {
        std::string line = c.partial.substr(0, pos);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        EmitLine(c, line, o, board);
        c.partial.erase(0, pos + 1);
      }
      if (c.partial.size() > 65536) {
        EmitLine(c, c.partial, o, board);
        c.partial.clear();
      }
      continue;
    }
    if (n == 0) {
      if (!c.partial.empty()) EmitLine(c, c.partial, o, board);
      c.partial.clear();
      return false;
    }
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

bool PumpStatus(Child& c, StatusBoard& board) {
  char buf[kMaxRecordBytes + 1];
  for (;;) {
    // MSG_TRUNC: the packet's real length, so an oversized record is seen whole
    // as too long (and ignored) instead of read as a truncated one.
    ssize_t n = ::recv(c.status_fd, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
    if (n > 0) {
      if (static_cast<size_t>(n) <= kMaxRecordBytes)
        board.Add(c.index, std::string_view(buf, static_cast<size_t>(n)));
      else
        board.Ignore();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

}  // namespace pskv::launcher
