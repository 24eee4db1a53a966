#include "common/status_record.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <map>

#include "pskv/error.h"

namespace pskv {

namespace {

constexpr std::string_view kAnyTag = "@pskv-status/";

const char* const kPhases[] = {"registering", "running", "waiting", "failed", "finished"};

bool Plain(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == ',' || c == '/' || c == '+' || c == '-';
}

void Escape(std::string_view s, size_t limit, std::string& out) {
  static const char kHex[] = "0123456789ABCDEF";
  for (unsigned char c : s.substr(0, limit)) {
    if (Plain(c)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::optional<std::string> Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      if (!Plain(static_cast<unsigned char>(s[i]))) return std::nullopt;
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    const int hi = HexDigit(s[i + 1]), lo = HexDigit(s[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

std::optional<int64_t> Number(std::string_view s, int64_t lo, int64_t hi) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

bool ValidRole(std::string_view r) {
  return r == "scheduler" || r == "server" || r == "worker";
}

constexpr int64_t kMaxRank = int64_t{1} << 20;
// A detection bound past a day is no bound (and would overflow a deadline).
constexpr int64_t kMaxDetectMs = int64_t{24} * 3600 * 1000;

std::optional<std::vector<NodeRef>> Refs(std::string_view s) {
  std::vector<NodeRef> out;
  while (!s.empty()) {
    const size_t comma = s.find(',');
    const std::string_view item = s.substr(0, comma);
    const size_t dot = item.find('.');
    if (dot == std::string_view::npos || !ValidRole(item.substr(0, dot))) return std::nullopt;
    auto rank = Number(item.substr(dot + 1), 0, kMaxRank);
    if (!rank || out.size() >= kMaxRefs) return std::nullopt;
    out.push_back({std::string(item.substr(0, dot)), static_cast<int>(*rank)});
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
    if (s.empty()) return std::nullopt;  // a trailing comma
  }
  return out;
}

}  // namespace

const char* StatusPhaseName(StatusPhase p) {
  return kPhases[static_cast<int>(p)];
}

std::string EncodeStatus(const StatusRecord& r) {
  std::string out(kStatusTag);
  auto field = [&](const char* key, std::string_view value, size_t limit = kMaxMessageBytes) {
    out += key;
    out += '=';
    Escape(value, limit, out);
    out += ' ';
  };
  field("role", r.role, 16);
  field("rank", std::to_string(r.rank));
  if (!r.host.empty()) field("host", r.host, 64);
  if (r.pid > 0) field("pid", std::to_string(r.pid));
  field("phase", StatusPhaseName(r.phase));
  if (!r.wait.empty()) field("wait", r.wait, 128);
  // A list of node references, at most kMaxRefs (never cut); returns how many it left out.
  auto refs_field = [&](const char* key, const std::vector<NodeRef>& nodes) {
    std::string refs;
    size_t n = 0;
    for (auto& m : nodes) {
      if (n == kMaxRefs || !ValidRole(m.role)) continue;
      refs += (n++ ? "," : "") + m.role + "." + std::to_string(m.rank);
    }
    if (n) field(key, refs, refs.size());
    return static_cast<int64_t>(nodes.size() - n);
  };
  if (!r.missing.empty() || r.more > 0) {
    const int64_t more = r.more + refs_field("missing", r.missing);
    if (more > 0) field("more", std::to_string(more));
  }
  if (r.waited_ms > 0) field("waited_ms", std::to_string(r.waited_ms));
  if (!r.kind.empty()) field("kind", r.kind, 64);
  if (!r.message.empty()) field("msg", r.message);
  if (r.replicas > 0) field("replicas", std::to_string(r.replicas));
  if (r.detect_ms > 0) field("detect_ms", std::to_string(r.detect_ms));
  if (!r.departed.empty()) refs_field("departed", r.departed);
  if (!r.joined.empty()) refs_field("joined", r.joined);
  out.pop_back();  // the last space
  return out;
}

bool LooksLikeStatus(std::string_view line) {
  return line.substr(0, kAnyTag.size()) == kAnyTag;
}

std::optional<StatusRecord> DecodeStatus(std::string_view line) {
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  if (line.size() > kMaxRecordBytes || line.substr(0, kStatusTag.size()) != kStatusTag)
    return std::nullopt;
  line.remove_prefix(kStatusTag.size());
  std::map<std::string_view, std::string_view> fields;
  while (!line.empty()) {
    const size_t sp = line.find(' ');
    const std::string_view kv = line.substr(0, sp);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) return std::nullopt;
    if (!fields.emplace(kv.substr(0, eq), kv.substr(eq + 1)).second) return std::nullopt;
    if (sp == std::string_view::npos) break;
    line.remove_prefix(sp + 1);
  }
  StatusRecord r;
  auto text = [&](std::string_view key, std::string& to) {
    auto it = fields.find(key);
    if (it == fields.end()) return true;
    auto v = Unescape(it->second);
    if (!v) return false;
    to = std::move(*v);
    return true;
  };
  auto number = [&](std::string_view key, int64_t lo, int64_t hi, int64_t& to) {
    auto it = fields.find(key);
    if (it == fields.end()) return true;
    auto v = Number(it->second, lo, hi);
    if (!v) return false;
    to = *v;
    return true;
  };
  std::string phase;
  int64_t rank = -2;
  if (!text("role", r.role) || !ValidRole(r.role)) return std::nullopt;
  if (!number("rank", -1, kMaxRank, rank) || rank == -2) return std::nullopt;
  r.rank = static_cast<int>(rank);
  if (!text("phase", phase)) return std::nullopt;
  bool known = false;
  for (int i = 0; i < 5; ++i)
    if (phase == kPhases[i]) {
      r.phase = static_cast<StatusPhase>(i);
      known = true;
    }
  if (!known) return std::nullopt;
  if (!text("host", r.host) || !text("wait", r.wait) || !text("kind", r.kind) ||
      !text("msg", r.message))
    return std::nullopt;
  if (!number("pid", 0, INT64_MAX, r.pid) || !number("more", 0, INT64_MAX, r.more) ||
      !number("waited_ms", 0, INT64_MAX, r.waited_ms) ||
      !number("replicas", 0, kMaxRank, r.replicas) ||
      !number("detect_ms", 0, kMaxDetectMs, r.detect_ms))
    return std::nullopt;
  for (auto [key, to] : {std::pair{"missing", &r.missing}, std::pair{"departed", &r.departed},
                         std::pair{"joined", &r.joined}})
    if (auto it = fields.find(key); it != fields.end()) {
      auto refs = Refs(it->second);
      if (!refs) return std::nullopt;
      *to = std::move(*refs);
    }
  return r;
}

void StatusChannel::Validate(const std::string& spec) {
  if (spec.empty() || spec == "stderr") return;
  if (spec.rfind("fd:", 0) == 0 && Number(spec.substr(3), 3, 1 << 20)) return;
  throw ConfigError("PSKV_STATUS='" + spec +
                    "': expected fd:N (a socket from the launcher, N >= 3) or stderr");
}

StatusChannel StatusChannel::Open(const std::string& spec, std::string* why) {
  StatusChannel c;
  if (spec.empty()) return c;
  if (spec == "stderr") {
    c.fd_ = 2;
    return c;
  }
  auto n = spec.rfind("fd:", 0) == 0 ? Number(spec.substr(3), 3, 1 << 20) : std::nullopt;
  if (!n) {
    if (why) *why = "PSKV_STATUS='" + spec + "' is not fd:N or stderr";
    return c;
  }
  const int fd = static_cast<int>(*n);
  struct stat st {};
  int type = 0;
  socklen_t len = sizeof type;
  sockaddr_storage addr{};
  socklen_t alen = sizeof addr;
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) ||
      ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
      (type != SOCK_SEQPACKET && type != SOCK_DGRAM) ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0 ||
      addr.ss_family != AF_UNIX) {
    if (why) *why = "PSKV_STATUS=" + spec + " is not a status socket from a launcher; no status";
    return c;
  }
  c.fd_ = fd;
  c.packet_ = true;
  return c;
}

bool StatusChannel::Write(const StatusRecord& r) const {
  if (fd_ < 0) return false;
  std::string line = EncodeStatus(r);
  if (packet_) return ::send(fd_, line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL) > 0;
  line += '\n';  // one write: whole among other writers' lines (at most PIPE_BUF)
  ssize_t n;
  do n = ::write(fd_, line.data(), line.size());
  while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(line.size());
}

}  // namespace pskv
