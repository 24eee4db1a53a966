// The one place where pskv reads environment variables.
#include "pskv/options.h"

#include "common/logging.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "pskv/error.h"

namespace pskv {

std::string RoleName(Role r) {
  switch (r) {
    case Role::kWorker:
      return "worker";
    case Role::kServer:
      return "server";
    case Role::kScheduler:
      return "scheduler";
  }
  return "?";
}

namespace {

const char* Get(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int64_t ParseInt(const char* name, const char* v, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
    throw ConfigError(std::string("environment variable ") + name + "='" + v +
                      "' is not a whole number in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
  }
  return x;
}

double ParseDouble(const char* name, const char* v, double lo, double hi) {
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !(x >= lo && x <= hi)) {
    throw ConfigError(std::string("environment variable ") + name + "='" + v +
                      "' is not a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "]");
  }
  return x;
}

template <typename T>
void ReadInt(const char* name, T* out, int64_t lo, int64_t hi) {
  if (const char* v = Get(name)) *out = static_cast<T>(ParseInt(name, v, lo, hi));
}

// Seconds given as a decimal number (so tests can use 0.5) into milliseconds.
void ReadSeconds(const char* name, std::chrono::milliseconds* out) {
  if (const char* v = Get(name))
    *out = std::chrono::milliseconds(static_cast<int64_t>(ParseDouble(name, v, 0, 1e7) * 1000));
}

// The secret file: a private file (like ssh's keys); trailing newlines ignored.
std::string ReadSecretFile(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0)
    throw ConfigError(std::string("PSKV_JOB_SECRET_FILE='") + path +
                      "' cannot be read: " + std::strerror(errno));
  if (st.st_mode & 077)
    throw ConfigError(std::string("PSKV_JOB_SECRET_FILE='") + path +
                      "' is readable or writable by other users; make it private with "
                      "`chmod 600 " +
                      path + "`");
  if (st.st_size > 4096)
    throw ConfigError(std::string("PSKV_JOB_SECRET_FILE='") + path +
                      "' is larger than 4096 bytes: is it the right file?");
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (!f || s.empty())
    throw ConfigError(std::string("PSKV_JOB_SECRET_FILE='") + path + "' is empty or unreadable");
  return s;
}

}  // namespace

