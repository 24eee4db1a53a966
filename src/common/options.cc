// Options from the environment: the table of variables (common/env_table.h) does the
// reading; this file adds the rules that span several variables.
#include "pskv/options.h"

#include <string>

#include "common/env_table.h"

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

Options Options::FromEnv() {
  Options o;
  // Each variable of the table (common/env_table.cc) in turn.
  for (const EnvVar& var : EnvVars())
    if (var.apply)
      if (const char* v = EnvValue(var.name)) var.apply(var, v, o);
  // Rules across variables, or beyond a range.
  if (!o.job_secret.empty() && o.job_secret.size() < kMinSecretLength)
    throw ConfigError(
        "the job secret (PSKV_JOB_SECRET or PSKV_JOB_SECRET_FILE) has " +
        std::to_string(o.job_secret.size()) + " characters; it needs at least " +
        std::to_string(kMinSecretLength) +
        " (credentials on the wire can be attacked offline with guesses of a short secret). "
        "pskv-launch generates one for every job; to choose your own, use random bytes, e.g. "
        "`python3 -c 'import secrets; print(secrets.token_hex(32))'`");
  if (o.shm_ring_bytes & (o.shm_ring_bytes - 1))
    throw ConfigError("PSKV_SHM_RING_BYTES=" + std::to_string(o.shm_ring_bytes) +
                      " must be a power of two");
  if (o.handshake_timeout.count() <= 0)
    throw ConfigError(
        "PSKV_HANDSHAKE_TIMEOUT must be > 0: without it, connections that never "
        "authenticate would be kept forever");
  return o;
}

std::string WorkerLayoutSettings(const Options& o) {
  return "PSKV_WIRE_CHUNK_BYTES=" + std::to_string(o.wire_chunk_bytes) + " PSKV_LINK_RATE=" +
         (o.link_rate > 0   ? "on"
          : o.link_rate < 0 ? "learned"
                            : "off") +
         " PSKV_SERVER_WEIGHTS=" + o.server_weights;
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
  if (!server_weights.empty() && !IsServerWeightsKeyword(server_weights)) {
    const size_t given = ParseServerWeights(server_weights).size();
    if (given != static_cast<size_t>(num_servers))
      throw ConfigError("PSKV_SERVER_WEIGHTS='" + server_weights + "' gives " +
                        std::to_string(given) + " weights for " + std::to_string(num_servers) +
                        " servers (DMLC_NUM_SERVER): give one per server rank");
  }
  if (heartbeat_timeout.count() > 0 && heartbeat_timeout < 2 * heartbeat_interval)
    throw ConfigError("PS_HEARTBEAT_TIMEOUT must be at least twice PS_HEARTBEAT_INTERVAL");
  // A copy of a range lives on another server than its primary: R copies need R + 1
  // servers. Asked for more, the job would run with fewer copies than the user counts
  // on (with one server: none at all), so it does not start.
  if (replicas > 0 && replicas > num_servers - 1)
    throw ConfigError(
        "PSKV_REPLICAS=" + std::to_string(replicas) + " needs at least " +
        std::to_string(replicas + 1) + " servers (DMLC_NUM_SERVER=" + std::to_string(num_servers) +
        "): each key range is copied to that many servers besides its primary; " +
        (num_servers < 2 ? std::string("with one server nothing can be replicated: start 2 or "
                                       "more servers, or set PSKV_REPLICAS=0")
                         : "set PSKV_REPLICAS to at most " + std::to_string(num_servers - 1) +
                               ", or start more servers"));
  if (spare_servers > 0 && (replicas < 1 || num_servers < 2))
    throw ConfigError("PSKV_SPARE_SERVERS=" + std::to_string(spare_servers) +
                      " needs PSKV_REPLICAS >= 1 and DMLC_NUM_SERVER >= 2: spares replace "
                      "the replicas of a dead server's key ranges");
  if (standby && (role != Role::kScheduler || standby_scheduler.empty()))
    throw ConfigError(
        "PSKV_STANDBY=1 is for a scheduler process (DMLC_ROLE=scheduler) that binds at "
        "PSKV_SCHEDULER_STANDBY=host:port: set both");
  if (!standby_scheduler.empty() && heartbeat_timeout.count() <= 0)
    throw ConfigError(
        "PSKV_SCHEDULER_STANDBY needs failure detection (PS_HEARTBEAT_TIMEOUT > 0): the "
        "standby takes over when it finds the scheduler dead");
  if (!standby_scheduler.empty()) {
    const auto colon = standby_scheduler.rfind(':');
    const std::string port = colon == std::string::npos ? "" : standby_scheduler.substr(colon + 1);
    if (colon == 0 || port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
        std::stoi(port) > 65535)
      throw ConfigError("PSKV_SCHEDULER_STANDBY='" + standby_scheduler +
                        "' is not host:port (the standby scheduler's address, e.g. 10.0.0.2:9001)");
  }
  if (spare && (role != Role::kServer || spare_servers < 1))
    throw ConfigError(
        "PSKV_SPARE_SERVER=1 is for a server process (DMLC_ROLE=server) of a job with "
        "PSKV_SPARE_SERVERS >= 1");
  if (elastic && min_workers > num_workers)
    throw ConfigError("PSKV_MIN_WORKERS=" + std::to_string(min_workers) +
                      " is more than the job's workers (DMLC_NUM_WORKER=" +
                      std::to_string(num_workers) + "): lower it, or start more workers");
}

}  // namespace pskv