Options Options::FromEnv() {
  Options o;
  ReadInt("MXNET_KVSTORE_BIGARRAY_BOUND", &o.bigarray_bound, 1, INT64_MAX);
  ReadInt("MXNET_KVSTORE_REDUCTION_NTHREADS", &o.reduction_threads, 1, 1024);
  ReadInt("PSKV_SERVER_THREADS", &o.server_threads, 0, 256);
  ReadInt("PSKV_FUSION_KEY_BYTES", &o.fusion_key_bytes, 0, int64_t{1} << 30);
  ReadInt("PSKV_FUSION_BYTES", &o.fusion_bytes, 1, int64_t{1} << 30);
  ReadInt("PSKV_INLINE_START_BYTES", &o.inline_start_bytes, 0, int64_t{1} << 30);
  ReadInt("PSKV_SPIN_US", &o.spin_us, 0, 10000);
  ReadInt("PSKV_WIRE_CHUNK_BYTES", &o.wire_chunk_bytes, 0, int64_t{1} << 40);
  ReadInt("PSKV_WIRE_WINDOW_BYTES", &o.wire_window_bytes, 0, int64_t{1} << 40);

  if (const char* v = Get("DMLC_ROLE")) {
    std::string r = v;
    if (r == "worker")
      o.role = Role::kWorker;
    else if (r == "server")
      o.role = Role::kServer;
    else if (r == "scheduler")
      o.role = Role::kScheduler;
    else
      throw ConfigError("environment variable DMLC_ROLE='" + r +
                        "' is not one of: scheduler, server, worker");
    o.role_set = true;
  }
  if (const char* v = Get("DMLC_PS_ROOT_URI")) o.root_uri = v;
  ReadInt("DMLC_PS_ROOT_PORT", &o.root_port, 1, 65535);
  ReadInt("DMLC_NUM_SERVER", &o.num_servers, 0, 65536);
  ReadInt("DMLC_NUM_WORKER", &o.num_workers, 0, 65536);
  if (const char* v = Get("DMLC_INTERFACE")) o.interface = v;
  if (const char* v = Get("DMLC_NODE_HOST")) o.node_host = v;
  ReadInt("PORT", &o.port, 0, 65535);
  ReadInt("DMLC_TASK_ID", &o.rank_hint, 0, INT64_MAX);
  ReadInt("PS_VERBOSE", &o.verbose, 0, 3);
  if (const char* v = Get("PS_RESEND")) o.resend = ParseInt("PS_RESEND", v, 0, 1) != 0;
  if (const char* v = Get("PS_RESEND_TIMEOUT"))
    o.resend_timeout = std::chrono::milliseconds(ParseInt("PS_RESEND_TIMEOUT", v, 1, 3600000));
  ReadSeconds("PS_HEARTBEAT_INTERVAL", &o.heartbeat_interval);
  ReadSeconds("PS_HEARTBEAT_TIMEOUT", &o.heartbeat_timeout);
  ReadSeconds("PSKV_REGISTER_TIMEOUT", &o.register_timeout);
  ReadSeconds("PSKV_TIMEOUT", &o.op_timeout);
  if (const char* v = Get("PSKV_JOB_ID")) o.job_id = v;
  if (const char* v = Get("PSKV_JOB_SECRET")) o.job_secret = v;
  if (const char* path = Get("PSKV_JOB_SECRET_FILE")) {
    if (!o.job_secret.empty())
      throw ConfigError("both PSKV_JOB_SECRET and PSKV_JOB_SECRET_FILE are set: set only one");
    o.job_secret = ReadSecretFile(path);
  }
  if (!o.job_secret.empty() && o.job_secret.size() < kMinSecretLength)
    throw ConfigError(
        "the job secret (PSKV_JOB_SECRET or PSKV_JOB_SECRET_FILE) has " +
        std::to_string(o.job_secret.size()) + " characters; it needs at least " +
        std::to_string(kMinSecretLength) +
        " (credentials on the wire can be attacked offline with guesses of a short secret). "
        "pskv-launch generates one for every job; to choose your own, use random bytes, e.g. "
        "`python3 -c 'import secrets; print(secrets.token_hex(32))'`");
  if (const char* v = Get("PSKV_ENCRYPT")) o.encrypt = ParseInt("PSKV_ENCRYPT", v, 0, 1) != 0;
  if (const char* v = Get("PSKV_SHM")) {
    o.shm = v;
    if (o.shm != "0" && o.shm != "1" && o.shm != "auto")
      throw ConfigError("environment variable PSKV_SHM='" + o.shm +
                        "' is not one of: 0 (TCP only), 1 (always offer), auto");
  }
  ReadInt("PSKV_SHM_RING_BYTES", &o.shm_ring_bytes, 4096, int64_t{1} << 30);
  if (o.shm_ring_bytes & (o.shm_ring_bytes - 1))
    throw ConfigError("PSKV_SHM_RING_BYTES=" + std::to_string(o.shm_ring_bytes) +
                      " must be a power of two");
  if (const char* v = Get("PSKV_TCP_DIRECT"))
    o.tcp_direct = ParseInt("PSKV_TCP_DIRECT", v, 0, 1) != 0;
  ReadInt("PSKV_MAX_CONNECTIONS", &o.max_pending_connections, 0, 1 << 20);
  ReadSeconds("PSKV_HANDSHAKE_TIMEOUT", &o.handshake_timeout);
  if (o.handshake_timeout.count() <= 0)
    throw ConfigError(
        "PSKV_HANDSHAKE_TIMEOUT must be > 0: without it, connections that never "
        "authenticate would be kept forever");
  ReadInt("PS_DROP_MSG", &o.drop_percent, 0, 100);
  ReadInt("PSKV_DROP_MSG", &o.drop_percent, 0, 100);
  if (const char* v = Get("PSKV_STRICT_ROUNDS"))
    o.strict_rounds = ParseInt("PSKV_STRICT_ROUNDS", v, 0, 1) != 0;
  ReadSeconds("PSKV_STALL_WARNING", &o.stall_warning);
  if (const char* v = Get("PSKV_SUM_ORDER")) {
    const std::string s = v;
    if (s != "rank" && s != "arrival")
      throw ConfigError("environment variable PSKV_SUM_ORDER='" + s +
                        "' is not one of: rank, arrival");
    o.sum_in_arrival_order = s == "arrival";
  }
  ReadInt("PSKV_TEST_REPLY_DELAY", &o.test_reply_delay_ms, 0, 3600000);
  if (const char* v = Get("PSKV_TEST_DUPLICATE_REPLIES"))
    o.test_duplicate_replies = ParseInt("PSKV_TEST_DUPLICATE_REPLIES", v, 0, 1) != 0;
  if (const char* v = Get("PSKV_TEST_BOGUS_CREDITS"))
    o.test_bogus_credits = ParseInt("PSKV_TEST_BOGUS_CREDITS", v, 0, 1) != 0;
  if (const char* v = Get("PSKV_TIMELINE")) o.timeline_path = v;
  ReadInt("PSKV_METRICS_PORT", &o.metrics_port, 0, 65535);
  if (const char* v = Get("PSKV_METRICS_HOST")) o.metrics_host = v;
  if (const char* v = Get("PSKV_METRICS_FILE")) o.metrics_file = v;
  if (const char* v = Get("PSKV_LOG_LEVEL")) {
    o.log_levels = v;
    CheckLogLevels(v);  // ConfigError naming the variable; applied where the node starts
  }
  return o;
}

void Options::ValidateForDistributed() const {
  if (root_uri.empty())
    throw ConfigError(
        "DMLC_PS_ROOT_URI is not set: a distributed store needs the scheduler's address "
        "(start the job with pskv-launch, or set DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, "
        "DMLC_NUM_SERVER, DMLC_NUM_WORKER and DMLC_ROLE)");
  if (root_port <= 0)
    throw ConfigError("DMLC_PS_ROOT_PORT is not set: the scheduler's port is needed");
  if (num_servers <= 0)
    throw ConfigError(
        "DMLC_NUM_SERVER is not set or 0: a distributed job needs at least one server");
  if (num_workers <= 0)
    throw ConfigError(
        "DMLC_NUM_WORKER is not set or 0: a distributed job needs at least one worker");
  if (heartbeat_timeout.count() > 0 && heartbeat_interval.count() <= 0)
    throw ConfigError("PS_HEARTBEAT_INTERVAL must be > 0 when PS_HEARTBEAT_TIMEOUT is set");
  if (encrypt && job_secret.empty())
    throw ConfigError(
        "PSKV_ENCRYPT=1 needs a job secret: set PSKV_JOB_SECRET or PSKV_JOB_SECRET_FILE "
        "(pskv-launch sets one for every job)");
  if (heartbeat_timeout.count() > 0 && heartbeat_timeout < 2 * heartbeat_interval)
    throw ConfigError("PS_HEARTBEAT_TIMEOUT must be at least twice PS_HEARTBEAT_INTERVAL");
}

}  // namespace pskv
